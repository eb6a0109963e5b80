#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <immintrin.h>
#include <omp.h>

extern "C" void openblas_set_num_threads(int);

namespace mm3 {

namespace {

thread_local bool t_in_chunk = false;  // nested parallel_for runs inline

// One parallel_for call. Shared with the workers so that a worker waking late still holds a valid
// (exhausted) job rather than a reused one.
struct Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0, chunks = 0;
  std::atomic<int64_t> next{0}, done{0};

  // Runs chunks until none are left; returns after the last one this thread took.
  void work() {
    t_in_chunk = true;
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
      if (b < e) (*fn)(b, e);
      done.fetch_add(1, std::memory_order_acq_rel);
    }
    t_in_chunk = false;
  }
};

// Spin this many pause iterations (~ tens of microseconds) before sleeping: back-to-back small calls
// (a decode step) then never pay a futex wake-up, while an idle or oversubscribed pool sleeps.
constexpr int kSpin = 20000;

}  // namespace

struct ThreadPool::Impl {
  std::mutex call_mu;  // one parallel_for at a time
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<Job> job;
  uint64_t generation = 0;
  std::atomic<uint64_t> gen_seen{0};
  bool stop = false;
  std::vector<std::thread> workers;

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> j;
      // Spin briefly for the next job, then sleep on the condition variable.
      for (int i = 0; i < kSpin && gen_seen.load(std::memory_order_acquire) == seen; ++i) _mm_pause();
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        j = job;
      }
      if (j) j->work();
    }
  }
};

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c > 0) return c;
  }
  return std::max(1, omp_get_num_procs());
}

ThreadPool::ThreadPool(int n) : n_(n > 0 ? n : hardware_threads()), impl_(std::make_unique<Impl>()) {
  apply_library_limits();
  for (int i = 1; i < n_; ++i) impl_->workers.emplace_back([this] { impl_->worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

void ThreadPool::apply_library_limits() const {
  omp_set_num_threads(n_);
  openblas_set_num_threads(n_);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t min_chunk) const {
  if (n <= 0) return;
  const int64_t mc = std::max<int64_t>(1, min_chunk);
  constexpr int64_t kChunksPerThread = 4;
  const int64_t chunks = std::min<int64_t>(int64_t(n_) * kChunksPerThread, std::max<int64_t>(1, n / mc));
  if (chunks <= 1 || n_ <= 1 || t_in_chunk) {
    fn(0, n);
    return;
  }
  Impl& m = *impl_;
  std::lock_guard<std::mutex> call(m.call_mu);
  auto j = std::make_shared<Job>();
  j->fn = &fn;
  j->n = n;
  j->chunks = chunks;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.job = j;
    ++m.generation;
    m.gen_seen.store(m.generation, std::memory_order_release);
  }
  m.cv.notify_all();
  j->work();
  // The others finish their last chunks: spin (they are short), yielding so a preempted worker runs.
  for (int i = 0; j->done.load(std::memory_order_acquire) < chunks; ++i) {
    if (i < kSpin)
      _mm_pause();
    else
      std::this_thread::yield();
  }
  std::lock_guard<std::mutex> lk(m.mu);
  m.job.reset();  // fn's lifetime ends with this call; late workers only ever see an exhausted job
}

}  // namespace mm3
