// The CPU worker pool: every task runs exactly once, worker ids index per-worker scratch safely,
// and callers on several threads (or nested inside a task) all complete.
#include "core/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace flashattn::detail {
namespace {

// Runs parallel_for and checks every task ran once and each worker id was in [0, threads).
void expect_exactly_once(int64_t num_tasks, int threads) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(num_tasks));
  std::atomic<int> bad_worker{0};
  parallel_for(num_tasks, threads, [&](int64_t task, int worker) {
    if (worker < 0 || worker >= std::max(threads, 1)) bad_worker.fetch_add(1);
    runs[static_cast<size_t>(task)].fetch_add(1);
  });
  EXPECT_EQ(bad_worker.load(), 0) << "num_tasks=" << num_tasks << " threads=" << threads;
  for (int64_t t = 0; t < num_tasks; ++t)
    ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1) << "task " << t << " num_tasks=" << num_tasks << " threads=" << threads;
}

TEST(ThreadPool, EveryTaskExactlyOnce) {
  for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 4097})
    for (int threads : {0, 1, 2, 3, 8, 64}) expect_exactly_once(n, threads);
}

TEST(ThreadPool, ResolveThreads) {
  const int hw = hardware_threads();
  EXPECT_GE(hw, 1);
  EXPECT_EQ(resolve_threads(0), hw);
  EXPECT_EQ(resolve_threads(1), 1);
  EXPECT_EQ(resolve_threads(hw), hw);
  EXPECT_EQ(resolve_threads(hw + 5), hw);
}

// Two tasks never run on the same worker id at the same time (per-worker scratch is not shared).
TEST(ThreadPool, WorkerIdsAreExclusive) {
  const int threads = std::max(2, hardware_threads());
  auto busy = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(threads));
  for (int w = 0; w < threads; ++w) busy[w] = 0;
  std::atomic<int> clashes{0}, sum{0};
  parallel_for(2000, threads, [&](int64_t task, int worker) {
    if (busy[worker].exchange(1) != 0) clashes.fetch_add(1);
    volatile int64_t spin = 0;
    for (int i = 0; i < 2000; ++i) spin = spin + i;
    sum.fetch_add(static_cast<int>(task % 7));
    busy[worker].store(0);
  });
  EXPECT_EQ(clashes.load(), 0);
  int want = 0;
  for (int t = 0; t < 2000; ++t) want += t % 7;
  EXPECT_EQ(sum.load(), want);
}

// A task that calls parallel_for itself (the pool is busy) still gets all of its tasks run.
TEST(ThreadPool, NestedCallsComplete) {
  const int threads = std::max(2, hardware_threads());
  std::vector<std::atomic<int>> runs(16 * 33);
  parallel_for(16, threads, [&](int64_t outer, int) {
    parallel_for(33, threads, [&](int64_t inner, int worker) {
      EXPECT_GE(worker, 0);
      EXPECT_LT(worker, threads);
      runs[static_cast<size_t>(outer * 33 + inner)].fetch_add(1);
    });
  });
  for (size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << "task " << i;
}

// Callers on separate std::threads race for the pool; every call completes with every task run once.
TEST(ThreadPool, ConcurrentCallersComplete) {
  constexpr int kCallers = 4, kRounds = 50, kTasks = 97;
  std::vector<std::vector<int>> counts(kCallers, std::vector<int>(kRounds * kTasks, 0));
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        std::vector<std::atomic<int>> runs(kTasks);
        parallel_for(kTasks, 1 + (c + r) % 4, [&](int64_t t, int) { runs[static_cast<size_t>(t)].fetch_add(1); });
        for (int t = 0; t < kTasks; ++t) counts[c][r * kTasks + t] = runs[t].load();
      }
    });
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c)
    for (int i = 0; i < kRounds * kTasks; ++i) ASSERT_EQ(counts[c][i], 1) << "caller " << c << " index " << i;
}

}  // namespace
}  // namespace flashattn::detail
