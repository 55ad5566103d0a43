#include "shuffle/buckets.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor {

BucketTable::BucketTable(const SampleIndex& index, const std::vector<uint32_t>& episode_bucket,
                         size_t num_buckets)
    : episodes_(num_buckets), prefix_(num_buckets, std::vector<uint64_t>{0}) {
  for (uint64_t e = 0; e < index.num_episodes(); ++e) {
    const uint64_t n = index.EpisodeSamples(e);
    if (n == 0) continue;
    const uint32_t b = episode_bucket[e];
    episodes_[b].push_back(index.EpisodeStart(e));
    prefix_[b].push_back(prefix_[b].back() + n);
  }
}

absl::StatusOr<std::shared_ptr<const BucketTable>> BucketTable::Build(const Dataset& dataset,
                                                                     const SampleSpec& spec,
                                                                     const SampleIndex& index) {
  std::vector<uint32_t> bucket(index.num_episodes(), 0);
  uint64_t unreadable = 0;
  for (uint64_t e = 0; e < index.num_episodes(); ++e) {
    if (index.EpisodeSamples(e) == 0) continue;  // quarantined or empty: never read
    absl::StatusOr<size_t> b = EpisodeBucket(spec, dataset, e);
    if (!b.ok() && spec.on_error == OnError::kSkip) {
      // Its samples fail again when assembled, and are skipped and counted there; bucket 0
      // holds them meanwhile.
      ++unreadable;
      continue;
    }
    if (!b.ok()) {
      return absl::Status(b.status().code(),
                          StrCat(b.status().message(), " (on_error: skip, or `conveyor check "
                                 "--write-quarantine` and `quarantine:`, leave such episodes out)"));
    }
    bucket[e] = static_cast<uint32_t>(*b);
  }
  if (unreadable > 0) {
    spdlog::warn("buckets: {} episode(s) of {} have no readable index; on_error: skip keeps them "
                 "in bucket 0, to be skipped when assembled", unreadable, dataset.uri());
  }
  return std::make_shared<const BucketTable>(index, bucket, spec.buckets.sizes.size());
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
