// A LeRobot camera's video file, demuxed once (a v3.0 file holds many episodes) into the packet
// index episodes are cut from, and the sidecar cache that keeps those indexes across processes
// (docs/lerobot.md). Internal to datasets/lerobot/.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/cache_dir.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/lerobot/lerobot_meta.h"
#include "media/media_demux.h"
#include "storage/storage.h"

namespace conveyor::lerobot {

struct VideoFile {
  std::string path;  // relative
  std::string name;  // full, for messages
  // The whole file's stream: codec, time base, pts_origin and every packet (pts, dts, duration,
  // offset, size, flags, xxh3) in decode order. Also the sidecar's content.
  format::v1::StreamIndex index;
  std::vector<int> shown;  // packet indices of the presented frames, in pts order
  std::unique_ptr<RandomAccessFile> file;
};

// info.json's description of a camera against the file.
absl::Status CheckVideoFeature(const Feature& f, const format::v1::CodecParams& c,
                               const std::string& info_name, const std::string& file);

// The packet index of a demuxed file as a StreamIndex (which is also the sidecar's content).
format::v1::StreamIndex IndexOf(const DemuxedStream& d);

// The sidecar cache of packet indexes: <dir>/<xxh3 of the key>.idx holding the magic, the key,
// the XXH3-64 of the payload and the payload (a serialized StreamIndex). Written to a temporary
// name and renamed, so a reader sees a whole entry or none; a torn, foreign or stale entry fails
// its checks and is rebuilt.
// Thread-safe: every call opens the directory and reads or writes one entry.
class SidecarCache {
 public:
  explicit SidecarCache(std::string dir) : dir_(std::move(dir)) {}

  // The index kept under `key`, when an entry is there and passes every check.
  std::optional<format::v1::StreamIndex> Get(const std::string& key) const;
  // Keeps `index` under `key`; a failure to write is warned about, never an error.
  void Put(const std::string& key, const format::v1::StreamIndex& index) const;

 private:
  std::string NameOf(const std::string& key) const;
  // The directory, private to this uid (base/cache_dir.h): entries are opened in it without
  // following links, written under random O_EXCL names. Null, warned about once, when it is
  // refused (another user's, or writable by others): indexes are then built from the files.
  std::unique_ptr<CacheDir> OpenDir() const;
  std::string dir_;
};

}  // namespace conveyor::lerobot
