// aligned.cpp — alloc_storage / free_storage (aligned.h): the one allocation rule for large buffers.
#include "core/aligned.h"

#include <sys/mman.h>

#include <cstdlib>

namespace mm3 {

// Measured for issue 8 (README, performance history): a 1 GiB buffer took 3.3 s to fault in with
// 4 KiB pages on this kind of VM and 0.1-2 s with THP; a 4.9 GB weight stream summed at 37 GB/s from
// 4 KiB pages and 64 GB/s from huge ones. madvise is advice: without THP nothing changes.
void* alloc_storage(std::size_t bytes) noexcept {
  constexpr std::size_t kHuge = std::size_t(2) << 20, kHugeFrom = std::size_t(4) << 20;
  const std::size_t align = bytes >= kHugeFrom ? kHuge : kCacheLine;
  std::size_t n = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple of the alignment
  if (n == 0) n = kCacheLine;
  void* p = std::aligned_alloc(align, n);
  if (p && align == kHuge) ::madvise(p, n, MADV_HUGEPAGE);
  return p;
}

void free_storage(void* p) noexcept { std::free(p); }

}  // namespace mm3
