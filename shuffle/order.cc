#include "shuffle/order.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/mix.h"
#include "base/types.h"
#include "shuffle/buckets.h"

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

BlockTable::BlockTable(std::vector<uint64_t> episode_starts, GopBlocks gop)
    : starts_(std::move(episode_starts)), gop_(gop) {
  if (!(gop_.frames_per_step > 0)) gop_.frames_per_step = 1;
  gop_.span_frames = std::max<uint64_t>(gop_.span_frames, 1);
  if (starts_.empty()) starts_.push_back(0);
  first_block_.reserve(starts_.size());
  uint64_t blocks = 0;
  for (size_t e = 0; e + 1 < starts_.size(); ++e) {
    first_block_.push_back(blocks);
    const uint64_t n = starts_[e + 1] - starts_[e];
    if (n == 0) continue;
    const uint64_t local = LocalBlock(n - 1) + 1;
    blocks += local;
    // Block 0 (which also holds the frames before back_frames) is the longest of an episode.
    max_block_ = std::max(max_block_, local > 1 ? std::min(n, FirstStep(1)) : n);
  }
  first_block_.push_back(blocks);
  // Any later block: span_frames frames, each shown by at most ceil(1 / frames_per_step) steps.
  max_block_ = std::max<uint64_t>(
      max_block_, static_cast<uint64_t>(std::ceil(static_cast<double>(gop_.span_frames) / gop_.frames_per_step)) + 1);
}

uint64_t BlockTable::Frame(uint64_t step) const {
  return static_cast<uint64_t>(std::floor(static_cast<double>(step) * gop_.frames_per_step + 0.5));
}

uint64_t BlockTable::LocalBlock(uint64_t step) const {
  const uint64_t f = Frame(step);
  return f < gop_.back_frames ? 0 : (f - gop_.back_frames) / gop_.span_frames;
}

uint64_t BlockTable::FirstStep(uint64_t local_block) const {
  if (local_block == 0) return 0;
  // The smallest step with Frame(step) >= target; Frame is non-decreasing. Start from the
  // arithmetic guess, then settle by Frame itself, so the answer agrees with LocalBlock exactly.
  const uint64_t target = gop_.back_frames + local_block * gop_.span_frames;
  const double guess = std::ceil((static_cast<double>(target) - 0.5) / gop_.frames_per_step);
  uint64_t s = guess > 0 ? static_cast<uint64_t>(guess) : 0;
  while (s > 0 && Frame(s - 1) >= target) --s;
  while (Frame(s) < target) ++s;
  return s;
}

uint64_t BlockTable::BlockOf(uint64_t sample) const {
  // The episode: the last start <= sample among non-empty episodes.
  const auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, sample);
  const size_t e = static_cast<size_t>(it - starts_.begin()) - 1;
  return first_block_[e] + LocalBlock(sample - starts_[e]);
}

uint64_t BlockTable::BlockBegin(uint64_t block) const {
  const auto it = std::upper_bound(first_block_.begin(), first_block_.end() - 1, block);
  size_t e = static_cast<size_t>(it - first_block_.begin()) - 1;
  const uint64_t n = starts_[e + 1] - starts_[e];
  return starts_[e] + std::min(n, FirstStep(block - first_block_[e]));
}

uint64_t BlockTable::BlockEnd(uint64_t block) const {
  const auto it = std::upper_bound(first_block_.begin(), first_block_.end() - 1, block);
  size_t e = static_cast<size_t>(it - first_block_.begin()) - 1;
  const uint64_t n = starts_[e + 1] - starts_[e];
  const uint64_t local = block - first_block_[e];
  return starts_[e] + (block + 1 == first_block_[e + 1] ? n : std::min(n, FirstStep(local + 1)));
}

