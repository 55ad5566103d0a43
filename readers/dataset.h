// Dataset: an opened Conveyor dataset (manifest + episode table), and checked range reads of
// its episodes' indexes, packets and low-dimensional blocks.
//
// Opening reads manifest.json and episodes.bin only; a shard is first touched when one of its
// episodes is read (then its header and footer are checked once, two small range reads).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "conveyor/format/v1/shard.pb.h"
#include "readers/manifest.h"
#include "readers/storage.h"

namespace conveyor {

// Thread-safe: every method may be called concurrently.
class Dataset {
 public:
  // `uri`: a directory path, file://, http(s)://host/prefix/ (see OpenStorage).
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::string_view uri,
                                                       const HttpOptions& http = {});
  // For callers that already hold a Storage.
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::unique_ptr<Storage> storage,
                                                       std::string uri);

  const std::string& uri() const { return uri_; }
  const Manifest& manifest() const { return manifest_; }
  const EpisodeTable& episodes() const { return episodes_; }
  size_t num_episodes() const { return episodes_.size(); }
  Storage& storage() const { return *storage_; }

  // The full path or URL of shard `shard`, for messages.
  std::string ShardName(uint32_t shard) const;

  // Reads and validates episode `episode`'s index (one range read): checksum against the episode
  // table, episode id, stream names and kinds and lengths against the manifest (a lying manifest
  // is a DATA_LOSS error naming both sides).
  absl::StatusOr<std::shared_ptr<const format::v1::EpisodeIndex>> LoadEpisode(size_t episode) const;

  // Reads packet `packet` of stream `stream` into `out`, verifying its checksum. Errors name
  // shard, episode, stream, packet and byte offset.
  absl::Status ReadPacket(const format::v1::EpisodeIndex& index, int stream, size_t packet,
                          std::string* out) const;

  // Reads steps [first, first + count) of a LOWDIM stream as float32 [count, dim] into `out`.
  absl::Status ReadLowdim(const format::v1::EpisodeIndex& index, int stream, size_t first,
                          size_t count, std::vector<float>* out) const;

  // Reads every byte of shard `shard` and checks all its checksums and its agreement with the
  // manifest. Slow; for `conveyor inspect --verify`.
  absl::Status VerifyShard(uint32_t shard) const;

 private:
  Dataset() = default;
  absl::StatusOr<const RandomAccessFile*> Shard(uint32_t shard) const;
  absl::Status CheckAgainstManifest(const format::v1::EpisodeIndex& index, size_t episode,
                                    std::string_view shard_name) const;

  std::string uri_;
  std::unique_ptr<Storage> storage_;
  Manifest manifest_;
  EpisodeTable episodes_;

  mutable absl::Mutex mu_;
  // Opened (and header/footer-checked) shard files, by shard number; null until first use.
  mutable std::vector<std::unique_ptr<RandomAccessFile>> shards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor
