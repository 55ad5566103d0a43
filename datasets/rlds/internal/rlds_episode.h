// One RLDS episode record parsed (tf.train.Example) and checked against features.json, and the
// byte-bounded cache of parsed episodes the dataset reads from (datasets/rlds/rlds_dataset.h).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "datasets/dataset.h"
#include "datasets/rlds/rlds_features.h"
#include "format/format_fwd.h"
#include "tensorflow/example.pb.h"

namespace conveyor::rlds {

// The record's feature `f`, checked: present, of the list kind its dtype needs, and (per step)
// holding a whole number of steps. Sets *steps (per-step features) and returns the feature.
absl::StatusOr<const tensorflow::Feature*> FindFeature(const tensorflow::Example& ex,
                                                       const FeatureSpec& f, uint64_t* steps,
                                                       const std::string& where);

// Parses a record's data and checks every feature of `features`: all present, per-step ones with
// one step count (an error names the features that disagree). Returns the step count.
absl::StatusOr<uint64_t> CheckRecord(std::string_view data, const std::vector<FeatureSpec>& features,
                                     const std::string& where, tensorflow::Example* out);

// A parsed episode: its record, the index LoadEpisode hands out, per manifest stream its feature.
struct ParsedEpisode {
  tensorflow::Example example;
  std::shared_ptr<const format::v1::EpisodeIndex> index;
  std::vector<const tensorflow::Feature*> features;  // per manifest stream; null for none
  uint64_t bytes = 0;                                // the record's bytes
};

// Parsed episodes kept up to `capacity` bytes of records, least recently used evicted first. One
// load per episode at a time: concurrent Get()s of an episode wait for the first one's load.
class EpisodeCache {
 public:
  using Loader = std::function<absl::StatusOr<std::unique_ptr<ParsedEpisode>>()>;
  EpisodeCache(uint64_t capacity, size_t episodes) : capacity_(capacity), seen_(episodes, false) {}

  absl::StatusOr<std::shared_ptr<const ParsedEpisode>> Get(size_t episode, const Loader& load);
  EpisodeReadStats stats() const;
  // Raises the capacity to `bytes` (never lowers it).
  void Reserve(uint64_t bytes);
  // Forgets every episode and zeroes the counters.
  void Clear();

 private:
  struct Slot {
    absl::Mutex mu;
    std::shared_ptr<const ParsedEpisode> value ABSL_GUARDED_BY(mu);
  };
  void Admit(size_t episode, const std::shared_ptr<Slot>& slot, uint64_t bytes);

  mutable absl::Mutex mu_;

  uint64_t capacity_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<size_t, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  std::list<std::pair<size_t, uint64_t>> lru_ ABSL_GUARDED_BY(mu_);  // loaded: (episode, bytes)
  std::unordered_map<size_t, std::list<std::pair<size_t, uint64_t>>::iterator> pos_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> seen_ ABSL_GUARDED_BY(mu_);
  EpisodeReadStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::rlds
