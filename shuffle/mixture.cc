#include "shuffle/mixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/mix.h"
#include "base/strings.h"

namespace conveyor {

namespace {

constexpr int kFracBits = 32;
constexpr int64_t kUnit = int64_t{1} << kFracBits;
// 2^32 / golden ratio, odd: the additive recurrence u_s = s * kGolden mod 2^32 is the
// low-discrepancy (Kronecker) sequence with the best worst-case spacing.
constexpr uint64_t kGolden = 2654435769ull;

// ceil(a / b) for b > 0 and any sign of a.
int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

}  // namespace

absl::StatusOr<MixtureSchedule> MixtureSchedule::Create(const std::vector<double>& weights,
                                                        uint64_t batch, uint64_t steps_per_epoch,
                                                        uint64_t key) {
  if (weights.empty()) return absl::InvalidArgumentError("a mixture needs at least one dataset");
  if (batch == 0 || batch > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(StrCat("mixture batch size ", batch, " is out of range"));
  }
  long double total = 0;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!std::isfinite(weights[k]) || weights[k] <= 0) {
      return absl::InvalidArgumentError(
          StrCat("mixture weight ", weights[k], " of dataset ", k, " must be a finite number > 0"));
    }
    total += weights[k];
  }
  MixtureSchedule m;
  m.batch_ = batch;
  m.steps_ = steps_per_epoch;
  m.key_ = key;
  const size_t n = weights.size();
  // Largest remainder on the fixed-point shares so that they sum to exactly batch * 2^32.
  const long double scale = static_cast<long double>(batch) * static_cast<long double>(kUnit);
  std::vector<long double> exact(n);
  std::vector<uint64_t> q(n);
  uint64_t assigned = 0;
  for (size_t k = 0; k < n; ++k) {
    exact[k] = weights[k] / total * scale;
    q[k] = static_cast<uint64_t>(std::floor(exact[k]));
    assigned += q[k];
  }
  const uint64_t want = batch * static_cast<uint64_t>(kUnit);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return exact[a] - std::floor(exact[a]) > exact[b] - std::floor(exact[b]);
  });
  for (size_t i = 0; assigned < want; i = (i + 1) % n, ++assigned) ++q[order[i]];
  for (size_t k = 0; k < n; ++k) {
    // A share below one position per million batches would leave a dataset all but unused (and
    // make the walk to its next sample unbounded in practice).
    if (q[k] * 1000000 < static_cast<uint64_t>(kUnit)) {
      return absl::InvalidArgumentError(StrCat(
          "dataset ", k, " of the mixture gets ", static_cast<double>(q[k]) / kUnit,
          " positions per global batch of ", batch, ": raise its weight (at least one sample per "
          "million batches)"));
    }
  }
  m.quota_ = q;
  m.base_.resize(n);
  m.frac_end_.resize(n);
  int64_t cum = 0;
  for (size_t k = 0; k < n; ++k) {
    m.base_[k] = static_cast<uint32_t>(q[k] >> kFracBits);
    cum += static_cast<int64_t>(q[k] & (kUnit - 1));
    m.frac_end_[k] = cum;
  }
  m.per_epoch_.assign(n, 0);
  std::vector<uint32_t> c;
  for (uint64_t s = 0; s < steps_per_epoch; ++s) {
    m.Counts(s, &c);
    for (size_t k = 0; k < n; ++k) m.per_epoch_[k] += c[k];
  }
  return m;
}

void MixtureSchedule::Counts(uint64_t step, std::vector<uint32_t>* out) const {
  const size_t n = base_.size();
  out->resize(n);
  // Systematic sampling: the R extra positions of this step go to the members whose intervals
  // [frac_end[k-1], frac_end[k]) of [0, R * 2^32) hold one of the points u, u + 2^32, ...
  const int64_t u = static_cast<int64_t>((step * kGolden + (Mix64(key_) & (kUnit - 1))) & (kUnit - 1));
  int64_t prev = 0;
  for (size_t k = 0; k < n; ++k) {
    const int64_t extra = CeilDiv(frac_end_[k] - u, kUnit) - CeilDiv(prev - u, kUnit);
    (*out)[k] = base_[k] + static_cast<uint32_t>(extra);
    prev = frac_end_[k];
  }
}

std::vector<uint64_t> MixtureSchedule::Before(uint64_t epoch, uint64_t step) const {
  std::vector<uint64_t> out(per_epoch_.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = epoch * per_epoch_[k];
  std::vector<uint32_t> c;
  for (uint64_t s = 0; s < step; ++s) {
    Counts(s, &c);
    for (size_t k = 0; k < out.size(); ++k) out[k] += c[k];
  }
  return out;
}

MixtureSchedule::Step MixtureSchedule::At(uint64_t epoch, uint64_t step) const {
  Step s;
  Counts(step, &s.counts_);
  s.offsets_.resize(s.counts_.size());
  uint64_t o = 0;
  for (size_t k = 0; k < s.counts_.size(); ++k) {
    s.offsets_[k] = o;
    o += s.counts_[k];
  }
  // One dataset: positions in order (a single dataset's order is the plain epoch order).
  s.identity_ = s.counts_.size() == 1;
  if (!s.identity_) {
    s.perm_ = KeyedPermutation(batch_, Mix64(key_ ^ Mix64(epoch * 0x9e3779b97f4a7c15ull + step + 1)));
  }
  return s;
}

uint32_t MixtureSchedule::Step::member(uint64_t position) const {
  const uint64_t slot = Slot(position);
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), slot);
  return static_cast<uint32_t>(it - offsets_.begin() - 1);
}

uint32_t MixtureSchedule::Step::rank(uint64_t position) const {
  const uint64_t slot = Slot(position);
  return static_cast<uint32_t>(slot - offsets_[member(position)]);
}

}  // namespace conveyor
