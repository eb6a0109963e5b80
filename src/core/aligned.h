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

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  constexpr CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kCacheLine))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(kCacheLine)); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

// A std::vector whose data() is 64-byte aligned (whatever its size).
template <class T>
using aligned_vector = std::vector<T, CacheLineAllocator<T>>;

// Uninitialized scratch of trivial T on a cache line (a std::vector would zero it first).
template <class T>
struct CacheLineDelete {
  void operator()(T* p) const noexcept { ::operator delete[](p, std::align_val_t(kCacheLine)); }
};
template <class T>
using aligned_buffer = std::unique_ptr<T[], CacheLineDelete<T>>;
template <class T>
aligned_buffer<T> make_aligned_buffer(std::size_t n) {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>);
  return aligned_buffer<T>(new (std::align_val_t(kCacheLine)) T[n]);
}

}  // namespace mm3
