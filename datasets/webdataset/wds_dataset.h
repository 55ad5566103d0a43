// WebDataset shards read in place (docs/webdataset.md): a folder of tar shards as video2dataset,
// img2dataset, Megatron-Energon and NVIDIA Cosmos-Curate write them, locally, over HTTP or from S3.
//
// Members are grouped by key (the path up to the first dot of the basename); one key is one
// sample, and one sample is one episode (a clip). Streams come from the members' extensions:
// mp4/m4v/mov/webm/mkv a VIDEO stream (demuxed from the member's byte range, never copied),
// jpg/jpeg/png/ppm an IMAGE, txt/text/caption a TEXT stream, json its top-level fields (numbers
// and arrays of numbers LOWDIM `json.FIELD`, strings TEXT `json.FIELD`), npy a LOWDIM stream of
// the whole tensor (flattened, as float32), cls a LOWDIM class label. Everything but a video is
// one value per clip: its LOWDIM steps and IMAGE frames sit at the clip's video frame times (the
// same value at each), so any anchor and delta picks it and `_is_pad` agrees with the video.
//
// Columns: several parallel trees of tars joined by key, Cosmos-Curate's
// video/part_0/0.tar + metas/part_0/0.tar + t5_xxl/part_0/0.tar. The location's tars are found by
// listing it (local) or from `shards.txt` (remote: one tar path a line); when every tar lies in a
// subfolder and there are several top-level subfolders, each is a column and the tars at the same
// path inside each are one shard set (location option `#columns=a,b` picks and orders them).
//
// Opening reads each shard set's member index from the index cache (lerobot::IndexCacheDir), or
// builds it by listing the tars and probing every member (a video demuxed once into its packet
// table, an image's size, a .npy's header, a JSON's fields), four shard sets at a time. The
// stream set and shapes come from the first readable sample and are checked on every sample; a
// sample that differs, lacks a member, or has a member that lies (an .mp4 that is a JPEG, a JSON
// duration that disagrees with its video) is a broken episode: reading it is an error naming the
// shard, key and member, and `conveyor check` lists it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "storage/storage.h"

namespace conveyor::webdataset {

// Whether the root holds WebDataset shards: a local folder with *.tar (or compressed tar) files
// within four levels, or a remote root with shards.txt.
bool LooksLikeWebDataset(Storage& storage);

// Location options taken: columns (comma-separated top-level folders), duration_field (the JSON
// field checked against the video's duration, default "duration"; "none": no check),
// duration_tolerance_s (default: two frames or 2%, whichever is more), cache_mb (loaded samples
// kept, default 64). `uri` names the dataset in messages.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri, LocationOptions& options);

}  // namespace conveyor::webdataset
