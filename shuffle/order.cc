#include "shuffle/order.h"

#include <algorithm>
#include <limits>

#include "base/mix.h"
#include "base/types.h"

namespace conveyor {

KeyedPermutation::KeyedPermutation(uint64_t n, uint64_t key) : n_(n) {
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = key;
  for (int r = 0; r < kRounds; ++r) {
    k = Mix64(k + static_cast<uint64_t>(r) * 0x632be59bd9b4e019ull);
    keys_[r] = k;
  }
}

uint64_t KeyedPermutation::Round(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = Mix64(right ^ keys_[r]) & half_mask_;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t KeyedPermutation::operator()(uint64_t i) const {
  if (n_ <= 1) return i;
  uint64_t x = Round(i);
  while (x >= n_) x = Round(x);  // cycle walking: stays a bijection on [0, n)
  return x;
}

uint64_t OrderKey(std::string_view fingerprint, uint64_t seed) {
  uint64_t h = 0x436f6e7665796f72ull;  // "Conveyor"
  for (unsigned char c : fingerprint) h = Mix64(h ^ c);
  return Mix64(h ^ Mix64(seed));
}

EpochOrder::EpochOrder(uint64_t num_samples, uint64_t key, uint64_t epoch, OrderOptions options)
    : n_(num_samples), key_(Mix64(key ^ Mix64(epoch + 0x5851f42d4c957f2dull))), options_(options) {
  options_.block_steps = std::max<uint64_t>(1, options_.block_steps);
  options_.window_blocks = std::max<uint64_t>(1, options_.window_blocks);
  full_blocks_ = n_ / options_.block_steps;
  tail_ = n_ % options_.block_steps;
  // Saturates rather than wraps: a window larger than the epoch is the whole epoch.
  if (!CheckedMul(options_.block_steps, options_.window_blocks, &window_samples_)) {
    window_samples_ = std::numeric_limits<uint64_t>::max();
  }
  windows_ = full_blocks_ / options_.window_blocks + (full_blocks_ % options_.window_blocks ? 1 : 0);
  if (windows_ == 0 && n_ > 0) windows_ = 1;  // only the tail
  blocks_ = KeyedPermutation(full_blocks_, Mix64(key_ ^ 0xb10cb10cb10cb10cull));
}

uint64_t EpochOrder::WindowOf(uint64_t position) const {
  return std::min(position / window_samples_, windows_ - 1);
}

uint64_t EpochOrder::WindowBegin(uint64_t w) const { return w * window_samples_; }

uint64_t EpochOrder::WindowEnd(uint64_t w) const {
  return w + 1 >= windows_ ? n_ : (w + 1) * window_samples_;
}

uint64_t EpochOrder::SampleAt(uint64_t position) const {
  if (options_.naive()) return blocks_(position);
  const uint64_t w = WindowOf(position);
  const uint64_t begin = WindowBegin(w);
  const uint64_t count = WindowEnd(w) - begin;
  const KeyedPermutation within(count, Mix64(key_ ^ Mix64(w + 0x77696e646f77ull)));
  const uint64_t x = within(position - begin);
  const uint64_t j = x / options_.block_steps;  // block slot within the window
  const uint64_t r = x % options_.block_steps;
  const uint64_t slot = w * options_.window_blocks + j;
  if (slot < full_blocks_ && j < options_.window_blocks) {
    return blocks_(slot) * options_.block_steps + r;
  }
  // Past the window's full blocks: the tail.
  const uint64_t full_in_window = std::min(options_.window_blocks, full_blocks_ - w * options_.window_blocks);
  const uint64_t tail_offset = x - full_in_window * options_.block_steps;
  return full_blocks_ * options_.block_steps + tail_offset;
}

}  // namespace conveyor
