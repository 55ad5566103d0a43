// The order of a bucketed epoch (`buckets:` in the spec, sample/buckets.h; docs/sampling.md
// "Buckets"): every batch holds samples of one bucket.
//
// BucketTable lists each bucket's samples (the samples of its episodes, in episode order). An
// epoch with group size G is:
//   1. per bucket b of n_b samples, a keyed permutation P_b of [0, n_b) (key: seed, epoch, b);
//      its first floor(n_b / G) * G images form the bucket's groups of G, and the rest (fewer
//      than G, another set each epoch) wait for a later epoch;
//   2. the groups of every bucket permuted together by a keyed permutation Q (key: seed, epoch);
//   3. position p is sample P_b(j * G + p % G) of the bucket b and group j that Q puts at slot
//      p / G.
// So the sample at a position is a pure function of (episode starts, episode buckets, seed,
// epoch, G, position), O(log buckets + log episodes) per lookup, O(episodes) memory. A global
// batch of B samples (B divides G, batches start at multiples of B) lies inside one group: one
// bucket per batch, and per consumer; the same positions at any consumer count, and at any B
// dividing G.
//
// Like the rest of shuffle/, it reads no dataset: the pipeline measures each episode's bucket
// (pipeline/schedule_inputs.cc, from sample/buckets.h's EpisodeBucket) and hands the figures over
// in ScheduleInputs (shuffle/schedule.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace conveyor {

// Immutable after construction, so thread-safe.
class BucketTable {
 public:
  // `episode_starts`: the first sample of each episode in the sample index, then the total (as
  // ScheduleInputs::episode_starts); `episode_bucket[e]`: episode e's bucket (< num_buckets).
  // Episodes without samples belong to no bucket.
  BucketTable(const std::vector<uint64_t>& episode_starts,
              const std::vector<uint32_t>& episode_bucket, size_t num_buckets);

  size_t num_buckets() const { return episodes_.size(); }
  uint64_t BucketSamples(size_t b) const { return prefix_[b].back(); }
  // The k-th sample (k < BucketSamples(b)) of bucket b, as a sample of the index.
  uint64_t SampleOf(size_t b, uint64_t k) const;
  // Positions of an epoch at group size g: the whole groups of every bucket, times g.
  uint64_t EpochSize(uint64_t group) const;

 private:
  std::vector<std::vector<uint64_t>> episodes_;  // per bucket: its episodes' first samples
  std::vector<std::vector<uint64_t>> prefix_;    // per bucket: samples before each, then total
};

}  // namespace conveyor
