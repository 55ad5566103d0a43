// The mixture schedule: which dataset fills each position of a global batch, as a pure function
// of (weights, global batch size, steps per epoch, seed, epoch, step). See docs/mixtures.md.
//
// Weights are exact in every batch: member k gets floor(B * w_k) or ceil(B * w_k) of the B
// positions of every global batch (w normalized to sum 1). Which members get the extra positions
// is decided by systematic sampling along a low-discrepancy sequence (u_s = frac(s / phi + key)),
// so over any stretch of steps each member's count stays within a few samples of its share. The
// per-step counts are the same in every epoch, so a member's samples before (epoch, step) are
// epoch * per_epoch[k] + the counts of the steps before `step`; the positions inside a batch are
// permuted by a keyed permutation of (seed, epoch, step), so consumers' slices mix members too.
//
// Integer arithmetic throughout (shares in units of 2^-32 of a position): the same bits on every
// machine.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "shuffle/order.h"

namespace conveyor {

class MixtureSchedule {
 public:
  // INVALID_ARGUMENT for no member, a weight that is not finite and > 0, or batch == 0.
  static absl::StatusOr<MixtureSchedule> Create(const std::vector<double>& weights, uint64_t batch,
                                                uint64_t steps_per_epoch, uint64_t key);

  size_t members() const { return base_.size(); }
  uint64_t batch() const { return batch_; }
  uint64_t steps_per_epoch() const { return steps_; }
  // The share of member k in units of 2^-32 positions per batch (sums to batch * 2^32).
  uint64_t quota(size_t k) const { return quota_[k]; }

  // Positions of member k in global batch `step` (any epoch), for every k: out->size() == members.
  void Counts(uint64_t step, std::vector<uint32_t>* out) const;
  // Samples of member k in one whole epoch.
  const std::vector<uint64_t>& per_epoch() const { return per_epoch_; }
  // Samples each member delivered before global batch (epoch, step). O(step * members).
  std::vector<uint64_t> Before(uint64_t epoch, uint64_t step) const;

  // One global batch: which member fills position p (0 <= p < batch) and that sample's rank
  // among the member's samples of the batch (0 .. counts[k]-1).
  class Step {
   public:
    Step() = default;
    uint32_t member(uint64_t position) const;
    uint32_t rank(uint64_t position) const;
    const std::vector<uint32_t>& counts() const { return counts_; }

   private:
    friend class MixtureSchedule;
    uint64_t Slot(uint64_t position) const { return identity_ ? position : perm_(position); }
    std::vector<uint32_t> counts_;
    std::vector<uint64_t> offsets_;  // first slot of each member
    KeyedPermutation perm_;
    bool identity_ = true;
  };
  Step At(uint64_t epoch, uint64_t step) const;

 private:
  uint64_t batch_ = 0, steps_ = 0, key_ = 0;
  std::vector<uint64_t> quota_;     // per member, units of 2^-32
  std::vector<uint32_t> base_;      // floor(quota / 2^32)
  std::vector<int64_t> frac_end_;   // cumulative fractional parts, units of 2^-32
  std::vector<uint64_t> per_epoch_;
};

}  // namespace conveyor
