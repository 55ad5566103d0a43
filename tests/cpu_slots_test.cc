// base/cpu_slots.h: the bound, the order waiters get slots in, lending a slot over a wait, and
// the CPU count from a cgroup quota.
#include "base/cpu_slots.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/worker_pool.h"

namespace conveyor {
namespace {

// Spins until pred() or about 10 s (a hung test fails instead of hanging).
template <typename Pred>
bool WaitFor(Pred pred) {
  for (int i = 0; i < 10000 && !pred(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return pred();
}

TEST(CpuSlotsTest, NeverMoreHoldersThanSlotsAndEverySlotIsUsed) {
  CpuSlots slots(3);
  std::atomic<int> holding{0}, most{0}, together{0};
  WorkerPool pool("test", 12, [&](int) {
    for (int i = 0; i < 200; ++i) {
      CpuSlotHold hold(&slots);
      const int now = holding.fetch_add(1) + 1;
      int m = most.load();
      while (now > m && !most.compare_exchange_weak(m, now)) {
      }
      // The first three holders wait for each other once: all three slots at once, for sure.
      if (i == 0 && together.fetch_add(1) < 3) WaitFor([&] { return together.load() >= 3; });
      holding.fetch_sub(1);
    }
  });
  pool.Join();
  EXPECT_EQ(most.load(), 3);
  const CpuSlots::Stats s = slots.stats();
  EXPECT_EQ(s.acquires, 12u * 200u);
  EXPECT_EQ(s.in_use, 0);
  EXPECT_EQ(s.in_use_peak, 3);
}

TEST(CpuSlotsTest, WaitersGetSlotsInTheOrderTheyAsked) {
  CpuSlots slots(1);
  slots.Acquire();  // every worker below has to wait
  absl::Mutex mu;
  std::vector<int> order;
  WorkerPool pool("test", 5, [&](int worker) {
    // Worker i asks once workers 0..i-1 are queued (the waits counter says so).
    WaitFor([&] { return slots.stats().waits == static_cast<uint64_t>(worker); });
    CpuSlotHold hold(&slots);
    absl::MutexLock lock(&mu);
    order.push_back(worker);
  });
  ASSERT_TRUE(WaitFor([&] { return slots.stats().waits == 5; }));
  slots.Release();
  pool.Join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(CpuSlotsTest, AReleaseScopeLendsTheSlotAndTakesOneBack) {
  CpuSlots slots(1);
  std::atomic<bool> lent{false}, other_done{false};
  WorkerPool pool("test", 2, [&](int worker) {
    if (worker == 0) {
      CpuSlotHold hold(&slots);
      {
        ScopedSlotRelease wait;  // e.g. a remote read
        lent.store(true);
        EXPECT_TRUE(WaitFor([&] { return other_done.load(); })) << "the slot was not lent";
      }
      EXPECT_EQ(slots.stats().in_use, 1) << "the slot was not taken back";
    } else {
      WaitFor([&] { return lent.load(); });
      CpuSlotHold hold(&slots);  // only possible because worker 0 lent its slot
      other_done.store(true);
    }
  });
  pool.Join();
  EXPECT_EQ(slots.stats().in_use, 0);
  EXPECT_EQ(slots.stats().acquires, 3u);  // worker 0, worker 1, worker 0 again
}

// The deadlock the overdraft prevents: a thread lends its slot for a remote read while holding a
// lock (a value built once under a mutex, as LeRobot's video index is), and the thread that took
// the slot then waits for that lock. Coming back, the first thread must not queue for a slot.
TEST(CpuSlotsTest, AThreadComingBackFromALentWaitNeverQueues) {
  CpuSlots slots(1);
  absl::Mutex built_once;
  std::atomic<bool> lent{false}, other_waits{false};
  WorkerPool pool("test", 2, [&](int worker) {
    if (worker == 0) {
      CpuSlotHold hold(&slots);
      absl::MutexLock lock(&built_once);
      {
        ScopedSlotRelease read;  // the remote read
        lent.store(true);
        WaitFor([&] { return other_waits.load(); });
        // Let worker 1 reach the mutex with the slot in hand.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      // Back with a slot (overdrawn) while worker 1 holds the only one and waits for the lock.
      EXPECT_EQ(slots.stats().overdrafts, 1u);
    } else {
      WaitFor([&] { return lent.load(); });
      CpuSlotHold hold(&slots);
      other_waits.store(true);
      absl::MutexLock lock(&built_once);  // released once worker 0 is back and done
    }
  });
  pool.Join();
  const CpuSlots::Stats s = slots.stats();
  EXPECT_EQ(s.in_use, 0);
  EXPECT_EQ(s.in_use_peak, 2) << "the overdraft";
  // Paid back: the next hold takes the one slot, and a second waits.
  CpuSlotHold again(&slots);
  EXPECT_EQ(slots.stats().in_use, 1);
}

TEST(CpuSlotsTest, NestedHoldsTakeOneSlotAndNullTakesNone) {
  CpuSlots slots(1);
  {
    CpuSlotHold outer(&slots);
    CpuSlotHold inner(&slots);  // would deadlock if it took a second slot
    EXPECT_EQ(slots.stats().in_use, 1);
  }
  EXPECT_EQ(slots.stats().acquires, 1u);
  {
    CpuSlotHold none(nullptr);
    ScopedSlotRelease nothing_held;
  }
  EXPECT_EQ(slots.stats().in_use, 0);
  EXPECT_EQ(CpuSlots(0).slots(), 1) << "at least one slot";
}

TEST(CpuSlotsTest, QuotasRoundUpToWholeCpus) {
  EXPECT_EQ(CpusOfQuota(200000, 100000), 2);
  EXPECT_EQ(CpusOfQuota(150000, 100000), 2);
  EXPECT_EQ(CpusOfQuota(50000, 100000), 1);
  EXPECT_EQ(CpusOfQuota(-1, 100000), 0) << "cgroup v1's no limit";
  EXPECT_EQ(CpusOfQuota(100000, 0), 0);
  std::string source;
  const int cpus = AvailableCpus(&source);
  EXPECT_GE(cpus, 1);
  EXPECT_LE(cpus, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_FALSE(source.empty());
}

}  // namespace
}  // namespace conveyor