EpochOrder::EpochOrder(uint64_t num_samples, uint64_t key, uint64_t epoch, OrderOptions options)
    : n_(num_samples), key_(Mix64(key ^ Mix64(epoch + 0x5851f42d4c957f2dull))), options_(options) {
  if (options_.buckets) {
    // shuffle/buckets.h: each bucket's whole groups, the groups of all buckets permuted together.
    const BucketTable& t = *options_.buckets;
    const uint64_t g = std::max<uint64_t>(1, options_.bucket_group);
    options_.bucket_group = g;
    options_.block_steps = options_.window_blocks = 1;
    group_prefix_.reserve(t.num_buckets() + 1);
    uint64_t groups = 0;
    for (size_t b = 0; b < t.num_buckets(); ++b) {
      group_prefix_.push_back(groups);
      groups += t.BucketSamples(b) / g;
    }
    group_prefix_.push_back(groups);
    n_ = groups * g;
    full_blocks_ = n_;
    tail_ = 0;
    window_samples_ = 1;
    windows_ = n_;
    blocks_ = KeyedPermutation(groups, Mix64(key_ ^ 0x6275636b6574ull));
    return;
  }
  if (options_.blocks) {
    // Version 2: every block (an episode's last, shorter one too) is permuted; windows are
    // window_blocks consecutive permuted blocks; their first positions are summed once per epoch.
    options_.window_blocks = std::max<uint64_t>(1, options_.window_blocks);
    const BlockTable& t = *options_.blocks;
    n_ = t.num_samples();
    full_blocks_ = t.num_blocks();
    tail_ = 0;
    blocks_ = KeyedPermutation(full_blocks_, Mix64(key_ ^ 0x6f7032b10cb10cull));
    windows_ = full_blocks_ / options_.window_blocks + (full_blocks_ % options_.window_blocks ? 1 : 0);
    window_begin_.reserve(windows_ + 1);
    uint64_t at = 0;
    for (uint64_t slot = 0; slot < full_blocks_; ++slot) {
      if (slot % options_.window_blocks == 0) window_begin_.push_back(at);
      at += t.BlockSize(blocks_(slot));
    }
    window_begin_.push_back(at);
    if (windows_ == 0) {  // no samples at all
      windows_ = 1;
      window_begin_.push_back(at);
    }
    window_samples_ = 0;
    return;
  }
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
  if (options_.blocks) {
    // The last window whose first position is <= position (an empty window shares its start
    // with the next and is skipped).
    const auto it = std::upper_bound(window_begin_.begin(), window_begin_.begin() + windows_, position);
    return static_cast<uint64_t>(it - window_begin_.begin()) - 1;
  }
  return std::min(position / window_samples_, windows_ - 1);
}

uint64_t EpochOrder::WindowBegin(uint64_t w) const {
  return options_.blocks ? window_begin_[w] : w * window_samples_;
}

uint64_t EpochOrder::WindowEnd(uint64_t w) const {
  if (options_.blocks) return window_begin_[w + 1];
  return w + 1 >= windows_ ? n_ : (w + 1) * window_samples_;
}

std::shared_ptr<const std::vector<uint64_t>> EpochOrder::SlotPrefix(uint64_t w) const {
  constexpr size_t kKept = 4;
  absl::MutexLock l(&cache_mu_);
  for (auto it = prefix_cache_.begin(); it != prefix_cache_.end(); ++it) {
    if (it->first == w) {
      prefix_cache_.splice(prefix_cache_.begin(), prefix_cache_, it);
      return it->second;
    }
  }
  auto prefix = std::make_shared<std::vector<uint64_t>>();
  const uint64_t first = w * options_.window_blocks;
  const uint64_t last = std::min(full_blocks_, first + options_.window_blocks);
  prefix->reserve(last - first + 1);
  uint64_t at = 0;
  for (uint64_t slot = first; slot < last; ++slot) {
    prefix->push_back(at);
    at += options_.blocks->BlockSize(blocks_(slot));
  }
  prefix->push_back(at);
  prefix_cache_.emplace_front(w, prefix);
  if (prefix_cache_.size() > kKept) prefix_cache_.pop_back();
  return prefix;
}

uint64_t EpochOrder::SampleAtV2(uint64_t position) const {
  const uint64_t w = WindowOf(position);
  const uint64_t begin = window_begin_[w];
  const uint64_t count = window_begin_[w + 1] - begin;
  const KeyedPermutation within(count, Mix64(key_ ^ Mix64(w + 0x77696e646f77ull)));
  const uint64_t x = within(position - begin);
  const std::shared_ptr<const std::vector<uint64_t>> prefix = SlotPrefix(w);
  // The slot holding offset x: the last prefix <= x (empty blocks share their start; skip them).
  const auto it = std::upper_bound(prefix->begin(), prefix->end() - 1, x);
  const uint64_t j = static_cast<uint64_t>(it - prefix->begin()) - 1;
  const uint64_t block = blocks_(w * options_.window_blocks + j);
  return options_.blocks->BlockBegin(block) + (x - (*prefix)[j]);
}

uint64_t EpochOrder::SampleAtBucketed(uint64_t position) const {
  const uint64_t g = options_.bucket_group;
  const uint64_t group = blocks_(position / g);
  // The bucket holding the group: the last whose first group is <= it (buckets without a whole
  // group share their start with the next and are skipped).
  const auto it = std::upper_bound(group_prefix_.begin(), group_prefix_.end() - 1, group);
  const size_t b = static_cast<size_t>(it - group_prefix_.begin()) - 1;
  const uint64_t j = group - group_prefix_[b];
  const KeyedPermutation within(options_.buckets->BucketSamples(b),
                                Mix64(key_ ^ Mix64(b + 0x62756b7065726dull)));
  return options_.buckets->SampleOf(b, within(j * g + position % g));
}

uint64_t EpochOrder::SampleAt(uint64_t position) const {
  if (options_.buckets) return SampleAtBucketed(position);
  if (options_.blocks) return SampleAtV2(position);
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
