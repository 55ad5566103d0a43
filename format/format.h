// The Conveyor shard format: constants, the fixed header and footer, and the parsers of the
// shard directory and episode indexes. docs/format.md is the prose version of this header.
//
//   shard := header(16) { episode_data episode_index }* directory footer(40)
//   header := "CVYSHARD" u32 version u32 flags            (little-endian)
//   footer := u64 directory_offset u64 directory_size u64 directory_xxh3
//             u32 version u32 footer_size "CVYFOOTR"
//
// Every parser here takes untrusted bytes: it never crashes, never reads out of bounds, and
// returns an error that names the shard, the episode, the stream and the byte offset involved.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "format/format_fwd.h"

namespace conveyor::format {

namespace pb = ::conveyor::format::v1;

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr std::string_view kShardMagic = "CVYSHARD";
inline constexpr std::string_view kFooterMagic = "CVYFOOTR";
inline constexpr size_t kShardHeaderSize = 16;
inline constexpr size_t kShardFooterSize = 40;
// Indexes larger than this are refused as corrupt (an episode of 10^6 packets is ~30 MB).
inline constexpr uint64_t kMaxIndexBytes = 256ull << 20;

// Packet flags (PacketTable.flags).
inline constexpr uint32_t kPacketKey = 1u << 0;
inline constexpr uint32_t kPacketDiscard = 1u << 1;

// XXH3-64, the checksum of every packet, block, index and table.
uint64_t Checksum(std::string_view bytes);
uint64_t Checksum(const void* data, size_t size);
std::string ChecksumHex(uint64_t checksum);

struct ShardFooter {
  uint64_t directory_offset = 0;
  uint64_t directory_size = 0;
  uint64_t directory_xxh3 = 0;
  uint32_t version = kFormatVersion;
};

std::string EncodeShardHeader();
std::string EncodeShardFooter(const ShardFooter& footer);

// `shard` names the shard in errors. Checks the magic and that the version is one we read.
absl::Status CheckShardHeader(std::string_view header, std::string_view shard);
// `file_size` is the shard's size; the directory must lie between header and footer.
absl::StatusOr<ShardFooter> ParseShardFooter(std::string_view footer, uint64_t file_size,
                                             std::string_view shard);
absl::StatusOr<pb::ShardDirectory> ParseShardDirectory(std::string_view bytes,
                                                       const ShardFooter& footer,
                                                       uint64_t file_size, std::string_view shard);

// Parses and validates an episode index read from [index_offset, index_offset + bytes.size()).
// `expected_xxh3` comes from the directory or the manifest's episode table; checked first.
// Validation: version, episode id, data range inside the shard and before the index, every
// packet and block inside the episode's data range, column lengths equal, timestamps finite.
absl::StatusOr<pb::EpisodeIndex> ParseEpisodeIndex(std::string_view bytes, uint64_t index_offset,
                                                   uint64_t expected_xxh3,
                                                   uint64_t expected_episode_id,
                                                   uint64_t file_size, std::string_view shard);

// The checks of ParseEpisodeIndex after the protobuf parse (exposed for the writer's self-check).
absl::Status ValidateEpisodeIndex(const pb::EpisodeIndex& index, uint64_t index_offset,
                                  uint64_t file_size, std::string_view shard);

std::string_view StreamKindName(pb::StreamKind kind);  // "video", "image", ...
absl::StatusOr<pb::StreamKind> ParseStreamKind(std::string_view name);

}  // namespace conveyor::format
