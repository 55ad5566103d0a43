// Shuffle quality of an epoch order, measured on the order itself (no decoding): how often
// consecutive samples come from the same episode, and how many episodes a global batch mixes,
// each beside what a uniformly random permutation gives. See docs/pipeline.md.
#pragma once

#include <cstdint>

#include "datasets/sample_index.h"
#include "shuffle/order.h"

namespace conveyor {

struct ShuffleQuality {
  uint64_t positions = 0;              // positions measured
  double same_episode_adjacent = 0;    // P(positions p and p+1 share an episode)
  double same_episode_expected = 0;    // the same for a uniform random permutation: sum (n_e/N)^2
  double episodes_per_batch = 0;       // mean distinct episodes per global batch
  double episodes_per_batch_expected = 0;  // expectation under a uniform permutation
  double mean_abs_step_gap = 0;        // mean |step difference| of same-episode neighbours
};

// Measures positions [0, min(order.size(), max_positions)) of `order` (of `epoch`: clips move
// from epoch to epoch), cut into batches of `batch` positions.
ShuffleQuality MeasureShuffle(const EpochOrder& order, const SampleIndex& index, uint64_t epoch,
                              uint64_t batch, uint64_t max_positions);

}  // namespace conveyor
