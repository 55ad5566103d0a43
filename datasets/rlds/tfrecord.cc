#include "datasets/rlds/tfrecord.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace conveyor::rlds {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // CRC32C, reflected
constexpr uint32_t kMaskDelta = 0xa282ead8;

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t TableCrc(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t HardwareCrc(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}

bool HasSse42() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  return (c & bit_SSE4_2) != 0;
}
#endif

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = HasSse42();
  crc = hw ? HardwareCrc(p, n, crc) : TableCrc(p, n, crc);
#else
  crc = TableCrc(p, n, crc);
#endif
  return ~crc;
}

uint32_t MaskedCrc32c(const void* data, size_t n) {
  const uint32_t c = Crc32c(data, n);
  return ((c >> 15) | (c << 17)) + kMaskDelta;
}

absl::StatusOr<uint64_t> ParseHeader(const char* header, const std::string& where) {
  uint64_t length = 0;
  uint32_t crc = 0;
  std::memcpy(&length, header, 8);  // little-endian on every machine Conveyor builds for
  std::memcpy(&crc, header + 8, 4);
  if (MaskedCrc32c(header, 8) != crc) {
    return absl::DataLossError(StrCat(where, ": the length's CRC32C does not match (a corrupt ",
                                      "or misaligned record; is this a TFRecord file?)"));
  }
  return length;
}

absl::StatusOr<std::string_view> CheckFrame(std::string_view frame, uint64_t expected_length,
                                            const std::string& where) {
  if (frame.size() != expected_length + kRecordOverheadBytes) {
    return absl::DataLossError(StrCat(where, ": ", frame.size(), " bytes read, the record needs ",
                                      expected_length + kRecordOverheadBytes));
  }
  ASSIGN_OR_RETURN(uint64_t length, ParseHeader(frame.data(), where));
  if (length != expected_length) {
    return absl::DataLossError(StrCat(where, ": the record's length is ", length,
                                      ", its index says ", expected_length,
                                      " (the shard changed after it was indexed)"));
  }
  const std::string_view data = frame.substr(kRecordHeaderBytes, length);
  uint32_t crc = 0;
  std::memcpy(&crc, frame.data() + kRecordHeaderBytes + length, 4);
  if (MaskedCrc32c(data.data(), data.size()) != crc) {
    return absl::DataLossError(StrCat(where, ": the data's CRC32C does not match (", length,
                                      " bytes; the record is corrupt)"));
  }
  return data;
}

}  // namespace conveyor::rlds
