#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>

#include <omp.h>

extern "C" void openblas_set_num_threads(int);

namespace mm3 {

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c > 0) return c;
  }
  return std::max(1, omp_get_num_procs());
}

ThreadPool::ThreadPool(int n) : n_(n > 0 ? n : hardware_threads()) { apply_library_limits(); }

void ThreadPool::apply_library_limits() const {
  omp_set_num_threads(n_);
  openblas_set_num_threads(n_);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t min_chunk) const {
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>(n_, (n + std::max<int64_t>(1, min_chunk) - 1) /
                                             std::max<int64_t>(1, min_chunk));
  if (chunks <= 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    if (b < e) fn(b, e);
  }
}

}  // namespace mm3
