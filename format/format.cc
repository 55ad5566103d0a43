#include "format/format.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>

#include "base/strings.h"
#include "absl/strings/str_format.h"
#include "conveyor/format/v1/shard.pb.h"

namespace conveyor::format {
namespace {

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

absl::Status Corrupt(std::string_view shard, std::string_view what) {
  return absl::DataLossError(StrCat("corrupt shard ", shard, ": ", what));
}

// Checks that the range [offset, offset+size) lies within [lo, hi).
bool InRange(uint64_t offset, uint64_t size, uint64_t lo, uint64_t hi) {
  return offset >= lo && offset <= hi && size <= hi - offset;
}

absl::Status ValidatePackets(const pb::StreamIndex& s, uint64_t lo, uint64_t hi,
                             std::string_view where) {
  const pb::PacketTable& t = s.packets();
  const int n = t.pts_size();
  if (t.dts_size() != n || t.duration_size() != n || t.offset_size() != n || t.size_size() != n ||
      t.flags_size() != n || t.xxh3_size() != n) {
    return absl::DataLossError(StrCat(where, ": packet table columns have unequal lengths"));
  }
  if (s.num_frames() != static_cast<uint64_t>(n)) {
    return absl::DataLossError(StrCat(where, ": num_frames ", s.num_frames(), " but ", n,
                                            " packets in the table"));
  }
  for (int i = 0; i < n; ++i) {
    if (!InRange(t.offset(i), t.size(i), lo, hi)) {
      return absl::DataLossError(StrCat(where, ": packet ", i, " at byte offset ",
                                              t.offset(i), " size ", t.size(i),
                                              " lies outside the episode data [", lo, ", ", hi,
                                              ")"));
    }
  }
  if (s.time_base_num() <= 0 || s.time_base_den() <= 0) {
    return absl::DataLossError(StrCat(where, ": invalid time base ", s.time_base_num(), "/",
                                            s.time_base_den()));
  }
  return absl::OkStatus();
}

absl::Status ValidateLowdim(const pb::StreamIndex& s, uint64_t lo, uint64_t hi,
                            std::string_view where) {
  const pb::LowdimBlocks& b = s.blocks();
  const int n = b.first_step_size();
  if (b.num_steps_size() != n || b.offset_size() != n || b.size_size() != n ||
      b.xxh3_size() != n) {
    return absl::DataLossError(StrCat(where, ": block table columns have unequal lengths"));
  }
  if (b.dim() <= 0 || b.dim() > (1 << 20)) {
    return absl::DataLossError(StrCat(where, ": invalid dimension ", b.dim()));
  }
  if (static_cast<uint64_t>(s.timestamps_s_size()) != s.num_frames()) {
    return absl::DataLossError(StrCat(where, ": ", s.timestamps_s_size(),
                                            " timestamps for ", s.num_frames(), " steps"));
  }
  uint64_t next = 0;
  for (int i = 0; i < n; ++i) {
    if (b.first_step(i) != next || b.num_steps(i) == 0) {
      return absl::DataLossError(StrCat(where, ": block ", i, " covers steps [",
                                              b.first_step(i), ", +", b.num_steps(i),
                                              "), expected to start at ", next));
    }
    next += b.num_steps(i);
    if (!InRange(b.offset(i), b.size(i), lo, hi)) {
      return absl::DataLossError(StrCat(where, ": block ", i, " at byte offset ",
                                              b.offset(i), " size ", b.size(i),
                                              " lies outside the episode data [", lo, ", ", hi,
                                              ")"));
    }
  }
  if (next != s.num_frames()) {
    return absl::DataLossError(
        StrCat(where, ": blocks cover ", next, " steps, index says ", s.num_frames()));
  }
  double prev = -INFINITY;
  for (int i = 0; i < s.timestamps_s_size(); ++i) {
    double t = s.timestamps_s(i);
    if (!std::isfinite(t) || t < prev) {
      return absl::DataLossError(StrCat(where, ": timestamp ", i, " (", t,
                                              ") is not finite or goes backwards"));
    }
    prev = t;
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t Checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }
uint64_t Checksum(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }
std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

std::string EncodeShardHeader() {
  std::string out(kShardMagic);
  PutU32(&out, kFormatVersion);
  PutU32(&out, 0);
  return out;
}

std::string EncodeShardFooter(const ShardFooter& f) {
  std::string out;
  PutU64(&out, f.directory_offset);
  PutU64(&out, f.directory_size);
  PutU64(&out, f.directory_xxh3);
  PutU32(&out, f.version);
  PutU32(&out, static_cast<uint32_t>(kShardFooterSize));
  out.append(kFooterMagic);
  return out;
}

absl::Status CheckShardHeader(std::string_view header, std::string_view shard) {
  if (header.size() < kShardHeaderSize || header.substr(0, 8) != kShardMagic) {
    return Corrupt(shard, "not a Conveyor shard (bad magic at byte offset 0)");
  }
  uint32_t version = GetU32(header.data() + 8);
  if (version != kFormatVersion) {
    return absl::FailedPreconditionError(
        StrCat(shard, ": shard format version ", version, " is not supported (this build ",
                     "reads version ", kFormatVersion, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardFooter> ParseShardFooter(std::string_view footer, uint64_t file_size,
                                             std::string_view shard) {
  if (file_size < kShardHeaderSize + kShardFooterSize) {
    return Corrupt(shard, StrCat("file is ", file_size,
                                       " bytes, too small for a header and footer (truncated?)"));
  }
  const uint64_t at = file_size - kShardFooterSize;
  if (footer.size() != kShardFooterSize || footer.substr(32, 8) != kFooterMagic) {
    return Corrupt(shard, StrCat("no footer magic at byte offset ", at,
                                       " (truncated or still being written?)"));
  }
  ShardFooter f;
  f.directory_offset = GetU64(footer.data());
  f.directory_size = GetU64(footer.data() + 8);
  f.directory_xxh3 = GetU64(footer.data() + 16);
  f.version = GetU32(footer.data() + 24);
  uint32_t footer_size = GetU32(footer.data() + 28);
  if (f.version != kFormatVersion) {
    return absl::FailedPreconditionError(StrCat(shard, ": footer format version ", f.version,
                                                      " is not supported (this build reads ",
                                                      kFormatVersion, ")"));
  }
  if (footer_size != kShardFooterSize) {
    return Corrupt(shard, StrCat("footer size ", footer_size, " at byte offset ", at));
  }
  if (!InRange(f.directory_offset, f.directory_size, kShardHeaderSize, at) ||
      f.directory_size > kMaxIndexBytes) {
    return Corrupt(shard, StrCat("directory at byte offset ", f.directory_offset, " size ",
                                       f.directory_size, " lies outside the file (", file_size,
                                       " bytes)"));
  }
  return f;
}

absl::StatusOr<pb::ShardDirectory> ParseShardDirectory(std::string_view bytes,
                                                       const ShardFooter& footer,
                                                       uint64_t file_size, std::string_view shard) {
  if (bytes.size() != footer.directory_size) {
    return Corrupt(shard, "directory size does not match the footer");
  }
  if (Checksum(bytes) != footer.directory_xxh3) {
    return Corrupt(shard, StrCat("checksum mismatch in the directory at byte offset ",
                                       footer.directory_offset));
  }
  pb::ShardDirectory dir;
  if (!dir.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Corrupt(shard,
                   StrCat("directory at byte offset ", footer.directory_offset,
                                " does not parse"));
  }
  if (dir.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(StrCat(
        shard, ": directory format version ", dir.format_version(), " is not supported"));
  }
  for (const pb::DirectoryEntry& e : dir.episodes()) {
    if (!InRange(e.index_offset(), e.index_size(), kShardHeaderSize, footer.directory_offset) ||
        !InRange(e.data_offset(), e.data_size(), kShardHeaderSize, e.index_offset())) {
      return Corrupt(shard, StrCat("directory entry of episode ", e.episode_id(),
                                         " points outside the file (index at byte offset ",
                                         e.index_offset(), ", data at ", e.data_offset(), ")"));
    }
  }
  return dir;
}

absl::Status ValidateEpisodeIndex(const pb::EpisodeIndex& index, uint64_t index_offset,
                                  uint64_t file_size, std::string_view shard) {
  const std::string ep = StrCat("shard ", shard, ", episode ", index.episode_id());
  if (index.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(StrCat(
        ep, ": episode index format version ", index.format_version(), " is not supported"));
  }
  const uint64_t lo = index.data_offset();
  if (!InRange(lo, index.data_size(), kShardHeaderSize, std::min(index_offset, file_size))) {
    return absl::DataLossError(StrCat(ep, ": data range at byte offset ", lo, " size ",
                                            index.data_size(), " does not precede its index at ",
                                            index_offset));
  }
  const uint64_t hi = lo + index.data_size();
  if (!std::isfinite(index.duration_s()) || index.duration_s() < 0) {
    return absl::DataLossError(StrCat(ep, ": invalid duration ", index.duration_s()));
  }
  for (const pb::StreamIndex& s : index.streams()) {
    const std::string where = StrCat(ep, ", stream '", s.name(), "'");
    switch (s.kind()) {
      case pb::VIDEO:
      case pb::IMAGE:
      case pb::AUDIO: {
        absl::Status st = ValidatePackets(s, lo, hi, where);
        if (!st.ok()) return st;
        break;
      }
      case pb::LOWDIM: {
        absl::Status st = ValidateLowdim(s, lo, hi, where);
        if (!st.ok()) return st;
        break;
      }
      case pb::TEXT:
        break;
      default:
        return absl::DataLossError(StrCat(where, ": unknown stream kind ", s.kind()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::EpisodeIndex> ParseEpisodeIndex(std::string_view bytes, uint64_t index_offset,
                                                   uint64_t expected_xxh3,
                                                   uint64_t expected_episode_id,
                                                   uint64_t file_size, std::string_view shard) {
  if (Checksum(bytes) != expected_xxh3) {
    return absl::DataLossError(StrCat("checksum mismatch in shard ", shard, ", episode ",
                                            expected_episode_id, ", index at byte offset ",
                                            index_offset, " (", bytes.size(), " bytes)"));
  }
  pb::EpisodeIndex index;
  if (!index.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(StrCat("shard ", shard, ", episode ", expected_episode_id,
                                            ": index at byte offset ", index_offset,
                                            " does not parse"));
  }
  if (index.episode_id() != expected_episode_id) {
    return absl::DataLossError(StrCat("shard ", shard, ": index at byte offset ",
                                            index_offset, " is episode ", index.episode_id(),
                                            ", expected episode ", expected_episode_id));
  }
  absl::Status st = ValidateEpisodeIndex(index, index_offset, file_size, shard);
  if (!st.ok()) return st;
  return index;
}

std::string_view StreamKindName(pb::StreamKind kind) {
  switch (kind) {
    case pb::VIDEO:
      return "video";
    case pb::IMAGE:
      return "image";
    case pb::AUDIO:
      return "audio";
    case pb::LOWDIM:
      return "lowdim";
    case pb::TEXT:
      return "text";
    default:
      return "unknown";
  }
}

absl::StatusOr<pb::StreamKind> ParseStreamKind(std::string_view name) {
  if (name == "video") return pb::VIDEO;
  if (name == "image") return pb::IMAGE;
  if (name == "audio") return pb::AUDIO;
  if (name == "lowdim") return pb::LOWDIM;
  if (name == "text") return pb::TEXT;
  return absl::InvalidArgumentError(StrCat(
      "unknown stream kind '", name, "' (expected video, image, audio, lowdim or text)"));
}

}  // namespace conveyor::format
