// The member index of one WebDataset shard set: the tar files of one shard name across the
// dataset's columns (Cosmos-Curate's video/part_0/0.tar, metas/part_0/0.tar, ...), their members
// grouped into samples by key, and what probing each member found (a video's packet table, an
// image's size, a .npy's dtype and shape, a JSON's fields). Built once by reading the tars through
// and kept as one file in the index cache (lerobot::IndexCacheDir), keyed by every tar's name,
// size and version (mtime or ETag), so the next open reads that file and no tar.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/webdataset/tar.h"
#include "storage/storage.h"

namespace conveyor::webdataset {

// One member of a sample.
struct MemberRef {
  std::string ext;      // the name after the key: "mp4", "json", "t5_xxl.npy"
  uint32_t column = 0;  // which tar of the shard set holds it
  uint64_t offset = 0;  // data offset in that tar
  uint64_t size = 0;
  // What probing found (ProbeMember's result). Where the index has a cache file, facts_at is the
  // byte offset of these bytes in it (0: not in a file), so a caller may drop large facts from
  // memory and read them back by position.
  std::string facts;
  uint64_t facts_at = 0;
  // The whole facts' size and XXH3-64, for a caller that cut `facts` to a prefix (set by it).
  uint64_t facts_size = 0, facts_xxh3 = 0;
};

struct SampleEntry {
  std::string key;    // the members' common path up to the first dot of the basename
  std::string error;  // why the sample cannot be read ("" when it can), naming shard and member
  std::vector<MemberRef> members;
};

struct ShardSetIndex {
  std::vector<SampleEntry> samples;  // in order of the first appearance of each key
  std::vector<std::string> skipped;  // tar entries that are not regular files or directories
  std::string cache_path;            // the cache file the facts_at offsets point into ("": none)
  bool from_cache = false;
};

// Probes one member: its facts (any bytes the caller can read back), or why it is unreadable.
// `shard` is the tar holding it; `where` names the shard, key and member.
using MemberProber = std::function<absl::StatusOr<std::string>(
    const RandomAccessFile& shard, const TarMember& member, std::string_view ext,
    const std::string& where)>;

// The index of the shard set `tars` (one per column, all present): from `cache_dir` (empty: none)
// when an entry for these files is there and intact, else built by listing every tar and probing
// every member (and then written there). A compressed tar is an error (tar.h); a damaged one
// lists the samples before the damage and a broken sample that names it.
absl::StatusOr<ShardSetIndex> IndexShardSet(const std::vector<const RandomAccessFile*>& tars,
                                            const std::string& cache_dir,
                                            const MemberProber& probe);

// Splits a member path into the WebDataset key and extension: the key is the path up to the
// first dot of the basename, the extension the rest ("a/b.c.d" -> "a/b", "c.d"). A basename
// without a dot has an empty extension.
std::pair<std::string, std::string> SplitKey(std::string_view path);

}  // namespace conveyor::webdataset
