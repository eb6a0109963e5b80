// aligned.h — std::vector storage that starts on a cache line (64 bytes).
//
// The decode GEMVs load their activation vectors 64 bytes at a time beside the streamed weights. A
// plain std::vector's buffer is only 16-byte aligned (glibc malloc), so every such load then spans two
// cache lines: the q4 GEMV streamed a [12288, 4096] weight at 32.6 GB/s from a buffer 16 bytes off
// a line and 43.5 GB/s from one on a line (Zen 5, 2 threads, same kernel, alternated in one process),
// and the q4 AR frame took 287 ms with the library's activation buffer 16 bytes off a line, 222 ms on
// one (15 runs each, interleaved in one process).
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

namespace mm3 {

inline constexpr std::size_t kCacheLine = 64;

// Raw storage (aligned.cpp), uninitialized, null when out of memory: on a cache line, and from 4 MiB up on
// a 2 MiB boundary with transparent huge pages advised (Tensor storage follows the same rule). On this
// kind of VM a 4 KiB page costs ~3 us to fault in, and 4 KiB pages slow a weight stream (core/tensor.cpp).
void* alloc_storage(std::size_t bytes) noexcept;
void free_storage(void* p) noexcept;

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  constexpr CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    void* p = alloc_storage(n * sizeof(T));
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { free_storage(p); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

// A std::vector whose data() is 64-byte aligned (whatever its size), from alloc_storage (so a large one is on
// huge pages: the DiT's per-call activation buffers are).
template <class T>
using aligned_vector = std::vector<T, CacheLineAllocator<T>>;

// Uninitialized scratch or packed weights of trivial T (a std::vector would zero them first), from
// alloc_storage. The int8 DiT's packed weights (2.4 GB) live in these.
template <class T>
struct CacheLineDelete {
  void operator()(T* p) const noexcept { free_storage(p); }
};
template <class T>
using aligned_buffer = std::unique_ptr<T[], CacheLineDelete<T>>;
template <class T>
aligned_buffer<T> make_aligned_buffer(std::size_t n) {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>);
  void* p = alloc_storage(n * sizeof(T));
  if (!p) throw std::bad_alloc();
  return aligned_buffer<T>(static_cast<T*>(p));
}

}  // namespace mm3
