// Schedule resolution: the automatic values of an order (OrderOptions::block_steps,
// window_blocks, and schedule version 2's BlockTable) from what the pipeline measured on a dataset
// and read from a sample spec (ScheduleInputs), and a byte budget. They shape the global order, so
// they depend on the dataset, the spec and the budget only, never on the consumer count, the
// thread count or a server's own budget: a resized job and every server resolve the same order
// (docs/pipeline.md "Schedule versions").
//
// Pure functions of their arguments: shuffle/ reads no dataset. The pipeline takes the figures
// (pipeline/internal/spec_figures.h), asking ScheduleNeedsOf first which ones this order reads,
// so that a naive order costs no episode read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shuffle/order.h"

namespace conveyor {

// A video stream of the spec, as block and window sizing sees it.
struct ScheduleCamera {
  std::string name;          // the spec's name for it (warnings)
  double rate = 0;           // the stream's frames per second, as the manifest says (may be 0)
  double min_delta = 0;      // the spec's earliest and latest delta_timestamps, in seconds
  double max_delta = 0;
  uint64_t frame_bytes = 0;  // one decoded RGB frame at the size the spec delivers it (or the
                             // stream's longer side squared, when it crops or keeps its size)
};

// The keyframes of the first camera's first episode: the GOP length the blocks follow.
struct KeyframeSample {
  uint64_t frames = 0;              // packets of the stream in the episode
  std::vector<uint64_t> keyframes;  // the indexes of its keyframes, ascending
};

struct ScheduleInputs {
  std::string dataset_name;        // the manifest's name (warnings)
  double anchor_rate = 0;          // the anchor stream's rate, as the manifest says (may be 0)
  bool clips = false;              // the spec samples clips per video (SampleSpec::clips)
  bool whole_episodes = false;     // Dataset::reads_whole_episodes()
  uint64_t mean_episode_bytes = 0; // Dataset::mean_episode_bytes()
  std::vector<ScheduleCamera> cameras;  // the spec's video streams, in the spec's order
  // Episode 0 of cameras[0]; nullopt when there is no camera or episode, or it cannot be read.
  std::optional<KeyframeSample> keyframes;
  // The first sample of each episode in the sample index (quarantined episodes left out), then
  // the total; read only when ScheduleNeedsOf says so. With clips, an episode's samples are its
  // clips.
  std::vector<uint64_t> episode_starts;
  // Resolution buckets (SampleSpec::buckets, shuffle/buckets.h): whether the spec has them, how
  // many, and each episode's bucket (one per episode of episode_starts; an episode without
  // samples may hold any), read only when ScheduleNeedsOf says so.
  bool buckets = false;
  size_t num_buckets = 0;
  std::vector<uint32_t> episode_buckets;
  // Buckets by a stored tensor's shape (`buckets: {by: STREAM}`): the most elements of any of its
  // shapes, measured with episode_buckets. Not read by the order: the pipeline prices a sample's
  // memory with it (PipelineOptions::largest_bucket_elements).
  uint64_t largest_bucket_elements = 0;
};

// Which of ScheduleInputs' measured figures ResolveOrder reads for `order`; the others may be left
// empty.
struct ScheduleNeeds {
  bool keyframes = false;       // ScheduleInputs::keyframes
  bool episode_starts = false;  // ScheduleInputs::episode_starts
  bool episode_buckets = false; // ScheduleInputs::episode_buckets (episode_starts with them)
};
// `clips`, `buckets`: ScheduleInputs' flags of the same names.
ScheduleNeeds ScheduleNeedsOf(const OrderOptions& order, bool clips, bool buckets);

// Fills in order->block_steps and order->window_blocks where they are 0 (automatic) and, for
// schedule version >= 2 outside naive mode, order->blocks: a block is about one GOP of the spec's
// first camera in anchor steps (version 2: whole GOPs per episode, measured on episode 0), a
// window as many blocks as half of `queue_bytes` holds twice over (two windows are decoded at
// once). `queue_bytes` is the budget of this dataset (a mixture member's share). A dataset that
// reads whole episodes then keeps two windows of them parsed (EpisodeCacheBytes).
// With buckets (in.buckets), order->buckets instead, once (kept while it is set): the order must
// be naive (the decode-once windows would mix buckets in a batch) and order->bucket_group resolved
// by the pipeline (the spec's group, else the global batch size).
absl::Status ResolveOrder(const ScheduleInputs& in, uint64_t queue_bytes, OrderOptions* order);

// Bytes of the distinct frames one block of `block_steps` anchor steps needs, all cameras.
uint64_t EstimateBlockFrameBytes(const std::vector<ScheduleCamera>& cameras, double anchor_rate,
                                 uint64_t block_steps);

// The episode cache a dataset that reads whole episodes needs under a resolved `order` (the window
// being served and the next one, kept parsed so each episode is read once); 0 when it needs none.
uint64_t EpisodeCacheBytes(const ScheduleInputs& in, const OrderOptions& order);

}  // namespace conveyor
