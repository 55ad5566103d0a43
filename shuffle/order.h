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
// window (shuffled within it).
#pragma once

#include <cstdint>
#include <string_view>

namespace conveyor {

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

struct OrderOptions {
  uint64_t block_steps = 1;    // samples per block (1: naive)
  uint64_t window_blocks = 1;  // blocks per window (1: naive)
  bool naive() const { return block_steps <= 1 && window_blocks <= 1; }
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
  // The block of a sample (sample / block_steps), for grouping decodes.
  uint64_t BlockOf(uint64_t sample) const { return sample / options_.block_steps; }

 private:
  uint64_t n_;
  uint64_t key_;
  OrderOptions options_;
  uint64_t full_blocks_;   // n / block_steps
  uint64_t tail_;          // n % block_steps
  uint64_t windows_;       // windows of full blocks (the tail joins the last); >= 1 when n > 0
  uint64_t window_samples_;  // block_steps * window_blocks
  KeyedPermutation blocks_;
};

}  // namespace conveyor
