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
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/format_fwd.h"
#include "format/manifest.h"
#include "storage/storage.h"

namespace conveyor {

// Thread-safe: every method may be called concurrently.
class Dataset {
 public:
  // `uri`: a directory path, file://, http(s)://host/prefix/ or s3://bucket/prefix/ (see
  // OpenStorage). A LeRobot dataset (meta/info.json) or a Conveyor dataset (manifest.json),
  // whichever is there: the first format of datasets/registry.cc that recognises the location.
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::string_view uri,
                                                       const HttpOptions& http = {});
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
