// base/worker_pool.h: the threads' lifetime and cancellation, ParallelFor's errors.
#include "base/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cancel.h"

namespace conveyor {
namespace {

TEST(WorkerPoolTest, EveryWorkerRunsOnceAndJoinWaitsForAll) {
  std::atomic<int> ran{0};
  absl::Mutex mu;
  std::set<int> seen;
  WorkerPool pool("test", 4, [&](int worker) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    absl::MutexLock lock(&mu);
    seen.insert(worker);
    ran.fetch_add(1);
  });
  EXPECT_EQ(pool.size(), 4);
  pool.Join();
  EXPECT_EQ(ran.load(), 4);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 3}));
}

TEST(WorkerPoolTest, CancelReachesTheWorkersScopeAndTheDestructorJoins) {
  std::atomic<int> saw_cancel{0};
  {
    WorkerPool pool("test", 2, [&](int) {
      while (!CancelRequested()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      saw_cancel.fetch_add(1);
    });
    EXPECT_FALSE(pool.cancelled());
    // Leaving the scope cancels and joins: without the flag these loops never end.
  }
  EXPECT_EQ(saw_cancel.load(), 2);
}

TEST(ParallelForTest, RunsEveryIndexOnce) {
  std::vector<std::atomic<int>> hits(100);
  ASSERT_TRUE(ParallelFor("test", 3, hits.size(), [&](size_t i) {
    hits[i].fetch_add(1);
    return absl::OkStatus();
  }).ok());
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ParallelForTest, ReturnsTheLowestFailedIndexAndStopsStartingNewOnes) {
  std::atomic<size_t> started{0};
  absl::Status s = ParallelFor("test", 2, 1000, [&](size_t i) {
    started.fetch_add(1);
    if (i == 7 || i == 9) return absl::DataLossError(absl::StrCat("index ", i));
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "index 7");
  EXPECT_LT(started.load(), 1000u);  // the failure stopped the loop early
  // One thread: the same error, as a sequential loop would give.
  s = ParallelFor("test", 1, 1000, [&](size_t i) {
    return i >= 7 ? absl::DataLossError(absl::StrCat("index ", i)) : absl::OkStatus();
  });
  EXPECT_EQ(s.message(), "index 7");
}

TEST(ParallelForTest, TasksRunUnderTheCallersCancellation) {
  std::atomic<bool> flag{false};
  CancelScope scope(&flag);
  std::atomic<int> saw{0};
  ASSERT_TRUE(ParallelFor("test", 2, 2, [&](size_t) {
    if (!CancelRequested()) saw.fetch_add(1);
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(saw.load(), 2);
  flag = true;
  absl::Status s = ParallelFor("test", 2, 4, [&](size_t) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace conveyor
