#include "shuffle/buckets.h"

#include <algorithm>

namespace conveyor {

BucketTable::BucketTable(const std::vector<uint64_t>& episode_starts,
                         const std::vector<uint32_t>& episode_bucket, size_t num_buckets)
    : episodes_(num_buckets), prefix_(num_buckets, std::vector<uint64_t>{0}) {
  for (size_t e = 0; e + 1 < episode_starts.size(); ++e) {
    const uint64_t n = episode_starts[e + 1] - episode_starts[e];
    if (n == 0) continue;
    const uint32_t b = episode_bucket[e];
    episodes_[b].push_back(episode_starts[e]);
    prefix_[b].push_back(prefix_[b].back() + n);
  }
}

uint64_t BucketTable::SampleOf(size_t b, uint64_t k) const {
  const std::vector<uint64_t>& p = prefix_[b];
  const size_t i = static_cast<size_t>(std::upper_bound(p.begin(), p.end() - 1, k) - p.begin()) - 1;
  return episodes_[b][i] + (k - p[i]);
}

uint64_t BucketTable::EpochSize(uint64_t group) const {
  uint64_t n = 0;
  for (size_t b = 0; b < num_buckets(); ++b) n += BucketSamples(b) / group * group;
  return n;
}

}  // namespace conveyor
