#include "datasets/sample_index.h"

#include <algorithm>

#include "base/mix.h"
#include "base/strings.h"

namespace conveyor {

namespace {

// The valid anchors of an episode of `length` steps: [lo, hi], or the single step `lo` when the
// episode is too short for a whole clip (`*short_episode` set).
struct AnchorRange {
  uint64_t lo = 0, count = 1;  // anchors lo .. lo + count - 1
  bool short_episode = false;
};

AnchorRange Anchors(const ClipSampling& c, uint32_t length) {
  AnchorRange r;
  const uint64_t window = uint64_t{c.back_steps} + c.forward_steps + 1;
  if (length < window) {
    r.lo = std::min<uint64_t>(c.back_steps, length - 1);
    r.short_episode = true;
    return r;
  }
  r.lo = c.back_steps;
  r.count = length - window + 1;
  return r;
}

uint64_t ClipsOf(const ClipSampling& c, uint32_t length) {
  if (length == 0) return 0;
  if (c.per_episode > 0) return c.per_episode;
  return (Anchors(c, length).count - 1) / c.stride + 1;
}

}  // namespace

absl::StatusOr<SampleIndex> SampleIndex::Build(const Dataset& dataset, int anchor_stream,
                                               const std::set<uint64_t>& excluded,
                                               const ClipSampling& clips, uint64_t clip_key) {
  if (anchor_stream < 0 || anchor_stream >= static_cast<int>(dataset.manifest().streams.size())) {
    return absl::InvalidArgumentError(StrCat("anchor stream ", anchor_stream, " out of range"));
  }
  if (clips.per_episode > 0 && clips.stride > 0) {
    return absl::InvalidArgumentError("clips: per_video and stride exclude each other");
  }
  SampleIndex idx;
  idx.clips_ = clips;
  idx.clip_key_ = clip_key;
  idx.starts_.reserve(dataset.num_episodes() + 1);
  if (clips.enabled()) idx.lengths_.reserve(dataset.num_episodes());
  uint64_t total = 0;
  for (size_t e = 0; e < dataset.num_episodes(); ++e) {
    idx.starts_.push_back(total);
    const uint32_t length =
        excluded.count(e) != 0 ? 0 : dataset.episodes().length(e, static_cast<size_t>(anchor_stream));
    if (!clips.enabled()) {
      total += length;
      continue;
    }
    idx.lengths_.push_back(length);
    if (length > 0 && Anchors(clips, length).short_episode) ++idx.short_episodes_;
    total += ClipsOf(clips, length);
  }
  idx.starts_.push_back(total);
  return idx;
}

SampleIndex::Location SampleIndex::Locate(uint64_t sample, uint64_t epoch) const {
  // The last episode whose start is <= sample (episodes without samples are skipped over).
  auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, sample);
  const uint64_t e = static_cast<uint64_t>(it - starts_.begin()) - 1;
  const uint64_t j = sample - starts_[e];
  if (!clips_.enabled()) return Location{e, static_cast<uint32_t>(j)};
  const AnchorRange r = Anchors(clips_, lengths_[e]);
  // One draw per (key, epoch, episode[, clip]): the same anchors on every server, thread and
  // consumer, and a new set each epoch.
  const uint64_t episode_draw = Mix64(clip_key_ ^ Mix64(Mix64(epoch + 0x636c6970ull) ^ e));
  uint64_t offset = 0;
  if (clips_.per_episode > 0) {
    // Stratified: clip j of K falls in the j-th K-th of the valid anchors, so an episode's clips
    // spread over it (and are distinct when it has at least K anchors).
    const uint64_t k = clips_.per_episode;
    const uint64_t u = Mix64(episode_draw ^ (j + 1)) % r.count;
    offset = (j * r.count + u) / k;
  } else {
    // Every stride-th anchor from a random phase within the slack the last clip leaves.
    const uint64_t n = (r.count - 1) / clips_.stride + 1;
    const uint64_t slack = r.count - 1 - (n - 1) * clips_.stride;
    offset = episode_draw % (slack + 1) + j * clips_.stride;
  }
  return Location{e, static_cast<uint32_t>(r.lo + offset)};
}

}  // namespace conveyor
