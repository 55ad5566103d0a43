#include "server/job_waits.h"

#include <algorithm>
#include <cmath>

namespace conveyor {

void JobWaits::Rank::Merge(const Rank& other) {
  consumers = std::max(consumers, other.consumers);
  steps += other.steps;
  wait_seconds += other.wait_seconds;
  step_seconds += other.step_seconds;
  max_wait_seconds = std::max(max_wait_seconds, other.max_wait_seconds);
  for (size_t i = 0; i < kBuckets; ++i) buckets[i] += other.buckets[i];
}

size_t JobWaits::Bucket(double wait_seconds) {
  return static_cast<size_t>(std::lower_bound(kBucketBounds.begin(), kBucketBounds.end(), wait_seconds) -
                             kBucketBounds.begin());
}

void JobWaits::Add(const std::string& job, uint32_t rank, uint32_t consumers, uint64_t steps,
                   double wait_seconds, double step_seconds, const std::vector<float>& step_waits,
                   Clock::time_point now) {
  Entry e{now, {}};
  e.delta.rank = rank;
  e.delta.consumers = consumers;
  e.delta.steps = steps;
  e.delta.wait_seconds = wait_seconds;
  e.delta.step_seconds = step_seconds;
  for (float w : step_waits) {
    const double v = std::isfinite(w) && w > 0 ? w : 0;
    ++e.delta.buckets[Bucket(v)];
    e.delta.max_wait_seconds = std::max(e.delta.max_wait_seconds, v);
  }
  absl::MutexLock lock(&mu_);
  Expire(now);
  auto& ranks = jobs_[job];
  if (!ranks.count(rank) && ranks.size() >= kMaxRanksPerJob) return;
  ranks[rank].push_back(std::move(e));
}

void JobWaits::Expire(Clock::time_point now) {
  for (auto job = jobs_.begin(); job != jobs_.end();) {
    for (auto r = job->second.begin(); r != job->second.end();) {
      while (!r->second.empty() && now - r->second.front().at > window_) r->second.pop_front();
      r = r->second.empty() ? job->second.erase(r) : std::next(r);
    }
    job = job->second.empty() ? jobs_.erase(job) : std::next(job);
  }
}

std::map<std::string, std::vector<JobWaits::Rank>> JobWaits::Snapshot(Clock::time_point now) {
  std::map<std::string, std::vector<Rank>> out;
  absl::MutexLock lock(&mu_);
  Expire(now);
  for (const auto& [job, ranks] : jobs_) {
    std::vector<Rank>& v = out[job];
    for (const auto& [rank, entries] : ranks) {
      Rank sum;
      sum.rank = rank;
      sum.consumers = 0;
      for (const Entry& e : entries) sum.Merge(e.delta);
      v.push_back(sum);
    }
  }
  return out;
}

std::vector<JobWaits::Rank> JobWaits::Ranks(const std::string& job, Clock::time_point now) {
  std::vector<Rank> out;
  absl::MutexLock lock(&mu_);
  Expire(now);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  for (const auto& [rank, entries] : it->second) {
    Rank sum;
    sum.rank = rank;
    sum.consumers = 0;
    for (const Entry& e : entries) sum.Merge(e.delta);
    out.push_back(sum);
  }
  return out;
}

JobWaits::Summary JobWaits::Summarize(const std::vector<Rank>& ranks) {
  Summary s;
  std::array<uint64_t, kBuckets> buckets{};
  uint64_t counted = 0;
  for (const Rank& r : ranks) {
    s.steps += r.steps;
    s.max = std::max(s.max, r.max_wait_seconds);
    for (size_t i = 0; i < kBuckets; ++i) {
      buckets[i] += r.buckets[i];
      counted += r.buckets[i];
    }
    if (r.step_seconds > 0 && (s.slowest_rank < 0 || r.wait_share() > s.slowest_wait_share)) {
      s.slowest_rank = r.rank;
      s.slowest_wait_share = r.wait_share();
    }
  }
  auto quantile = [&](double q) {
    if (counted == 0) return 0.0;
    const double want = q * static_cast<double>(counted);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      cumulative += buckets[i];
      if (static_cast<double>(cumulative) >= want && buckets[i] > 0) {
        return i < kBucketBounds.size() ? std::min(kBucketBounds[i], s.max) : s.max;
      }
    }
    return s.max;
  };
  s.p50 = quantile(0.5);
  s.p99 = quantile(0.99);
  return s;
}

}  // namespace conveyor
