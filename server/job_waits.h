// The data wait that clients report (conveyor.v1 ReportRequest), per training job and rank, over
// a sliding window: what `conveyor top` and the per-job wait metrics show (which rank waits
// most, the p50/p99/max of a step's wait). docs/serving.md "Metrics".
//
// Thread-safe: every method may be called from any thread (one mutex; a report is a handful of
// additions, a snapshot copies at most kMaxRanksPerJob ranks per job).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class JobWaits {
 public:
  using Clock = std::chrono::steady_clock;
  // Upper bounds (seconds) of the step-wait histogram's buckets; one more bucket above the last
  // holds everything larger. The same bounds label the Prometheus histogram.
  static constexpr std::array<double, 17> kBucketBounds = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
  static constexpr size_t kBuckets = kBucketBounds.size() + 1;
  static constexpr size_t kMaxRanksPerJob = 4096;  // later ranks of a job are not tracked

  // What one rank reported within the window.
  struct Rank {
    uint32_t rank = 0;
    uint32_t consumers = 1;
    uint64_t steps = 0;
    double wait_seconds = 0;
    double step_seconds = 0;
    double max_wait_seconds = 0;
    std::array<uint64_t, kBuckets> buckets{};  // step waits per bucket

    double wait_share() const { return step_seconds > 0 ? wait_seconds / step_seconds : 0; }
    void Merge(const Rank& other);  // the same rank's reports to another server
  };

  // A job's ranks together: quantiles from the merged histogram (the bucket's upper bound, never
  // above the largest wait seen), and the rank that waits the largest share of its step time.
  struct Summary {
    uint64_t steps = 0;
    double p50 = 0, p99 = 0, max = 0;
    int64_t slowest_rank = -1;  // -1: no rank reported
    double slowest_wait_share = 0;
  };

  explicit JobWaits(Clock::duration window = std::chrono::seconds(60)) : window_(window) {}

  // One report: `steps` steps of `step_seconds` wall time, `wait_seconds` of it waiting, and
  // each step's wait (`step_waits`, possibly fewer than `steps`: the client sends at most 1024).
  void Add(const std::string& job, uint32_t rank, uint32_t consumers, uint64_t steps,
           double wait_seconds, double step_seconds, const std::vector<float>& step_waits,
           Clock::time_point now = Clock::now());

  // Every job with a report in the window, and its ranks in rank order.
  std::map<std::string, std::vector<Rank>> Snapshot(Clock::time_point now = Clock::now());
  // One job's ranks (empty when none reported within the window).
  std::vector<Rank> Ranks(const std::string& job, Clock::time_point now = Clock::now());

  static Summary Summarize(const std::vector<Rank>& ranks);
  static size_t Bucket(double wait_seconds);

 private:
  struct Entry {
    Clock::time_point at;
    Rank delta;  // this report alone
  };
  void Expire(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock::duration window_;
  absl::Mutex mu_;
  // job -> rank -> reports in the window, oldest first.
  std::map<std::string, std::map<uint32_t, std::deque<Entry>>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor
