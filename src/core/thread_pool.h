// thread_pool.h — the one explicit thread pool (ARCHITECTURE.md habit 9). It is passed to every
// kernel that parallelises; nothing in mm3 reads a global thread count.
//
// The workers are OpenMP's (oneDNN in Debian is an OpenMP build, so sharing one runtime is what keeps
// the two from oversubscribing the cores). OpenBLAS (pthread build) has its own workers; the pool sets
// its count to the same number and BLAS is never called from inside parallel_for, so at most
// `size()` threads compute at any time.
#pragma once

#include <cstdint>
#include <functional>

namespace mm3 {

class ThreadPool {
 public:
  // n <= 0: use every core the process may run on.
  explicit ThreadPool(int n = 0);
  int size() const { return n_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n); blocks until all are done. Chunks are
  // contiguous and their number is at most size(). Runs inline when n is small or size() == 1.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t min_chunk = 1) const;

  // Sets OpenBLAS's and OpenMP's own thread counts to size(). Called by the constructor.
  void apply_library_limits() const;

 private:
  int n_;
};

int hardware_threads();

}  // namespace mm3
