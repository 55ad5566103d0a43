#include "shuffle/quality.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>
#include <vector>

namespace conveyor {

ShuffleQuality MeasureShuffle(const EpochOrder& order, const SampleIndex& index, uint64_t epoch,
                              uint64_t batch, uint64_t max_positions) {
  ShuffleQuality q;
  const uint64_t n = order.size();
  const uint64_t m = std::min(n, max_positions);
  q.positions = m;
  if (m == 0 || index.size() == 0) return q;
  // Episode sizes (in samples) for the expectations.
  std::vector<double> share;
  for (uint64_t e = 0; e < index.num_episodes(); ++e) {
    share.push_back(static_cast<double>(index.EpisodeSamples(e)) / static_cast<double>(index.size()));
  }
  for (double s : share) q.same_episode_expected += s * s;
  // Expected distinct episodes among `batch` draws without replacement ~ sum 1 - (1 - s)^batch.
  const double b = static_cast<double>(std::min(batch, n));
  for (double s : share) q.episodes_per_batch_expected += 1 - std::pow(1 - s, b);

  uint64_t same = 0, pairs = 0, gap_sum = 0;
  uint64_t batches = 0, distinct_sum = 0;
  std::unordered_set<uint64_t> episodes;
  SampleIndex::Location prev{};
  for (uint64_t p = 0; p < m; ++p) {
    const SampleIndex::Location loc = index.Locate(order.SampleAt(p), epoch);
    if (p > 0) {
      ++pairs;
      if (loc.episode == prev.episode) {
        ++same;
        gap_sum += loc.step > prev.step ? loc.step - prev.step : prev.step - loc.step;
      }
    }
    episodes.insert(loc.episode);
    if ((p + 1) % batch == 0) {
      ++batches;
      distinct_sum += episodes.size();
      episodes.clear();
    }
    prev = loc;
  }
  q.same_episode_adjacent = pairs ? static_cast<double>(same) / pairs : 0;
  q.mean_abs_step_gap = same ? static_cast<double>(gap_sum) / same : 0;
  q.episodes_per_batch = batches ? static_cast<double>(distinct_sum) / batches : 0;
  return q;
}

}  // namespace conveyor
