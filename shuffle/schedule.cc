// Schedule resolution (shuffle/schedule.h): the automatic block and window sizes of an order,
// from the dataset's first episode and the sample spec.
#include "shuffle/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <spdlog/spdlog.h>

#include "base/status_macros.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/sample_index.h"
#include "sample/quarantine.h"
#include "shuffle/buckets.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

// The most common distance between consecutive keyframes of `stream` in episode 0, in frames
// (0 when episode 0 cannot be read; its length when it has one keyframe).
uint64_t MeasureGopFrames(const Dataset& dataset, int stream, double* aligned_share) {
  *aligned_share = 1;
  if (dataset.num_episodes() == 0) return 0;
  auto ep = dataset.LoadEpisode(0);
  if (!ep.ok()) return 0;
  const auto& flags = (*ep)->streams(stream).packets().flags();
  std::vector<uint64_t> keys;
  for (int i = 0; i < flags.size(); ++i) {
    if (flags[i] & 1) keys.push_back(static_cast<uint64_t>(i));
  }
  if (keys.size() < 2) return static_cast<uint64_t>(std::max(flags.size(), 1));
  std::map<uint64_t, uint64_t> count;
  for (size_t i = 1; i < keys.size(); ++i) ++count[keys[i] - keys[i - 1]];
  uint64_t gop = 1, most = 0;
  for (const auto& [interval, n] : count) {
    if (n > most) gop = interval, most = n;
  }
  uint64_t on_grid = 0;
  for (uint64_t k : keys) on_grid += k % gop == 0 ? 1 : 0;
  *aligned_share = static_cast<double>(on_grid) / static_cast<double>(keys.size());
  return gop;
}

// Schedule version 2's blocks: whole GOPs of the spec's first camera, per episode, shifted by
// the frames its samples reach back (so a block's earliest frame is a keyframe), at least
// `block_steps` anchor steps long when that is given.
absl::Status ResolveGopBlocks(const Dataset& dataset, const SampleSpec& spec, OrderOptions* order) {
  const Manifest& manifest = dataset.manifest();
  ASSIGN_OR_RETURN(std::set<uint64_t> quarantined, QuarantinedEpisodes(spec, dataset));
  ASSIGN_OR_RETURN(SampleIndex index, SampleIndex::Build(dataset, spec.anchor_stream, quarantined));
  std::vector<uint64_t> starts;
  starts.reserve(index.num_episodes() + 1);
  for (uint64_t e = 0; e < index.num_episodes(); ++e) starts.push_back(index.EpisodeStart(e));
  starts.push_back(index.size());
  const double anchor_rate = std::max(manifest.streams[spec.anchor_stream].rate, 1e-6);
  GopBlocks gop;
  const StreamSpec* camera = nullptr;
  for (const StreamSpec& s : spec.streams) {
    if (s.kind == pb::VIDEO) {
      camera = &s;
      break;
    }
  }
  uint64_t gop_frames = 0;
  if (camera != nullptr) {
    const double fps = std::max(manifest.streams[camera->stream].rate, 1e-6);
    gop.frames_per_step = fps / anchor_rate;
    double min_delta = 0;
    for (double d : camera->deltas) min_delta = std::min(min_delta, d);
    gop.back_frames = static_cast<uint64_t>(std::ceil(-min_delta * fps - 1e-6));
    double aligned = 1;
    gop_frames = MeasureGopFrames(dataset, camera->stream, &aligned);
    if (gop_frames > 0 && aligned < 0.9) {
      spdlog::warn("{}: stream '{}' has keyframes off a {}-frame grid ({:.0f}% on it): GOP-aligned "
                   "blocks will decode more than they deliver",
                   manifest.name, camera->name, gop_frames, 100 * aligned);
    }
  }
  if (gop_frames == 0) {
    // No camera (or none readable): blocks of about a second of anchor steps, per episode.
    gop.frames_per_step = 1;
    gop_frames = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(anchor_rate)));
  }
  if (dataset.reads_whole_episodes()) {
    // Every episode one block: a window's episodes are each read once (an RLDS record holds a
    // whole episode), and its samples are shuffled across them.
    gop.frames_per_step = 1;
    gop.back_frames = 0;
    uint64_t longest = 1;
    for (uint64_t e = 0; e + 1 < starts.size(); ++e) longest = std::max(longest, starts[e + 1] - starts[e]);
    gop.span_frames = longest;
    order->blocks = std::make_shared<const BlockTable>(std::move(starts), gop);
    order->block_steps = std::max<uint64_t>(1, order->blocks->max_block_size());
    return absl::OkStatus();
  }
  uint64_t gops = 1;
  if (order->block_steps > 0) {
    const double min_frames = static_cast<double>(order->block_steps) * gop.frames_per_step;
    gops = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(min_frames / static_cast<double>(gop_frames) - 1e-9)));
  }
  gop.span_frames = gops * gop_frames;
  order->blocks = std::make_shared<const BlockTable>(std::move(starts), gop);
  order->block_steps = std::max<uint64_t>(1, order->blocks->max_block_size());
  return absl::OkStatus();
}

}  // namespace

