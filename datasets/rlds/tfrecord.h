// TFRecord framing (what tf.io.TFRecordWriter writes, and every RLDS / TFDS shard is):
//
//   uint64 length (little-endian) | uint32 masked CRC32C of the 8 length bytes |
//   length bytes of data          | uint32 masked CRC32C of the data
//
// masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Both checksums are checked on every read.
//
// CRC32C (Castagnoli) is written here: Debian 12 packages no C or C++ CRC32C library (google's
// crc32c is not packaged and abseil 20220623 predates absl/crc). It uses the SSE4.2 crc32
// instruction where the CPU has it (about 20 GB/s a core) and a table otherwise; the tests check
// it against python3-crc32c, and TFRecord files written by the tests' python writer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <algorithm>
#include <cstring>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "storage/storage.h"

namespace conveyor::rlds {

uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t MaskedCrc32c(const void* data, size_t n);

inline constexpr size_t kRecordHeaderBytes = 12;   // length + its CRC
inline constexpr size_t kRecordOverheadBytes = 16;  // header + data CRC

// One record of a shard: where its frame starts and how long its data is.
struct RecordRef {
  uint64_t offset = 0;  // of the frame (the length field)
  uint64_t length = 0;  // data bytes
  uint64_t frame_bytes() const { return length + kRecordOverheadBytes; }
};

// Reads the records of `file` in order, `chunk_bytes` at a time, calling `visit(ref, data)` for
// each: `data` is the record's bytes (valid during the call) or, when its data CRC does not match,
// that DATA_LOSS error (the framing is intact, so the scan goes on). A length whose CRC does not
// match, a length past the end of the file or a truncated last record is a DATA_LOSS error naming
// the file, the record's number and its byte offset, and ends the scan: nothing after it can be
// found. `visit` may return an error, which stops the scan.
template <typename Visit>
absl::Status ScanRecords(const RandomAccessFile& file, size_t chunk_bytes, Visit visit);

// Checks a record's frame (header and data CRCs) in `frame` (frame_bytes() long) and returns the
// data within it. `where` names the record in errors.
absl::StatusOr<std::string_view> CheckFrame(std::string_view frame, uint64_t expected_length,
                                            const std::string& where);

// Parses the 12-byte header at `header`: the data length, its CRC checked.
absl::StatusOr<uint64_t> ParseHeader(const char* header, const std::string& where);

// ScanRecords: a template, so the visitor is inlined.

template <typename Visit>
absl::Status ScanRecords(const RandomAccessFile& file, size_t chunk_bytes, Visit visit) {
  const uint64_t size = file.size();
  std::string buf;             // bytes [buf_start, buf_start + buf.size()) of the file
  uint64_t buf_start = 0;
  uint64_t pos = 0;
  uint64_t record = 0;
  // Makes bytes [pos, pos + n) available in buf.
  auto ensure = [&](uint64_t n) -> absl::Status {
    if (pos >= buf_start && pos + n <= buf_start + buf.size()) return absl::OkStatus();
    const uint64_t keep_from = pos - buf_start;
    std::string next;
    const uint64_t want = std::max<uint64_t>(n, chunk_bytes);
    const uint64_t avail = std::min<uint64_t>(want, size - pos);
    next.resize(avail);
    const uint64_t have = buf_start + buf.size() > pos ? buf_start + buf.size() - pos : 0;
    if (have > 0) std::memcpy(next.data(), buf.data() + keep_from, have);
    if (avail > have) RETURN_IF_ERROR(file.Read(pos + have, avail - have, next.data() + have));
    buf = std::move(next);
    buf_start = pos;
    return absl::OkStatus();
  };
  while (pos < size) {
    const std::string where = StrCat(file.name(), ", record ", record, " at byte ", pos);
    if (size - pos < kRecordHeaderBytes) {
      return absl::DataLossError(StrCat(where, ": ", size - pos, " bytes left, a record header ",
                                        "needs 12 (the file is truncated)"));
    }
    RETURN_IF_ERROR(ensure(kRecordHeaderBytes));
    ASSIGN_OR_RETURN(uint64_t length, ParseHeader(buf.data() + (pos - buf_start), where));
    if (length > size - pos - kRecordHeaderBytes ||
        size - pos - kRecordHeaderBytes - length < 4) {
      return absl::DataLossError(StrCat(where, ": the record says ", length, " bytes of data but ",
                                        size - pos, " bytes are left in the file (truncated)"));
    }
    const RecordRef ref{pos, length};
    RETURN_IF_ERROR(ensure(ref.frame_bytes()));
    const std::string_view frame(buf.data() + (pos - buf_start), ref.frame_bytes());
    RETURN_IF_ERROR(visit(ref, CheckFrame(frame, length, where)));
    pos += ref.frame_bytes();
    ++record;
  }
  return absl::OkStatus();
}

}  // namespace conveyor::rlds
