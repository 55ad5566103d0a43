// The sample index space: what the order permutes. A sample is an anchor step of an episode;
// samples are numbered episode after episode. Built from the episode table alone (no shard reads).
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"

namespace conveyor {

// O(episodes) memory, O(log episodes) per lookup.
class SampleIndex {
 public:
  // Episodes in `excluded` (quarantined: sample/quarantine.h) get no samples.
  static absl::StatusOr<SampleIndex> Build(const Dataset& dataset, int anchor_stream,
                                           const std::set<uint64_t>& excluded = {});
  uint64_t size() const { return starts_.empty() ? 0 : starts_.back(); }
  struct Location {
    uint64_t episode = 0;
    uint32_t step = 0;
  };
  Location Locate(uint64_t sample) const;  // sample < size()
  uint64_t EpisodeStart(uint64_t episode) const { return starts_[episode]; }
  uint64_t num_episodes() const { return starts_.empty() ? 0 : starts_.size() - 1; }
  uint64_t EpisodeSamples(uint64_t episode) const { return starts_[episode + 1] - starts_[episode]; }

 private:
  std::vector<uint64_t> starts_;  // starts_[e]: first sample of episode e; then the total
};

}  // namespace conveyor