uint64_t EstimateBlockFrameBytes(const SampleSpec& spec, const Manifest& m, uint64_t block_steps) {
  const double anchor_rate = std::max(1e-9, m.streams[spec.anchor_stream].rate);
  uint64_t total = 0;
  for (const StreamSpec& s : spec.streams) {
    if (s.kind != pb::VIDEO) continue;
    const StreamInfo& info = m.streams[s.stream];
    const auto [lo, hi] = std::minmax_element(s.deltas.begin(), s.deltas.end());
    const double span_s = static_cast<double>(block_steps) / anchor_rate + (*hi - *lo);
    const uint64_t frames = static_cast<uint64_t>(std::ceil(span_s * std::max(info.rate, 1.0))) + 1;
    int64_t h = s.height, w = s.width;
    if (h == 0 || s.augment.crop.has_value()) {
      h = info.shape.size() >= 2 ? std::max(info.shape[0], info.shape[1]) : 1;
      w = h;
    }
    total += frames * static_cast<uint64_t>(h * w * 3);
  }
  return total;
}

absl::Status ResolveOrder(const Dataset& dataset, const SampleSpec& spec, uint64_t queue_bytes,
                          OrderOptions* order) {
  const Manifest& manifest = dataset.manifest();
  if (spec.buckets.enabled()) {
    // One bucket per batch is an order of its own (shuffle/buckets.h): groups of one bucket,
    // permuted; the decode-once windows would mix buckets in a batch.
    if (!order->naive()) {
      return absl::InvalidArgumentError(
          "buckets: a bucketed order is groups of one bucket's samples, permuted (docs/sampling.md "
          "\"Buckets\"); the decode-once schedule (pipeline.schedule mode gop) does not apply: "
          "remove the schedule section or give mode: naive");
    }
    if (order->bucket_group == 0) {
      return absl::InternalError("buckets: the group size is resolved by the pipeline first");
    }
    if (!order->buckets) {
      ASSIGN_OR_RETURN(std::set<uint64_t> quarantined, QuarantinedEpisodes(spec, dataset));
      // Clip counts per episode do not depend on the clips' key, only the anchors do.
      ASSIGN_OR_RETURN(SampleIndex index,
                       SampleIndex::Build(dataset, spec.anchor_stream, quarantined, spec.clips));
      ASSIGN_OR_RETURN(order->buckets, BucketTable::Build(dataset, spec, index));
    }
  }
  if (spec.clips.enabled()) {
    // A clip's anchor moves every epoch, so there are no fixed runs of consecutive anchor steps
    // to decode once: the clips are permuted globally, each decoded from its keyframe.
    if (!order->naive()) {
      return absl::InvalidArgumentError(
          "clips: sampling clips per video has its own order (a global permutation of the clips, "
          "each at an anchor drawn per epoch); the decode-once schedule (pipeline.schedule mode "
          "gop) cuts runs of consecutive anchor steps and does not apply: remove the schedule "
          "section or give mode: naive");
    }
    return absl::OkStatus();
  }
  if (spec.buckets.enabled()) return absl::OkStatus();
  if (order->version >= 2 && !order->naive() && !order->blocks) {
    RETURN_IF_ERROR(ResolveGopBlocks(dataset, spec, order));
  } else if (order->block_steps == 0) {
    double gop_s = 1.0;
    for (const StreamSpec& s : spec.streams) {
      if (s.kind != pb::VIDEO || dataset.num_episodes() == 0) continue;
      auto ep = dataset.LoadEpisode(0);
      if (!ep.ok()) break;
      const auto& pk = (*ep)->streams(s.stream).packets();
      int keys = 0;
      for (uint32_t f : pk.flags()) keys += (f & 1) ? 1 : 0;
      const double rate = std::max(manifest.streams[s.stream].rate, 1.0);
      if (keys > 0) gop_s = static_cast<double>(pk.flags_size()) / keys / rate;
      break;
    }
    order->block_steps = std::max<uint64_t>(
        1, static_cast<uint64_t>(std::llround(gop_s * manifest.streams[spec.anchor_stream].rate)));
  }
  if (order->window_blocks == 0) {
    // Not divided by the consumer count: the order must not depend on it (a resized job
    // continues the same sequence), so the window is sized as if one consumer decoded it all.
    uint64_t per_block =
        std::max<uint64_t>(1, EstimateBlockFrameBytes(spec, manifest, order->block_steps));
    if (dataset.reads_whole_episodes()) {
      // A block is an episode read whole and kept parsed until its window is done: two windows
      // of episodes (the one being served and the next) in half the budget.
      per_block = std::max(per_block, dataset.mean_episode_bytes());
    }
    order->window_blocks = std::clamp<uint64_t>(queue_bytes / 2 / (2 * per_block), 1, 4096);
  }
  if (dataset.reads_whole_episodes() && !order->naive()) {
    // The window being served and the next one, kept parsed so each episode is read once.
    dataset.ReserveEpisodeCache(2 * order->window_blocks * dataset.mean_episode_bytes() * 5 / 4);
  }
  return absl::OkStatus();
}

}  // namespace conveyor
