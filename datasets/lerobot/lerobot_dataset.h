// A LeRobot dataset (v3.0, v2.1/v2.0) read in place through the Dataset interface: the Parquet
// tables and the mp4 files exactly as LeRobot wrote them, locally, over HTTP or from S3.
//
// Streams are LeRobot's feature keys: each video feature a VIDEO stream, each embedded image
// feature an IMAGE stream, each numeric feature a LOWDIM stream, and the episode's task the
// `instruction` TEXT stream. LeRobot's index columns (timestamp, frame_index, episode_index,
// index, task_index) check the data and are not streams. Streams are ordered by kind, then name,
// as `conveyor import` orders them, so a dataset read in place and its import give the same
// batches.
//
// Opening reads meta/ only. An episode's data parquet is read (its needed columns, once, then
// kept: memory grows with the tables) when one of its episodes is first loaded; each mp4 is
// demuxed once into a packet index (offsets, sizes, XXH3 of every packet) that is kept in memory
// and as a sidecar file in the index cache, keyed by the file's name, size and mtime or ETag, so
// the next open of the same files needs no demuxing. A packet read is one range read of the mp4,
// checked against that XXH3. Episode indexes built from them are kept up to 256 MiB in all
// (beyond that an episode is re-cut when loaded), so memory stays bounded for any dataset size.
//
// Frame addressing: a camera's episode is the run of frames whose presentation times lie in
// [from_timestamp, to_timestamp), each end rounded to the nearest frame; its length must equal
// the episode's row count and every frame must sit within `tolerance_s` of its row's timestamp.
// Anything else fails closed with an error naming episode, camera and file.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "storage/storage.h"

namespace conveyor::lerobot {

struct DatasetOptions {
  // Allowed distance between a row's timestamp and frame_index / fps, and between a video frame
  // and its row, in seconds (LeRobot's own tolerance_s).
  double tolerance_s = 1e-4;
  // Where packet indexes of mp4 files are kept between opens. Empty: $CONVEYOR_INDEX_CACHE_DIR,
  // else $CONVEYOR_CACHE_DIR/index, else $XDG_CACHE_HOME/conveyor/index, else
  // $HOME/.cache/conveyor/index. "none": in memory only.
  std::string index_cache_dir;
};

// `uri` names the dataset in messages (redacted). NOT_FOUND when the root holds no
// meta/info.json.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri,
                                                     const DatasetOptions& options = {});

// The index cache directory `options` resolve to ("" when there is none).
std::string IndexCacheDir(const DatasetOptions& options);

}  // namespace conveyor::lerobot
