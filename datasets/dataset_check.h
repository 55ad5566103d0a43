// The dataset doctor behind `conveyor check` (docs/check.md): reads a dataset the way training
// would, episode by episode, and reports every place where the videos, the data rows and the
// metadata disagree, instead of failing at the first one as the readers do.
//
// For every dataset format (through the Dataset interface):
//   - each episode's index loads (the readers' own fail-closed checks: checksums, lengths);
//   - per VIDEO stream: presentation timestamps strictly increasing, no jump over a frame, the
//     measured frame rate against the manifest's, the video's duration against the episode's;
//   - the first and last packet of every stream are read and checked; with `decode_ends`, the
//     first and last frame of every video are decoded.
// For LeRobot v3.0 and v2.1 read in place, also (from meta/, the data parquets and the mp4s):
//   - per data file: rows that belong to no episode of the episode table (orphaned rows), per
//     episode its rows against its length, frame_index 0..n-1, index dataset_from_index + i,
//     timestamp = frame_index / fps within the tolerance;
//   - per episode and camera: the mp4 exists and demuxes, the frames in the episode's
//     [from_timestamp, to_timestamp) against its length, every frame's time against its row's,
//     the file's frame rate against info.json's fps.
//
// Severity: an ERROR is what makes the loader fail or deliver something else than the metadata
// promises for that episode (it would be skipped under `on_error: skip`, or fail the job); a
// WARNING is a dataset that loads but looks wrong (orphaned rows, a jump in a video's timestamps,
// a frame rate or duration that disagrees with the metadata).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "datasets/dataset.h"

namespace conveyor {

enum class CheckSeverity { kWarning, kError };

// One thing the doctor found.
struct CheckFinding {
  CheckSeverity severity = CheckSeverity::kError;
  std::string dataset;   // the mixture member's name; empty for a dataset checked alone
  int64_t episode = -1;  // the episode's position in the dataset; -1: not one episode's
  std::string stream;    // the stream (camera) it concerns; empty when none
  std::string file;      // the file it concerns, full path or URL; empty when none
  std::string what;      // a stable short name: "video_missing", "frame_count", ... (docs/check.md)
  std::string detail;    // the numbers, in words
};

struct CheckOptions {
  // Check only the first `max_episodes` episodes (0: all). Orphaned rows are looked for in the
  // data files these episodes name.
  int64_t max_episodes = 0;
  // Decode the first and last frame of every video of every checked episode (the slow part:
  // one GOP each). Off: a quick check of the indexes, files and metadata.
  bool decode_ends = true;
  // LeRobot: allowed distance in seconds between a row's timestamp and frame_index / fps, and a
  // video frame and its row (LeRobot's own tolerance_s, the reader's default).
  double tolerance_s = 1e-4;
};

struct CheckReport {
  std::string uri;
  std::string format;           // Dataset::format(); empty when it did not open
  std::string fingerprint;      // the manifest's
  uint64_t episodes = 0;        // in the dataset
  uint64_t episodes_checked = 0;
  std::vector<CheckFinding> findings;

  size_t errors() const;
  size_t warnings() const;
  // Positions of the episodes with at least one error (what a quarantine file lists).
  std::set<int64_t> EpisodesWithErrors() const;
};

// Checks `dataset`. Never fails: what cannot be read is a finding. Slow with decode_ends; reads
// the data files and demuxes the videos of LeRobot datasets (no packet index cache).
CheckReport CheckDataset(const Dataset& dataset, const CheckOptions& options);

// The report of a dataset that did not open: one error naming it, with the reader's message.
CheckReport OpenFailureReport(const std::string& uri, const absl::Status& status);

std::string CheckSeverityName(CheckSeverity severity);  // "error", "warning"

}  // namespace conveyor
