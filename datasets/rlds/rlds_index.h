// The record index of one RLDS shard: per record (episode) its frame offset, data length and
// step count. Built once by reading the shard through (every CRC checked, every record parsed
// to count its steps and check its features) and kept as a file in the index cache, keyed by the
// shard's name, size and version (mtime or ETag), so later opens read a few bytes per episode.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/rlds/tfrecord.h"
#include "storage/storage.h"

namespace conveyor::rlds {

struct RecordEntry {
  RecordRef ref;
  uint64_t steps = 0;
  // Why the record cannot be read (its data CRC, its Example, its features), empty when it can.
  // A broken record stays an episode of one step, so `conveyor check` names it and its quarantine
  // leaves it out; reading it is that error.
  std::string error;
};

// Per-dimension moments of a lowdim feature's values (as float32, as served), merged across
// records and shards with Chan et al.'s pairwise update: the normalization statistics RLDS does
// not ship, computed while the index is built.
struct Moments {
  uint64_t count = 0;  // rows
  std::vector<double> mean, m2, min, max;
  void Add(const float* row, size_t dim);
  void Merge(const Moments& other);
};

struct ShardIndex {
  std::vector<RecordEntry> records;
  std::map<std::string, Moments> moments;  // by feature key
  bool from_cache = false;
};

// Reads one record's data (a serialized tf.train.Example): checks its features, adds its lowdim
// rows to `moments` and returns its step count. `where` names the record in errors.
using RecordVisitor = std::function<absl::StatusOr<uint64_t>(
    std::string_view data, const std::string& where, std::map<std::string, Moments>* moments)>;

// The index of `file`: from `cache_dir` (empty: none) when an entry for the file's name, size and
// version is there and intact, else built by scanning the file (and then written there).
absl::StatusOr<ShardIndex> IndexShard(const RandomAccessFile& file, const std::string& cache_dir,
                                      const RecordVisitor& visit_record);

}  // namespace conveyor::rlds
