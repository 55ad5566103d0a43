// RLDS datasets read in place (docs/rlds.md): a TFDS builder folder as Open X-Embodiment, DROID,
// Bridge and Octo publish it (dataset_info.json, features.json and the
// NAME-SPLIT.tfrecord-NNNNN-of-MMMMM shards), locally, over HTTP or from S3.
//
// One episode is one tf.train.Example record (the schema declared in proto/tensorflow/, parsed
// with the protobuf library), its step features flattened under "steps/": an image feature is a
// BytesList of one JPEG or PNG per step, a tensor a flat FloatList or Int64List to reshape by
// features.json, text a BytesList. Streams are the step features' paths without "steps/", with
// '.' for '/' (steps/observation/image -> observation.image): images become IMAGE streams,
// tensors LOWDIM streams (float32 values copied bit for bit; integers and booleans converted
// exactly), the first step's language_instruction the `instruction` TEXT stream, and every other
// text feature a TEXT stream of its first step's value. RLDS has no timestamps: step k is at
// k / rate seconds, the rate given as the location option `#rate=HZ` (default 1, so a
// delta_timestamps of -1 is the step before).
//
// Opening reads the two JSON files and each shard's record index: per record its offset and
// length (the TFRecord framing checked, length and data CRC32C) and its step count. The index is
// built once by reading every shard (in parallel) and kept in the index cache
// (lerobot::IndexCacheDir), keyed by the shard's name, size and mtime or ETag, so the next open
// reads only the JSON and the index files. An episode read is one range read of its record,
// parsed once and kept in a byte-bounded cache of episodes; the order makes every episode one
// block (Dataset::reads_whole_episodes), so a shuffled epoch reads each record about once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "storage/storage.h"

namespace conveyor::rlds {

// Whether the root holds an RLDS / TFDS builder folder (dataset_info.json and features.json).
bool LooksLikeRlds(Storage& storage);

// Location options taken: rate (steps/s, default 1), split (default: "train", else the only
// split), cache_mb (the episode cache, default 1024). `uri` names the dataset in messages.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri, LocationOptions& options);

}  // namespace conveyor::rlds
