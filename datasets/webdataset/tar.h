// Tar archives read in place: where each member's bytes lie in the file, so a WebDataset sample is
// range reads of its members (docs/webdataset.md). Hand-written header parsing rather than
// libarchive: libarchive streams member data and does not say at which byte of the archive a
// member's data starts, which is all this reader needs; a header is one 512-byte block.
//
// Read: ustar and old (v7) headers, POSIX pax extended headers (`x`: path, size; `g`: global
// path-less defaults), GNU long names and long link names (`././@LongLink`, types L and K), GNU
// base-256 sizes, directory entries (skipped), zero-length members, the end-of-archive blocks.
// Every header's checksum is verified (unsigned, and the signed sum old tars wrote).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/storage.h"

namespace conveyor::webdataset {

// One regular file of the archive.
struct TarMember {
  std::string path;     // as archived (pax or GNU long name when present)
  uint64_t header = 0;  // byte offset of its (first) header, for messages
  uint64_t offset = 0;  // byte offset of its data
  uint64_t size = 0;
};

struct TarListing {
  std::vector<TarMember> members;  // regular files, in archive order
  // Entries that are neither regular files nor directories (links, devices), not read.
  std::vector<std::string> skipped;
  // Why the archive could not be read to its end (a bad header checksum, a member past the end
  // of the file, a missing end-of-archive), naming the file and the byte offset; empty when it
  // was. The members before it are listed.
  std::string error;
};

// Lists `file`'s members, reading headers (and pax/GNU name records) only, `chunk` bytes at a time
// (remote files: one range read brings the headers of many small members). A compressed archive
// (gzip, bzip2, xz, zstd) is an error saying why it cannot be read in place and what to do.
absl::StatusOr<TarListing> ListTar(const RandomAccessFile& file, size_t chunk = 1u << 20);

// The bytes [offset, offset + size) of `file` as a file of their own, named `name` (a member, for
// the demuxer): reads go to `file` at the offset; no copy. REQUIRES: `file` outlives the result.
std::unique_ptr<RandomAccessFile> SubRangeFile(const RandomAccessFile& file, uint64_t offset,
                                               uint64_t size, std::string name);

}  // namespace conveyor::webdataset
