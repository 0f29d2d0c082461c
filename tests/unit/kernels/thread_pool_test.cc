// ThreadPool: every ParallelFor covers [0, n) exactly once, in chunks of at least the grain,
// back to back (workers still spinning from the last call), after the workers fell asleep,
// and from calls of every size; run under ThreadSanitizer too (label tsan), since the pool
// hands jobs over through atomics.
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

// Runs ParallelFor over n and checks each index was visited once.
void ExpectCoveredOnce(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int64_t> short_chunks{0};
  pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
    if (e - b < grain && e != n) ++short_chunks;
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
  EXPECT_EQ(short_chunks.load(), 0) << n << " / " << grain;
}

TEST(ThreadPoolTest, BackToBackCallsCoverEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int call = 0; call < 2000; ++call) ExpectCoveredOnce(pool, 1 + call % 97, 1 + call % 5);
  }
}

TEST(ThreadPoolTest, CallsAfterTheWorkersSleptStillRun) {
  ThreadPool pool(3);
  for (int i = 0; i < 5; ++i) {
    ExpectCoveredOnce(pool, 1000, 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // past any spin: they sleep
  }
}

TEST(ThreadPoolTest, SmallOrEmptyRangesRunInline) {
  ThreadPool pool(4);
  const std::thread::id caller = std::this_thread::get_id();
  bool inline_run = false;
  pool.ParallelFor(5, 8, [&](int64_t b, int64_t e) {
    inline_run = std::this_thread::get_id() == caller && b == 0 && e == 5;
  });
  EXPECT_TRUE(inline_run);
  int calls = 0;
  pool.ParallelFor(0, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, ResultsWrittenByWorkersAreSeenByTheCaller) {
  ThreadPool pool(2);
  std::vector<int64_t> out(4096);
  for (int round = 1; round <= 200; ++round) {
    pool.ParallelFor(static_cast<int64_t>(out.size()), 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = i * round;
    });
    for (size_t i = 0; i < out.size(); i += 511) ASSERT_EQ(out[i], static_cast<int64_t>(i) * round);
  }
}

}  // namespace
}  // namespace tandem::cpu
