// The metadata of a LeRobot dataset (Hugging Face lerobot, codebase versions v3.0 and v2.1), read
// over a Storage: meta/info.json, the episode table, the tasks and the statistics. docs/lerobot.md
// describes both layouts and how Conveyor maps them onto its own streams.
//
//   v3.0  meta/info.json, meta/episodes/chunk-XXX/file-YYY.parquet (one row per episode: length,
//         tasks, data file, per camera the video file and from/to timestamps), meta/tasks.parquet,
//         meta/stats.json; data/chunk-XXX/file-YYY.parquet and videos/<key>/chunk-XXX/file-YYY.mp4
//         each hold many episodes.
//   v2.1  meta/info.json, meta/episodes.jsonl, meta/tasks.jsonl, meta/episodes_stats.jsonl (and
//         meta/stats.json where present); one data parquet and one mp4 per camera per episode.
//
// Reading metadata reads no data file and no video. Every error names the file and, where it
// applies, the episode and the field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/parquet/parquet_file.h"
#include "storage/storage.h"

namespace conveyor::lerobot {

inline constexpr std::string_view kInfoPath = "meta/info.json";

enum class Version { kV21, kV30 };

// The columns LeRobot adds to every frame row. They index and check the data; they are not
// features a policy trains on.
inline constexpr std::string_view kIndexColumns[] = {"timestamp", "frame_index", "episode_index",
                                                     "index", "task_index"};
bool IsIndexColumn(std::string_view key);
// A dtype info.json may give a numeric feature ("float32", "int64", "bool", ...).
bool IsNumericDtype(std::string_view dtype);

// One entry of info.json's "features".
struct Feature {
  std::string key;                 // "observation.state", "observation.images.top", ...
  std::string dtype;               // "float32", "int64", "bool", "string", "video", "image", ...
  std::vector<int64_t> shape;      // as info.json gives it
  std::vector<std::string> names;  // one per element of a 1-D feature when info.json names them
                                   // (a list, or a dict holding one list); else empty
  std::string video_codec;         // video: info.json's "info"/"video.codec", when present
  double video_fps = 0;            // video: "info"/"video.fps", when present
  std::string video_pix_fmt;       // video: "info"/"video.pix_fmt", when present
  int64_t video_height = 0;        // video: "info"/"video.height", when present
  int64_t video_width = 0;         // video: "info"/"video.width", when present

  bool is_video() const { return dtype == "video"; }
  bool is_image() const { return dtype == "image"; }
  // Elements per frame: the product of `shape` (1 for a scalar).
  int64_t elements() const;
};

// Where one camera of one episode lives.
struct VideoSegment {
  std::string path;            // relative to the dataset root
  double from_s = 0;           // v3.0: from_timestamp in the (concatenated) file; v2.1: 0
  std::optional<double> to_s;  // v3.0: to_timestamp; v2.1: none (the episode is the whole file)
};

struct Episode {
  int64_t index = 0;
  int64_t length = 0;  // frames (rows)
  std::vector<std::string> tasks;
  std::string data_path;  // relative path of the data parquet holding its rows
  // Global `index` of its first row and one past its last (v2.1: running sum of lengths).
  int64_t dataset_from_index = 0;
  int64_t dataset_to_index = 0;
  std::map<std::string, VideoSegment> videos;  // by video feature key
  std::string source;  // the metadata it came from, for messages ("meta/episodes.jsonl line 3")
};

// meta/stats.json (or v2.1's episodes_stats.jsonl aggregated) for one feature, flattened.
struct FeatureStats {
  std::vector<double> mean, std, min, max;
  uint64_t count = 0;
  std::map<std::string, std::vector<double>> quantiles;  // "q01", "q99", ... where present
};

struct Meta {
  std::string root;              // the dataset root, for messages
  std::string codebase_version;  // "v3.0", "v2.1", "v2.0"
  Version version = Version::kV30;
  double fps = 0;
  int64_t chunks_size = 1000;
  int64_t total_episodes = 0;
  int64_t total_frames = 0;
  std::string data_path;   // info.json's template
  std::string video_path;  // info.json's template; empty when the dataset has no videos
  std::vector<Feature> features;           // info.json order
  std::vector<Episode> episodes;           // episode i at position i
  std::map<int64_t, std::string> tasks;    // task_index -> task
  std::map<std::string, FeatureStats> stats;
  std::string stats_source;  // "meta/stats.json", "meta/episodes_stats.jsonl (aggregated)" or ""

  const Feature* FindFeature(std::string_view key) const;
};

// True when the root holds meta/info.json with a "codebase_version" (a LeRobot dataset).
bool LooksLikeLeRobot(Storage& storage);

// Reads info.json, the episodes, the tasks and the statistics, and checks that they agree with
// each other (episode indices 0..N-1, total_episodes, total_frames, from/to indices contiguous,
// every video feature located for every episode). `root_name` is used in messages.
absl::StatusOr<Meta> ReadMeta(Storage& storage, std::string root_name);

// Expands a Python format template as info.json holds them ("data/chunk-{chunk_index:03d}/
// file-{file_index:03d}.parquet"): fields {name}, {name:d} and {name:0Nd}. INVALID_ARGUMENT for
// a field not in `ints` or `strings`, or a format spec other than those.
absl::StatusOr<std::string> FormatPathTemplate(std::string_view tmpl,
                                               const std::map<std::string, int64_t>& ints,
                                               const std::map<std::string, std::string>& strings);

// Opens a Parquet file under the root; only its footer is read here.
absl::StatusOr<parquet::ParquetFile> OpenParquet(Storage& storage, std::string_view relpath);

// A flat integer column (INT32 or INT64) as int64, one per row; nulls are an error naming the
// file and column.
absl::StatusOr<std::vector<int64_t>> ReadIntColumn(const parquet::ParquetFile& file,
                                                   std::string_view column);

}  // namespace conveyor::lerobot
