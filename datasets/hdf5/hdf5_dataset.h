// HDF5 robot episodes read in place (docs/hdf5.md): ALOHA / ACT / Mobile ALOHA directories of
// episode_N.hdf5 files, robomimic / LIBERO / robosuite / MimicGen files of data/demo_N groups, and
// any other layout through a mapping file (#mapping=map.yaml), locally, over HTTP or from S3.
//
// Streams are named like LeRobot's keys (observation.images.cam_high, observation.state, action)
// and ordered by kind (IMAGE, LOWDIM, TEXT), then name. A raw uint8 [T, H, W, 3] image array is
// served one binary PPM per frame (codec "ppm", rgb24; grey [T, H, W] as PGM), JPEG rows as they
// are (codec "mjpeg"). Lowdim float32 is copied bit for bit; other numbers are converted to
// float32 (inexact values counted and warned about once per stream). Step k is at k / rate s.
//
// Opening reads each file's metadata through libhdf5 (the episode table: every stream's first
// dimension, checked). Loading an episode indexes its datasets' raw storage once (offsets, chunks,
// filters); frames and rows are then read by byte offset through Storage, chunks inflated here,
// so the workers never wait on libhdf5's global lock. Indexed episodes are kept as sidecars in the
// index cache (hdf5_sidecar.h), so the next open skips libhdf5 for them.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "storage/storage.h"

namespace conveyor::hdf5 {

// Whether the root holds HDF5 episodes: a local .hdf5/.h5 file or a directory holding one, or
// (any storage) episode_0.hdf5 or a file list hdf5_files.txt.
bool LooksLikeHdf5(Storage& storage);

// Location options taken: rate (steps/s; default 50 for ALOHA, 20 for robomimic, the mapping's
// rate), mapping (a YAML or JSON mapping file: a path relative to the location, else a local
// path), filter (robomimic: only the demos listed in mask/<filter>), chunk_cache_mb (inflated
// multi-frame chunks kept, default 256), index_cache (the sidecars' directory, "none": none).
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri, LocationOptions& options);

}  // namespace conveyor::hdf5
