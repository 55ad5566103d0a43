#include "datasets/sample_index.h"

#include <algorithm>

#include "base/strings.h"

namespace conveyor {

absl::StatusOr<SampleIndex> SampleIndex::Build(const Dataset& dataset, int anchor_stream,
                                               const std::set<uint64_t>& excluded) {
  if (anchor_stream < 0 || anchor_stream >= static_cast<int>(dataset.manifest().streams.size())) {
    return absl::InvalidArgumentError(StrCat("anchor stream ", anchor_stream, " out of range"));
  }
  SampleIndex idx;
  idx.starts_.reserve(dataset.num_episodes() + 1);
  uint64_t total = 0;
  for (size_t e = 0; e < dataset.num_episodes(); ++e) {
    idx.starts_.push_back(total);
    if (excluded.count(e) != 0) continue;
    total += dataset.episodes().length(e, static_cast<size_t>(anchor_stream));
  }
  idx.starts_.push_back(total);
  return idx;
}

SampleIndex::Location SampleIndex::Locate(uint64_t sample) const {
  // The last episode whose start is <= sample (episodes of length 0 are skipped over).
  auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, sample);
  const uint64_t e = static_cast<uint64_t>(it - starts_.begin()) - 1;
  return Location{e, static_cast<uint32_t>(sample - starts_[e])};
}

}  // namespace conveyor
