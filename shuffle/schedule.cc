// Schedule resolution (shuffle/schedule.h): the automatic block and window sizes of an order,
// from the figures the pipeline measured on the dataset's first episode and read from the spec.
#include "shuffle/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include <spdlog/spdlog.h>

#include "base/strings.h"
#include "shuffle/buckets.h"

namespace conveyor {

namespace {

bool ResolvesGopBlocks(const OrderOptions& order) {
  return order.version >= 2 && !order.naive() && !order.blocks;
}

// The most common distance between consecutive keyframes, in frames (0 when episode 0 could not
// be read; its length when it has one keyframe), and the share of keyframes on that grid.
uint64_t GopFrames(const std::optional<KeyframeSample>& sample, double* aligned_share) {
  *aligned_share = 1;
  if (!sample.has_value()) return 0;
  const std::vector<uint64_t>& keys = sample->keyframes;
  if (keys.size() < 2) return std::max<uint64_t>(sample->frames, 1);
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
void ResolveGopBlocks(const ScheduleInputs& in, OrderOptions* order) {
  std::vector<uint64_t> starts = in.episode_starts;
  const double anchor_rate = std::max(in.anchor_rate, 1e-6);
  GopBlocks gop;
  uint64_t gop_frames = 0;
  if (!in.cameras.empty()) {
    const ScheduleCamera& camera = in.cameras.front();
    const double fps = std::max(camera.rate, 1e-6);
    gop.frames_per_step = fps / anchor_rate;
    const double min_delta = std::min(0.0, camera.min_delta);
    gop.back_frames = static_cast<uint64_t>(std::ceil(-min_delta * fps - 1e-6));
    double aligned = 1;
    gop_frames = GopFrames(in.keyframes, &aligned);
    if (gop_frames > 0 && aligned < 0.9) {
      spdlog::warn("{}: stream '{}' has keyframes off a {}-frame grid ({:.0f}% on it): GOP-aligned "
                   "blocks will decode more than they deliver",
                   in.dataset_name, camera.name, gop_frames, 100 * aligned);
    }
  }
  if (gop_frames == 0) {
    // No camera (or none readable): blocks of about a second of anchor steps, per episode.
    gop.frames_per_step = 1;
    gop_frames = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(anchor_rate)));
  }
  if (in.whole_episodes) {
    // Every episode one block: a window's episodes are each read once (an RLDS record holds a
    // whole episode), and its samples are shuffled across them.
    gop.frames_per_step = 1;
    gop.back_frames = 0;
    uint64_t longest = 1;
    for (uint64_t e = 0; e + 1 < starts.size(); ++e) longest = std::max(longest, starts[e + 1] - starts[e]);
    gop.span_frames = longest;
    order->blocks = std::make_shared<const BlockTable>(std::move(starts), gop);
    order->block_steps = std::max<uint64_t>(1, order->blocks->max_block_size());
    return;
  }
  uint64_t gops = 1;
  if (order->block_steps > 0) {
    const double min_frames = static_cast<double>(order->block_steps) * gop.frames_per_step;
    gops = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(min_frames / static_cast<double>(gop_frames) - 1e-9)));
  }
  gop.span_frames = gops * gop_frames;
  order->blocks = std::make_shared<const BlockTable>(std::move(starts), gop);
  order->block_steps = std::max<uint64_t>(1, order->blocks->max_block_size());
}

// Schedule version 1's block: about one GOP of the first camera (episode 0's frames per
// keyframe), in anchor steps; a second without a camera.
uint64_t UniformBlockSteps(const ScheduleInputs& in) {
  double gop_s = 1.0;
  if (!in.cameras.empty() && in.keyframes.has_value()) {
    const double rate = std::max(in.cameras.front().rate, 1.0);
    const uint64_t keys = in.keyframes->keyframes.size();
    if (keys > 0) {
      gop_s = static_cast<double>(in.keyframes->frames) / static_cast<double>(keys) / rate;
    }
  }
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(gop_s * in.anchor_rate)));
}

}  // namespace

ScheduleNeeds ScheduleNeedsOf(const OrderOptions& order, bool clips, bool buckets) {
  ScheduleNeeds needs;
  if (buckets) {
    // Measured once (ResolveOrder keeps the table), and not for an order it refuses.
    needs.episode_buckets = needs.episode_starts = order.naive() && !order.buckets;
    return needs;
  }
  if (clips) return needs;
  needs.episode_starts = ResolvesGopBlocks(order);
  needs.keyframes = needs.episode_starts || order.block_steps == 0;
  return needs;
}

uint64_t EstimateBlockFrameBytes(const std::vector<ScheduleCamera>& cameras, double anchor_rate,
                                 uint64_t block_steps) {
  const double anchor = std::max(1e-9, anchor_rate);
  uint64_t total = 0;
  for (const ScheduleCamera& c : cameras) {
    const double span_s = static_cast<double>(block_steps) / anchor + (c.max_delta - c.min_delta);
    const uint64_t frames = static_cast<uint64_t>(std::ceil(span_s * std::max(c.rate, 1.0))) + 1;
    total += frames * c.frame_bytes;
  }
  return total;
}

absl::Status ResolveOrder(const ScheduleInputs& in, uint64_t queue_bytes, OrderOptions* order) {
  if (in.buckets) {
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
      if (in.episode_starts.empty() || in.episode_buckets.size() + 1 != in.episode_starts.size()) {
        return absl::InternalError(StrCat(
            "buckets: the pipeline measured ", in.episode_buckets.size(), " episode buckets for ",
            in.episode_starts.empty() ? 0 : in.episode_starts.size() - 1, " episodes"));
      }
      for (const uint32_t b : in.episode_buckets) {
        if (b >= in.num_buckets) {
          return absl::InternalError(StrCat("buckets: an episode's bucket ", b, " is not one of the ",
                                            in.num_buckets, " buckets"));
        }
      }
      order->buckets =
          std::make_shared<const BucketTable>(in.episode_starts, in.episode_buckets, in.num_buckets);
    }
    return absl::OkStatus();
  }
  if (in.clips) {
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
  if (ResolvesGopBlocks(*order)) {
    ResolveGopBlocks(in, order);
  } else if (order->block_steps == 0) {
    order->block_steps = UniformBlockSteps(in);
  }
  if (order->window_blocks == 0) {
    // Not divided by the consumer count: the order must not depend on it (a resized job
    // continues the same sequence), so the window is sized as if one consumer decoded it all.
    uint64_t per_block =
        std::max<uint64_t>(1, EstimateBlockFrameBytes(in.cameras, in.anchor_rate, order->block_steps));
    if (in.whole_episodes) {
      // A block is an episode read whole and kept parsed until its window is done: two windows
      // of episodes (the one being served and the next) in half the budget.
      per_block = std::max(per_block, in.mean_episode_bytes);
    }
    order->window_blocks = std::clamp<uint64_t>(queue_bytes / 2 / (2 * per_block), 1, 4096);
  }
  return absl::OkStatus();
}

uint64_t EpisodeCacheBytes(const ScheduleInputs& in, const OrderOptions& order) {
  if (!in.whole_episodes || order.naive()) return 0;
  return 2 * order.window_blocks * in.mean_episode_bytes * 5 / 4;
}

}  // namespace conveyor
