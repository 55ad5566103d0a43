// DatasetWriter: turns episodes held in memory into shards, an episode table and a manifest.
// Used by `conveyor synth` and `conveyor import`; the only code that writes the format.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/codec_params_value.h"
#include "format/manifest.h"

namespace conveyor {

// One episode as the writer takes it. Streams must come in the same order, with the same names,
// kinds, codecs and shapes, in every episode of a dataset.
struct EpisodeData {
  struct Packet {
    int64_t pts = 0;
    int64_t dts = 0;
    int64_t duration = 0;
    bool key = false;
    std::string bytes;
  };
  struct Stream {
    StreamInfo info;                  // name, kind, codec, rate, shape, names, pix_fmt
    CodecParamsValue codec;           // decoder parameters; codec->codec() should equal info.codec
    int time_base_num = 1;
    int time_base_den = 1;
    int64_t pts_origin = 0;           // the pts that is t = 0 on the episode clock
    std::vector<Packet> packets;      // VIDEO, IMAGE, AUDIO: in decode order
    std::vector<double> timestamps_s; // LOWDIM: one per step, non-decreasing
    std::vector<float> values;        // LOWDIM: [steps, dim] row-major
    std::string text;                 // TEXT
  };
  std::string source;
  std::vector<Stream> streams;
};

// Not thread-safe: one thread adds episodes in order. Episode ids are 0, 1, 2, ... in the order
// added, so the same input order gives byte-identical output.
class DatasetWriter {
 public:
  struct Options {
    std::string name = "dataset";
    std::string created_by = "conveyor";
    // A shard is closed when it holds this many episodes or reaches target_shard_bytes.
    int episodes_per_shard = 64;
    uint64_t target_shard_bytes = 512ull << 20;
    // Steps per low-dimensional block: smaller blocks read less for a short window, larger ones
    // compress better. 256 steps of 14 floats = 14 KiB raw.
    int lowdim_block_steps = 256;
    int zstd_level = 3;
    // Statistics recorded for these lowdim streams instead of the ones computed from the values
    // written: an imported dataset's own (LeRobot's meta/stats.json, with its quantiles), so that
    // normalization matches what the source's trainers use. Each must have the stream's
    // dimension (Finish fails otherwise).
    std::map<std::string, StreamStats> stats;
  };

  // Creates `out_dir` (and out_dir/shards). It must not exist or be empty.
  static absl::StatusOr<std::unique_ptr<DatasetWriter>> Create(std::string out_dir,
                                                               Options options);
  ~DatasetWriter();

  // Validates and appends one episode. Errors name the episode source and stream.
  absl::Status AddEpisode(const EpisodeData& episode);

  // Closes the last shard and writes episodes.bin and manifest.json (written last, atomically:
  // a dataset without a manifest is an unfinished one).
  absl::StatusOr<Manifest> Finish();

  uint64_t episodes_written() const { return records_.size(); }
  uint64_t bytes_written() const;

 private:
  DatasetWriter(std::string out_dir, Options options);
  absl::Status OpenShard();
  absl::Status CloseShard();
  absl::Status Write(std::string_view bytes);
  absl::Status CheckLayout(const EpisodeData& episode);

  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  struct RunningStats {
    std::vector<double> mean, m2, min, max;  // Welford
    uint64_t count = 0;
  };

  std::string out_dir_;
  Options options_;
  std::vector<StreamInfo> streams_;  // from the first episode
  std::vector<EpisodeRecord> records_;
  std::vector<ShardInfo> shards_;
  std::vector<RunningStats> stats_;  // per stream (lowdim only used)
  double total_duration_s_ = 0;
  uint64_t closed_bytes_ = 0;

  // The open shard.
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::string shard_tmp_path_, shard_path_;
  uint64_t pos_ = 0;
  std::unique_ptr<format::v1::ShardDirectory> directory_;  // never null
  bool finished_ = false;
};

}  // namespace conveyor
