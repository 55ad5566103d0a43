// A LeRobot data file's frame rows (docs/lerobot.md): one parquet read once for all the episodes
// it holds, its bookkeeping columns checked, each episode's rows one contiguous run; and a
// feature's rows as float32. Internal to datasets/lerobot/.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "datasets/lerobot/lerobot_meta.h"
#include "datasets/parquet/parquet_file.h"
#include "storage/storage.h"

namespace conveyor::lerobot {

struct DataFile {
  std::string path;  // relative
  std::string name;  // full, for messages
  int64_t rows = 0;
  std::vector<int64_t> episode_index, frame_index, index, task_index;
  std::vector<double> timestamp;  // float32 in LeRobot's files, widened exactly
  std::map<std::string, parquet::Column> columns;  // lowdim and image features, by key
  std::map<int64_t, std::pair<int64_t, int64_t>> episode_rows;  // episode -> (first row, count)
};

// Reads data file `path` (named in messages as the data file of `episode`) with the columns of
// the `lowdim` and `images` features.
absl::StatusOr<std::unique_ptr<DataFile>> LoadDataFile(Storage& storage, const std::string& path,
                                                       int64_t episode,
                                                       const std::vector<const Feature*>& lowdim,
                                                       const std::vector<const Feature*>& images);

// Rows [first, first + count) of a numeric feature column as float32 [count, D]. float32 values
// are copied bit for bit; other types are converted, and `inexact` counts values that float32
// cannot hold exactly.
absl::Status LowdimRows(const parquet::Column& c, const Feature& f, int64_t first, int64_t count,
                        const std::string& where, float* out, int64_t* inexact);

}  // namespace conveyor::lerobot
