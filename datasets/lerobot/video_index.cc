// A LeRobot camera's packet index and its sidecar cache (datasets/lerobot/internal/video_index.h).
#include "datasets/lerobot/internal/video_index.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/strings.h"
#include "format/format.h"

namespace conveyor::lerobot {

namespace pb = format::v1;

namespace {

constexpr std::string_view kSidecarMagic = "CVYVIDX1";

bool IndexIsConsistent(const pb::StreamIndex& s) {
  const pb::PacketTable& t = s.packets();
  const int n = t.pts_size();
  return n > 0 && t.dts_size() == n && t.duration_size() == n && t.offset_size() == n &&
         t.size_size() == n && t.flags_size() == n && t.xxh3_size() == n &&
         s.time_base_num() > 0 && s.time_base_den() > 0;
}

}  // namespace

absl::Status CheckVideoFeature(const Feature& f, const pb::CodecParams& c,
                               const std::string& info_name, const std::string& file) {
  const int64_t h = c.height(), w = c.width();
  if (f.shape.size() == 3) {
    const bool hwc = f.shape[0] == h && f.shape[1] == w;
    const bool chw = f.shape[1] == h && f.shape[2] == w;
    if (!hwc && !chw) {
      return absl::InvalidArgumentError(StrCat(info_name, ": features.", f.key, ".shape is [",
                                               f.shape[0], ", ", f.shape[1], ", ", f.shape[2],
                                               "], but ", file, " is ", w, "x", h));
    }
  }
  if (!f.video_codec.empty() && f.video_codec != c.codec()) {
    return absl::InvalidArgumentError(StrCat(info_name, ": features.", f.key,
                                             ".info says video.codec \"", f.video_codec, "\", but ",
                                             file, " is ", c.codec()));
  }
  return absl::OkStatus();
}

pb::StreamIndex IndexOf(const DemuxedStream& d) {
  pb::StreamIndex s;
  s.set_name(d.stream.info.name);
  s.set_kind(pb::VIDEO);
  *s.mutable_codec() = *d.stream.codec;
  s.mutable_codec()->set_codec(d.stream.info.codec);
  s.set_time_base_num(d.stream.time_base_num);
  s.set_time_base_den(d.stream.time_base_den);
  s.set_pts_origin(d.stream.pts_origin);
  s.set_num_frames(d.stream.packets.size());
  pb::PacketTable* t = s.mutable_packets();
  for (size_t i = 0; i < d.stream.packets.size(); ++i) {
    const EpisodeData::Packet& p = d.stream.packets[i];
    t->add_pts(p.pts);
    t->add_dts(p.dts);
    t->add_duration(p.duration);
    t->add_offset(d.offsets[i]);
    t->add_size(d.sizes[i]);
    t->add_flags(p.key ? format::kPacketKey : 0);
    t->add_xxh3(d.xxh3[i]);
  }
  return s;
}

std::optional<pb::StreamIndex> SidecarCache::Get(const std::string& key) const {
  if (dir_.empty()) return std::nullopt;
  const std::unique_ptr<CacheDir> dir = OpenDir();
  std::optional<std::string> read = dir ? dir->ReadEntry(NameOf(key), 1ull << 32) : std::nullopt;
  if (!read) return std::nullopt;
  const std::string& bytes = *read;
  const size_t head = kSidecarMagic.size() + 4;
  if (bytes.size() < head || bytes.compare(0, kSidecarMagic.size(), kSidecarMagic) != 0) {
    return std::nullopt;
  }
  uint32_t key_size = 0;
  std::memcpy(&key_size, bytes.data() + kSidecarMagic.size(), 4);
  if (bytes.size() < head + key_size + 8 || bytes.compare(head, key_size, key) != 0) {
    return std::nullopt;
  }
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + head + key_size, 8);
  const std::string_view payload = std::string_view(bytes).substr(head + key_size + 8);
  if (format::Checksum(payload) != sum) return std::nullopt;
  pb::StreamIndex index;
  if (!index.ParseFromArray(payload.data(), static_cast<int>(payload.size())) ||
      !IndexIsConsistent(index)) {
    return std::nullopt;
  }
  return index;
}

void SidecarCache::Put(const std::string& key, const pb::StreamIndex& index) const {
  if (dir_.empty()) return;
  const std::unique_ptr<CacheDir> dir = OpenDir();
  if (!dir) return;
  const std::string payload = index.SerializeAsString();
  std::string bytes(kSidecarMagic);
  const uint32_t key_size = static_cast<uint32_t>(key.size());
  bytes.append(reinterpret_cast<const char*>(&key_size), 4);
  bytes += key;
  const uint64_t sum = format::Checksum(payload);
  bytes.append(reinterpret_cast<const char*>(&sum), 8);
  bytes += payload;
  if (!dir->WriteEntry(NameOf(key), bytes)) {
    spdlog::warn("lerobot: cannot write the packet index cache entry {}/{}: {} (continuing without it)", dir_,
                 NameOf(key), std::strerror(errno));
  }
}

std::string SidecarCache::NameOf(const std::string& key) const {
  return StrCat(format::ChecksumHex(format::Checksum(key)), ".idx");
}

std::unique_ptr<CacheDir> SidecarCache::OpenDir() const {
  absl::StatusOr<std::unique_ptr<CacheDir>> d = CacheDir::Open({dir_, "index cache directory", ""});
  if (d.ok()) return std::move(*d);
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) spdlog::warn("lerobot: {} (continuing without it)", std::string(d.status().message()));
  return nullptr;
}

}  // namespace conveyor::lerobot
