// thread_pool.h — the one explicit thread pool (ARCHITECTURE.md habit 9). It is passed to every
// kernel that parallelises; nothing in mm3 reads a global thread count.
//
// Our own workers (std::thread), not OpenMP's: libgomp's workers spin at every barrier, and on a
// machine with other work running (a shared 2-core box; a server doing I/O) a spinning or
// descheduled worker stalls each of the thousands of small parallel calls an AR frame makes.
// Measured with load ~5 on 2 cores, depth_frame: OpenMP static 2.29 s, one thread 0.75 s, this pool
// (dynamic chunks, brief spin then sleep) — see the commit / issue note for the figure. Workers take
// chunks from a shared counter, so a preempted worker's share is done by the others.
// OpenBLAS (pthread build) and oneDNN (OpenMP) have their own workers; the pool sets their counts to
// size() and they are never called from inside parallel_for.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace mm3 {

class ThreadPool {
 public:
  // n <= 0: use every core the process may run on. Starts n - 1 workers (the caller is the n-th).
  explicit ThreadPool(int n = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const { return n_; }

  // Calls fn(begin, end) over disjoint contiguous chunks covering [0, n) (at least min_chunk long
  // where n allows); blocks until all are done. Up to 4 chunks per worker, taken dynamically, so
  // which thread runs a chunk is not fixed: fn must not depend on it (kernels compute each output in
  // a fixed order inside one chunk, so results never depend on the thread count or the chunking).
  // Runs inline when n is small, size() == 1, or when called from inside a chunk (nesting).
  // Thread-safe: concurrent callers are served one at a time.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t min_chunk = 1) const;

  // Sets OpenBLAS's and OpenMP's own thread counts to size(). Called by the constructor.
  void apply_library_limits() const;

 private:
  struct Impl;
  int n_;
  std::unique_ptr<Impl> impl_;
};

int hardware_threads();

}  // namespace mm3
