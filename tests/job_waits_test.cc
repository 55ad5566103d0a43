// server/job_waits.h: the clients' reported step waits per job and rank over a window, the
// quantiles from the merged histogram, the rank that waits most, expiry and the rank cap.
#include "server/job_waits.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace conveyor {
namespace {

using Clock = JobWaits::Clock;
using std::chrono::seconds;

TEST(JobWaitsTest, BucketsAreUpperBounds) {
  EXPECT_EQ(JobWaits::Bucket(0), 0u);
  EXPECT_EQ(JobWaits::Bucket(0.0001), 0u);   // "le": a bound belongs to its own bucket
  EXPECT_EQ(JobWaits::Bucket(0.00011), 1u);
  EXPECT_EQ(JobWaits::Bucket(1), 12u);
  EXPECT_EQ(JobWaits::Bucket(1e6), JobWaits::kBuckets - 1);  // above the last bound
}

TEST(JobWaitsTest, SummaryOfTwoRanks) {
  JobWaits w;
  const Clock::time_point t0 = Clock::now();
  // Rank 0: 100 steps of 1 s, 0.8 ms wait each (0.08% of its time). Rank 1: 100 steps of 1 s, 97
  // waiting 20 ms and 3 waiting 3 s: 10.94% of its time.
  std::vector<float> r0(100, 0.0008f), r1(97, 0.02f);
  r1.insert(r1.end(), 3, 3.0f);
  w.Add("pi0", 0, 2, 100, 0.08, 100, r0, t0);
  w.Add("pi0", 1, 2, 100, 97 * 0.02 + 9, 100, r1, t0);
  const std::vector<JobWaits::Rank> ranks = w.Ranks("pi0", t0);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[1].rank, 1u);
  EXPECT_EQ(ranks[1].consumers, 2u);
  EXPECT_DOUBLE_EQ(ranks[1].max_wait_seconds, 3.0);
  const JobWaits::Summary s = JobWaits::Summarize(ranks);
  EXPECT_EQ(s.steps, 200u);
  EXPECT_EQ(s.slowest_rank, 1);
  EXPECT_NEAR(s.slowest_wait_share, (97 * 0.02 + 9) / 100, 1e-12);
  EXPECT_DOUBLE_EQ(s.p50, 0.001);  // 100 of 200 steps waited at most 1 ms (the bucket's bound)
  EXPECT_DOUBLE_EQ(s.p99, 3.0);    // the 198th of 200 is a 3 s wait: bucket 5 s, capped at the max
  EXPECT_DOUBLE_EQ(s.max, 3.0);
}

TEST(JobWaitsTest, ReportsLeaveTheWindow) {
  JobWaits w(seconds(60));
  const Clock::time_point t0 = Clock::now();
  w.Add("a", 0, 1, 10, 1, 10, std::vector<float>(10, 0.1f), t0);
  w.Add("a", 0, 1, 10, 2, 10, std::vector<float>(10, 0.2f), t0 + seconds(30));
  ASSERT_EQ(w.Ranks("a", t0 + seconds(59)).size(), 1u);
  EXPECT_EQ(w.Ranks("a", t0 + seconds(59))[0].steps, 20u);
  EXPECT_EQ(w.Ranks("a", t0 + seconds(61))[0].steps, 10u);  // the first report expired
  EXPECT_DOUBLE_EQ(w.Ranks("a", t0 + seconds(61))[0].wait_seconds, 2);
  EXPECT_TRUE(w.Ranks("a", t0 + seconds(91)).empty());
  EXPECT_TRUE(w.Snapshot(t0 + seconds(91)).empty());  // the job is gone too
}

TEST(JobWaitsTest, RanksPerJobAreCapped) {
  JobWaits w;
  const Clock::time_point t0 = Clock::now();
  for (uint32_t r = 0; r < JobWaits::kMaxRanksPerJob + 10; ++r) w.Add("big", r, 1u << 20, 1, 0, 1, {}, t0);
  EXPECT_EQ(w.Ranks("big", t0).size(), JobWaits::kMaxRanksPerJob);
  w.Add("big", 0, 1u << 20, 1, 0, 1, {}, t0);  // a tracked rank still counts
  EXPECT_EQ(w.Ranks("big", t0)[0].steps, 2u);
}

TEST(JobWaitsTest, NoReportsNoSlowestRank) {
  const JobWaits::Summary s = JobWaits::Summarize({});
  EXPECT_EQ(s.slowest_rank, -1);
  EXPECT_EQ(s.steps, 0u);
  EXPECT_EQ(s.p99, 0);
}

}  // namespace
}  // namespace conveyor
