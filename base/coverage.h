// The coverage ledger (docs/pipeline.md "Coverage ledger"): per epoch and consumer slice, how many
// samples were delivered and an order-independent digest of their ids, so that an audit can prove
// that every sample of an epoch reached exactly one rank exactly once, or say which slices did
// not. A server keeps one per job for what it sent, the client one for what it received; both
// compare with the digest the order itself gives (conveyor audit).
//
// The digest is the sum (mod 2^64) of CoverageHash over the ids: order-independent, additive (the
// slices of a global batch add up to the batch's digest, servers' ledgers add up), and a sample
// delivered twice counts twice. Not thread-safe: its owner locks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>
#include <vector>

#include "base/mix.h"
#include "base/types.h"

namespace conveyor {

// A sample's contribution to a digest: (mixture member, dataset sample index) mixed.
inline uint64_t CoverageHash(const SampleId& id) {
  return Mix64(Mix64(static_cast<uint64_t>(id.dataset) + 0x636f7665ull) ^ id.index);
}

// What one consumer slice (consumer i of n at global batch size B) of one epoch delivered.
struct CoverageSlice {
  uint64_t epoch = 0;
  uint32_t consumer = 0;
  uint32_t consumers = 1;
  uint64_t global_batch_size = 0;
  uint64_t samples = 0;
  uint64_t digest = 0;          // sum of CoverageHash
  uint64_t first_position = 0;  // the first batch's sample position in the epoch
  uint64_t end_position = 0;    // after the last batch: its position + global_batch_size
  uint64_t batches = 0;
  auto Key() const { return std::make_tuple(epoch, global_batch_size, consumers, consumer); }
};

class CoverageLedger {
 public:
  // Keeps the slices of at most this many epochs (the latest); older ones are dropped.
  static constexpr size_t kMaxEpochs = 16;

  // One batch of slice (consumer, consumers) at `global_batch_size`, at `cursor` (its position
  // set; a cursor without one, from an old server, is counted at step x global_batch_size).
  void Add(const Cursor& cursor, uint32_t consumer, uint32_t consumers, uint64_t global_batch_size,
           std::span<const SampleId> ids) {
    uint64_t position = 0;
    if (!cursor.PositionAt(global_batch_size, &position)) position = 0;
    CoverageSlice& s = slices_[std::make_tuple(cursor.epoch, global_batch_size, consumers, consumer)];
    if (s.batches == 0) {
      s.epoch = cursor.epoch;
      s.consumer = consumer;
      s.consumers = consumers;
      s.global_batch_size = global_batch_size;
      s.first_position = position;
    }
    s.first_position = std::min(s.first_position, position);
    s.end_position = std::max(s.end_position, position + global_batch_size);
    ++s.batches;
    s.samples += ids.size();
    for (const SampleId& id : ids) s.digest += CoverageHash(id);
    while (!slices_.empty() && std::get<0>(slices_.rbegin()->first) >= kMaxEpochs &&
           std::get<0>(slices_.begin()->first) <= std::get<0>(slices_.rbegin()->first) - kMaxEpochs) {
      slices_.erase(slices_.begin());
    }
  }

  // By (epoch, global batch size, consumers, consumer).
  std::vector<CoverageSlice> Slices() const {
    std::vector<CoverageSlice> out;
    out.reserve(slices_.size());
    for (const auto& [key, s] : slices_) out.push_back(s);
    return out;
  }

 private:
  std::map<std::tuple<uint64_t, uint64_t, uint32_t, uint32_t>, CoverageSlice> slices_;
};

}  // namespace conveyor
