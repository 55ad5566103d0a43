// The sample index space: what the order permutes. By default a sample is an anchor step of an
// episode, and samples are numbered episode after episode. With clip sampling (`clips:` in the
// spec, docs/sampling.md "Clips per video") a sample is one of an episode's clips of the epoch:
// K per episode, or one per `stride` anchor steps, each at an anchor drawn from (key, epoch,
// episode, clip) so that its window fits the episode. Built from the episode table alone (no
// shard reads).
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"

namespace conveyor {

// How an episode's clips are drawn (both 0: every anchor step is a sample).
struct ClipSampling {
  uint32_t per_episode = 0;  // K clips per episode per epoch, at stratified random anchors
  uint32_t stride = 0;       // or: a clip every `stride` anchor steps, at a random phase per epoch
  // The clip's window around its anchor, in anchor steps (from the spec's deltas at the anchor
  // stream's nominal rate): an anchor a is valid when a >= back_steps and a + forward_steps <
  // the episode's length, so no frame of the clip is padding.
  uint32_t back_steps = 0;
  uint32_t forward_steps = 0;
  bool enabled() const { return per_episode > 0 || stride > 0; }
};

// O(episodes) memory, O(log episodes) per lookup.
class SampleIndex {
 public:
  // Episodes in `excluded` (quarantined: sample/quarantine.h) get no samples. `clip_key` keys the
  // clips' anchors (the order's key: dataset fingerprint and seed); unused without clips.
  static absl::StatusOr<SampleIndex> Build(const Dataset& dataset, int anchor_stream,
                                           const std::set<uint64_t>& excluded = {},
                                           const ClipSampling& clips = {}, uint64_t clip_key = 0);
  uint64_t size() const { return starts_.empty() ? 0 : starts_.back(); }
  struct Location {
    uint64_t episode = 0;
    uint32_t step = 0;  // the anchor step
  };
  // Where `sample` (< size()) of `epoch` is. Without clips the epoch does not matter.
  Location Locate(uint64_t sample, uint64_t epoch) const;
  uint64_t EpisodeStart(uint64_t episode) const { return starts_[episode]; }
  uint64_t num_episodes() const { return starts_.empty() ? 0 : starts_.size() - 1; }
  uint64_t EpisodeSamples(uint64_t episode) const { return starts_[episode + 1] - starts_[episode]; }
  const ClipSampling& clips() const { return clips_; }
  // Episodes too short for one whole clip: their clip starts at the first step and is padded
  // (`<stream>_is_pad`), counted here so it is never silent.
  uint64_t short_episodes() const { return short_episodes_; }

 private:
  std::vector<uint64_t> starts_;  // starts_[e]: first sample of episode e; then the total
  std::vector<uint32_t> lengths_;  // clips only: each episode's anchor steps
  ClipSampling clips_;
  uint64_t clip_key_ = 0;
  uint64_t short_episodes_ = 0;
};

}  // namespace conveyor
