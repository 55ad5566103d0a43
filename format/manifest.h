// The dataset manifest (manifest.json) and its episode table (episodes.bin).
//
// manifest.json is small and human-readable: streams, statistics, shards, fingerprint. The
// per-episode records live in episodes.bin, a fixed-width little-endian table, so a dataset of
// millions of episodes opens with one sequential read (~60 bytes an episode) and no shard reads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/format_fwd.h"

namespace conveyor {

inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kEpisodeTableFile = "episodes.bin";
inline constexpr std::string_view kEpisodeTableMagic = "CVYEPTAB";
inline constexpr size_t kEpisodeTableHeaderSize = 32;

// One stream of the dataset, the same in every episode.
struct StreamInfo {
  std::string name;
  format::v1::StreamKind kind{};  // STREAM_KIND_UNSPECIFIED (0) until set
  std::string codec;          // FFmpeg codec name, "zstd-shuffle4" for lowdim, "utf-8" for text
  double rate = 0;            // frames/s (video, image), samples/s (audio), steps/s (lowdim)
  std::vector<int64_t> shape;  // video/image [H, W, C]; audio [channels]; lowdim [D]; text []
  std::vector<std::string> names;  // dimension names (lowdim) or channel names (audio)
  std::string pix_fmt;         // video/image: FFmpeg pixel format of the coded frames
};

// Normalization statistics of a low-dimensional stream, per dimension, as LeRobot computes them.
struct StreamStats {
  std::vector<double> mean, std, min, max;
  uint64_t count = 0;  // steps
  // Quantiles by name ("q01", "q10", "q50", "q90", "q99", ...) when the source dataset has them
  // (LeRobot v3.0's meta/stats.json; pi0-style quantile normalization). Empty otherwise.
  std::map<std::string, std::vector<double>> quantiles;
};

struct ShardInfo {
  std::string path;  // relative to the dataset root
  uint64_t bytes = 0;
  uint64_t episodes = 0;
};

struct Manifest {
  uint32_t format_version = 0;
  std::string name;
  std::string created_by;
  std::string fingerprint;  // XXH3-64 hex of the streams and the episode table (see format.md)
  std::vector<StreamInfo> streams;
  std::map<std::string, StreamStats> stats;  // lowdim streams only
  std::vector<ShardInfo> shards;
  uint64_t num_episodes = 0;
  uint64_t episode_table_bytes = 0;
  std::string episode_table_xxh3;
  double total_duration_s = 0;
  uint64_t total_bytes = 0;  // shards + episode table

  // -1 when absent.
  int StreamIndex(std::string_view name) const;
};

std::string ManifestToJson(const Manifest& m);
// `source` names the manifest in errors.
absl::StatusOr<Manifest> ManifestFromJson(std::string_view json, std::string_view source);

// The canonical text hashed into the fingerprint (streams only; stats and paths excluded).
std::string StreamsFingerprintText(const std::vector<StreamInfo>& streams);

// One row of episodes.bin. `lengths` has one entry per manifest stream: frames (video, image),
// packets (audio), steps (lowdim), 1 (text).
struct EpisodeRecord {
  uint64_t episode_id = 0;
  uint32_t shard = 0;
  uint32_t index_size = 0;
  uint64_t index_offset = 0;
  uint64_t index_xxh3 = 0;
  uint64_t data_offset = 0;
  uint64_t data_size = 0;
  double duration_s = 0;
  std::vector<uint32_t> lengths;
};

// The episode table, held as its raw bytes; records are decoded on access. Thread-compatible
// (immutable after construction).
class EpisodeTable {
 public:
  // Parses and checks `bytes` (magic, version, sizes, trailing XXH3-64). `num_streams` and
  // `num_shards` come from the manifest; a record pointing at a shard past the list is an error.
  static absl::StatusOr<EpisodeTable> Parse(std::string bytes, size_t num_streams,
                                            size_t num_shards, std::string_view source);
  static std::string Encode(const std::vector<EpisodeRecord>& records, size_t num_streams);

  size_t size() const { return count_; }
  EpisodeRecord record(size_t i) const;
  uint32_t length(size_t i, size_t stream) const;
  // Record i's shard, without decoding the rest of the record (for per-read lookups).
  uint32_t shard(size_t i) const;

 private:
  std::string bytes_;
  size_t count_ = 0;
  size_t num_streams_ = 0;
  size_t record_size_ = 0;
};

}  // namespace conveyor
