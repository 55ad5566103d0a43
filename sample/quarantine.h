// Quarantine: episodes left out of training because `conveyor check` (docs/check.md) found errors
// in them. `conveyor check DATASET --write-quarantine FILE` writes the file; a config's
// `quarantine: FILE` makes the pipeline leave those episodes out of the order (they get no
// samples), counted in PipelineStats, `conveyor batches --stats`, the server's metrics and a log
// line naming the file. Never silent: a file that is missing, unreadable, or written for another
// dataset (its fingerprint) is an error.
//
// The file (JSON):
//   {"written_by": "conveyor check", "datasets": [
//     {"name": "", "uri": "/data/aloha", "fingerprint": "...",
//      "episodes": [{"episode": 1, "reason": "video_missing: ...mp4: ..."}]}]}
// one entry per dataset checked (a mixture's members by name), episodes by position.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sample/sample_spec.h"
#include "datasets/dataset.h"

namespace conveyor {

struct QuarantinedDataset {
  std::string name;         // the mixture member's name; empty for a dataset checked alone
  std::string uri;          // where it was checked, for messages
  std::string fingerprint;  // the manifest's: what the entry applies to
  std::map<uint64_t, std::string> episodes;  // position -> the first error found in it
};

struct Quarantine {
  std::vector<QuarantinedDataset> datasets;
};

absl::Status WriteQuarantineFile(const std::string& path, const Quarantine& quarantine);
absl::StatusOr<Quarantine> ReadQuarantineFile(const std::string& path);

// The episodes of `dataset` that the file at `path` quarantines: its entry with the dataset's
// fingerprint (among several, the one checked at the dataset's uri). An error when the file holds
// no entry with the dataset's fingerprint (it was checked as another dataset, or changed since),
// naming both, or lists an episode the dataset does not have.
absl::StatusOr<std::set<uint64_t>> QuarantinedEpisodes(const std::string& path,
                                                       const Dataset& dataset);

// The config's quarantine for `dataset`: none when `spec.quarantine` is empty.
absl::StatusOr<std::set<uint64_t>> QuarantinedEpisodes(const SampleSpec& spec,
                                                       const Dataset& dataset);

// The `quarantine:` key of the config file at `path`, if it has one (for `conveyor check
// --config`).
absl::StatusOr<std::optional<std::string>> QuarantinePathOfConfig(const std::string& path);

}  // namespace conveyor
