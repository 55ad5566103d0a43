// The sample order of an epoch: a pure function of (dataset fingerprint, seed, epoch), computed
// per position without materializing anything (O(1) memory per lookup, fine at 10^9 samples).
//
// KeyedPermutation is a keyed bijection on [0, n): a 6-round Feistel network on the smallest
// even-bit power-of-two domain >= n, with cycle walking back into [0, n) (expected < 4 rounds of
// the network per lookup).
//
// EpochOrder adds decode-once GOP scheduling (docs/pipeline.md): the sample index space is cut
// into blocks of `block_steps` consecutive samples (consecutive anchor steps of one episode, so
// the frames they need are neighbours in one or two groups of pictures); the full blocks are
// permuted; consecutive permuted blocks form windows of `window_blocks` blocks; and within a
// window the samples are permuted again. A window's samples are therefore served together, each
// block's frames decoded in one forward pass, while a batch still mixes `window_blocks` blocks
// from all over the dataset. block_steps = window_blocks = 1 is the plain global permutation
// ("naive" mode). The at most block_steps - 1 samples after the last full block join the last
// window (shuffled within it). That is schedule version 1. Version 2 takes its blocks from a
// BlockTable (whole GOPs per episode, of varying sizes): every block is permuted, windows are
// `window_blocks` consecutive permuted blocks, and within a window the samples are permuted
// again, as in version 1. Version 3 has version 2's order; it differs in how the samples' audio
// is decoded (AudioMethod::kChunks, docs/pipeline.md "Schedule versions"). Version 4 has version
// 3's order and audio; it differs in where video crops are cut (CropMethod::kInDecoder).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class BucketTable;  // shuffle/buckets.h

class KeyedPermutation {
 public:
  KeyedPermutation() = default;
  KeyedPermutation(uint64_t n, uint64_t key);
  uint64_t size() const { return n_; }
  // The image of i (i < size()).
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t Round(uint64_t x) const;
  static constexpr int kRounds = 6;
  uint64_t n_ = 0;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
  uint64_t keys_[kRounds] = {};
};

// A 64-bit key from the dataset fingerprint (hex text) and the seed: the order depends on both.
uint64_t OrderKey(std::string_view fingerprint, uint64_t seed);

// How schedule version 2 cuts an episode into blocks: whole groups of pictures of a reference
// camera, in the anchor's time. Anchor step s of an episode shows the camera's frame
// f(s) = floor(s * frames_per_step + 0.5) (the frame nearest its time on a regular grid); a
// sample also needs up to `back_frames` frames before that one (its delta_timestamps). Block 0
// of an episode holds the steps with f(s) < back_frames + span_frames, block j >= 1 those with
// back_frames + j * span_frames <= f(s) < back_frames + (j + 1) * span_frames. With GOPs of G
// frames starting at frame 0 and span_frames a multiple of G, every block but an episode's first
// needs frames from exactly one keyframe on: decoded from its keyframe, nothing is wasted.
// Blocks never cross an episode's end. A block may be empty (steps sparser than frames).
struct GopBlocks {
  double frames_per_step = 1;  // reference camera frames per anchor step (> 0)
  uint64_t back_frames = 0;
  uint64_t span_frames = 1;    // >= 1; whole GOPs
};

// The blocks of schedule version 2 over a sample index (episodes end to end), in O(episodes)
// memory; lookups are O(log episodes). Immutable after construction, so thread-safe.
class BlockTable {
 public:
  // episode_starts: first sample of each episode, then the total (non-decreasing, from 0).
  BlockTable(std::vector<uint64_t> episode_starts, GopBlocks gop);
  uint64_t num_samples() const { return starts_.empty() ? 0 : starts_.back(); }
  uint64_t num_blocks() const { return first_block_.empty() ? 0 : first_block_.back(); }
  uint64_t BlockOf(uint64_t sample) const;     // sample < num_samples()
  uint64_t BlockBegin(uint64_t block) const;   // its first sample; block < num_blocks()
  uint64_t BlockEnd(uint64_t block) const;     // one past its last sample
  uint64_t BlockSize(uint64_t block) const { return BlockEnd(block) - BlockBegin(block); }
  uint64_t max_block_size() const { return max_block_; }
  const GopBlocks& gop() const { return gop_; }

