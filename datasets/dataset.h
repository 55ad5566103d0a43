// Dataset: the narrow interface every dataset format implements (think leveldb's Env): a
// manifest (streams, statistics, fingerprint), an episode table, and checked reads of an
// episode's index, packets and low-dimensional values. The sample index, assembler, pipeline and
// server see only this.
//
// Two implementations:
//   - the native Conveyor format (datasets/native/): manifest.json, episodes.bin and shards with
//     per-packet checksums (docs/format.md);
//   - LeRobot datasets v3.0 and v2.1 read in place (datasets/lerobot/): the Parquet tables and
//     the mp4 files as LeRobot wrote them (docs/lerobot.md).
// A new format is a folder beside them that implements this interface, plus one line in
// datasets/registry.cc (how to recognise it at a location, how to open it).
//
// Opening reads metadata only; data files are first touched when one of their episodes is read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/format_fwd.h"
#include "format/manifest.h"
#include "storage/storage.h"

namespace conveyor {

// Options a dataset location carries after '#', for formats whose files do not say everything
// (RLDS episodes have no timestamps, so no step rate): "/data/bridge/0.1.0#rate=5",
// "s3://bucket/aloha#rate=50". Keys and values are separated by '&' and '='. Each format takes
// the keys it knows; a key no format took is an error naming it (a typo never passes silently).
class LocationOptions {
 public:
  // Splits "LOCATION#k=v&k2=v2" into the location and its options.
  static absl::StatusOr<LocationOptions> Parse(std::string_view uri, std::string* location);

  bool empty() const { return values_.empty(); }
  // Takes key `key` when present (it is then used): its text, or a positive finite number.
  std::optional<std::string> Take(std::string_view key);
  absl::StatusOr<std::optional<double>> TakePositive(std::string_view key);
  // An error naming every key not taken (`format` names the format that read the location).
  absl::Status CheckAllTaken(std::string_view format) const;
  // The options as given, for messages and for the dataset's identity ("" when none).
  const std::string& text() const { return text_; }

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::string text_;
};

// How many times a format whose episode is read as a whole (one RLDS record) read its episodes:
// the read amplification that `conveyor batches --stats` and `conveyor bench` report.
struct EpisodeReadStats {
  uint64_t reads = 0;              // episode reads from storage
  uint64_t distinct = 0;           // distinct episodes among them
  uint64_t bytes_read = 0;         // bytes of those reads
  uint64_t distinct_bytes = 0;     // bytes of the distinct episodes (each counted once)
  double amplification() const {
    return distinct_bytes == 0 ? 0 : static_cast<double>(bytes_read) / static_cast<double>(distinct_bytes);
  }
};

// Thread-safe: every method may be called concurrently.
class Dataset {
 public:
  // `uri`: a directory path, file://, http(s)://host/prefix/ or s3://bucket/prefix/ (see
  // OpenStorage). A LeRobot dataset (meta/info.json) or a Conveyor dataset (manifest.json),
  // whichever is there: the first format of datasets/registry.cc that recognises the location.
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::string_view uri,
                                                       const HttpOptions& http = {});
  // `uri` may end in "#options" (LocationOptions); `storage` is rooted at the location without
  // them.
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::unique_ptr<Storage> storage,
                                                       std::string uri);

  virtual ~Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  const std::string& uri() const { return uri_; }
  const Manifest& manifest() const { return manifest_; }
  // Per episode: its lengths per stream, duration, and the file of manifest().shards that holds
  // it (a native shard; for LeRobot, the episode's data parquet).
  const EpisodeTable& episodes() const { return episodes_; }
  size_t num_episodes() const { return episodes_.size(); }
  Storage& storage() const { return *storage_; }

  // "conveyor" or "lerobot v3.0" / "lerobot v2.1", for `inspect` and logs.
  virtual std::string format() const = 0;

  // The full path or URL of file `shard` of manifest().shards, for messages.
  std::string ShardName(uint32_t shard) const;

  // Episode `episode`'s index, checked against the manifest and the episode table (a lying
  // manifest is a DATA_LOSS error naming both sides). Packet offsets in it are byte offsets in the
  // file that holds the stream.
  virtual absl::StatusOr<std::shared_ptr<const format::v1::EpisodeIndex>> LoadEpisode(
      size_t episode) const = 0;

  // Reads packet `packet` of stream `stream` into `out`, verifying its checksum. Errors name the
  // file, episode, stream, packet and byte offset.
  virtual absl::Status ReadPacket(const format::v1::EpisodeIndex& index, int stream, size_t packet,
                                  std::string* out) const = 0;

  // Reads steps [first, first + count) of a LOWDIM stream as float32 [count, dim] into `out`.
  virtual absl::Status ReadLowdim(const format::v1::EpisodeIndex& index, int stream, size_t first,
                                  size_t count, std::vector<float>* out) const = 0;

  // Reads every byte of file `shard` of manifest().shards and checks all its checksums and its
  // agreement with the manifest. Slow; for `conveyor inspect --verify`.
  virtual absl::Status VerifyShard(uint32_t shard) const = 0;

  // Whether an episode is read from storage as a whole (one RLDS record): the order then makes
  // each episode one block, so a shuffled epoch reads each episode about once (shuffle/schedule.h),
  // with windows of about `window_bytes` of episodes (the format's episode cache holds two).
  virtual bool reads_whole_episodes() const { return false; }
  // The mean bytes an episode read costs, for sizing windows (reads_whole_episodes() only).
  virtual uint64_t mean_episode_bytes() const { return 0; }
  // Asks the format to keep at least `bytes` of episodes read whole (two windows of the order
  // that shuffle/schedule.h resolved, within the pipeline's queue_bytes); never shrinks.
  virtual void ReserveEpisodeCache(uint64_t bytes) const {}
  // How many times episodes were read from storage (formats that read whole episodes).
  virtual std::optional<EpisodeReadStats> episode_read_stats() const { return std::nullopt; }
  // Empties the cache of episodes read whole and zeroes episode_read_stats(), so a benchmark
  // measures a cold epoch. Not while a pipeline reads the dataset.
  virtual void DropEpisodeCache() const {}
  // The stored shape of episode `episode`'s per-clip tensor in stream `stream` (a LOWDIM stream
  // whose codec is format/npy.h's NpyCodec: a WebDataset .npy member), known without reading the
  // tensor: what the order keys `buckets: {by: STREAM}` on and `conveyor check --config` checks.
  // The default: the stream's codec in the manifest (every episode one shape). Errors name the
  // episode and stream (a broken sample's error is its own).
  virtual absl::StatusOr<std::vector<int64_t>> StoredShape(size_t episode, int stream) const;

 protected:
  Dataset() = default;
  // Reads every packet and every lowdim value of the episode (for VerifyShard).
  absl::Status VerifyEpisode(size_t episode) const;

  std::string uri_;  // redacted: never a credential
  std::unique_ptr<Storage> storage_;
  Manifest manifest_;
  EpisodeTable episodes_;
};

}  // namespace conveyor
