// core_thread_pool_test.cpp — ThreadPool: every index exactly once, chunks contiguous and at least
// min_chunk long, nested calls inline, concurrent callers, thousands of back-to-back small calls
// (the decode-step pattern), and a pool outliving many jobs / destroyed while idle.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace mm3 {
namespace {

TEST(ThreadPool, CoversEveryIndexOnceInContiguousChunks) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t(1), int64_t(2), int64_t(7), int64_t(100), int64_t(10007)}) {
      for (int64_t min_chunk : {int64_t(1), int64_t(3), int64_t(64)}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> short_chunks{0}, calls{0};
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e) {
              ASSERT_LT(b, e);
              ++calls;
              if (e - b < min_chunk && e != n) ++short_chunks;
              for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
            },
            min_chunk);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
        EXPECT_EQ(short_chunks.load(), 0) << "n=" << n << " min_chunk=" << min_chunk;
        EXPECT_LE(calls.load(), 4 * threads);
      }
    }
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(100, [&](int64_t b2, int64_t e2) { sum += (e2 - b2) * (i + 1); });
  });
  EXPECT_EQ(sum.load(), 100 * (8 * 9 / 2));
}

TEST(ThreadPool, ManySmallCallsAndConcurrentCallers) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int r = 0; r < 3000; ++r) pool.parallel_for(16, [&](int64_t b, int64_t e) { total += e - b; });
  };
  std::thread t1(caller), t2(caller);
  caller();
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 3 * 3000 * 16);
}

TEST(ThreadPool, ConstructAndDestroyRepeatedly) {
  for (int r = 0; r < 50; ++r) {
    ThreadPool pool(3);
    std::atomic<int> n{0};
    if (r % 2) pool.parallel_for(10, [&](int64_t b, int64_t e) { n += int(e - b); });
    EXPECT_EQ(n.load(), r % 2 ? 10 : 0);
  }
}

}  // namespace
}  // namespace mm3