 private:
  uint64_t Frame(uint64_t step) const;
  uint64_t LocalBlock(uint64_t step) const;
  uint64_t FirstStep(uint64_t local_block) const;  // smallest step whose block is >= it
  std::vector<uint64_t> starts_;
  std::vector<uint64_t> first_block_;  // per episode, then the total
  GopBlocks gop_;
  uint64_t max_block_ = 0;
};

// The schedule version a config gets when it names none. Version 1 (blocks of block_steps
// consecutive samples of the whole index, across episode and GOP boundaries) and version 2 (whole
// GOPs, audio windows decoded one by one) stay selectable: a job that checkpointed under one
// resumes under it (docs/pipeline.md "Schedule versions"). The version travels with the cursor,
// so it also versions what else decides a sample's bits: version 3 is version 2's order with
// audio windows cut from fixed chunks, version 4 is version 3 with CPU video crops cut in the
// decoder's pixel format.
constexpr uint32_t kScheduleVersionCurrent = 4;

struct OrderOptions {
  uint64_t block_steps = 1;    // samples per block (1: naive); version 2+: at least this many
  uint64_t window_blocks = 1;  // blocks per window (1: naive)
  uint32_t version = kScheduleVersionCurrent;  // 1 to 4; the naive order is the same in all
  // Version 2's blocks, resolved by the pipeline from the dataset (null: version 1's uniform
  // blocks). Shared: every epoch's order uses the same table.
  std::shared_ptr<const BlockTable> blocks;
  // Buckets (shuffle/buckets.h; `buckets:` in the spec): positions come in groups of
  // `bucket_group` samples of one bucket, resolved by the pipeline (the spec's group, else the
  // global batch size). Null: no buckets. Only with the naive order.
  std::shared_ptr<const BucketTable> buckets;
  uint64_t bucket_group = 0;
  // The plain global permutation. 0 in block_steps or window_blocks means "auto" (GOP mode, to
  // be resolved by the pipeline), not naive.
  bool naive() const { return block_steps == 1 && window_blocks == 1 && !blocks; }
  // GOP mode with its sizes to be resolved by the pipeline.
  static OrderOptions AutoGop() {
    OrderOptions o;
    o.block_steps = 0;
    o.window_blocks = 0;
    return o;
  }
};

class EpochOrder {
 public:
  EpochOrder(uint64_t num_samples, uint64_t key, uint64_t epoch, OrderOptions options);
  uint64_t size() const { return n_; }
  // The sample at `position` of the epoch (position < size()).
  uint64_t SampleAt(uint64_t position) const;
  // The window `position` falls in, and the positions [first, last) of window `w`.
  uint64_t WindowOf(uint64_t position) const;
  uint64_t WindowBegin(uint64_t w) const;
  uint64_t WindowEnd(uint64_t w) const;
  uint64_t num_windows() const { return windows_; }
  // The block of a sample, for grouping decodes.
  uint64_t BlockOf(uint64_t sample) const {
    return options_.blocks ? options_.blocks->BlockOf(sample) : sample / options_.block_steps;
  }

 private:
  // Version 2: the samples of window w's block slots, as prefix sums of their sizes in slot
  // order (built on first use, a few windows kept: lookups walk windows in order).
  std::shared_ptr<const std::vector<uint64_t>> SlotPrefix(uint64_t w) const;
  uint64_t SampleAtV2(uint64_t position) const;
  uint64_t SampleAtBucketed(uint64_t position) const;

  uint64_t n_;
  uint64_t key_;
  OrderOptions options_;
  std::vector<uint64_t> window_begin_;  // version 2: first position of each window, then n
  mutable absl::Mutex cache_mu_;
  mutable std::list<std::pair<uint64_t, std::shared_ptr<const std::vector<uint64_t>>>> prefix_cache_
      ABSL_GUARDED_BY(cache_mu_);
  uint64_t full_blocks_;   // n / block_steps
  uint64_t tail_;          // n % block_steps
  uint64_t windows_;       // windows of full blocks (the tail joins the last); >= 1 when n > 0
  uint64_t window_samples_;  // block_steps * window_blocks
  KeyedPermutation blocks_;
  std::vector<uint64_t> group_prefix_;  // buckets: groups of the buckets before each, then all
};

}  // namespace conveyor
