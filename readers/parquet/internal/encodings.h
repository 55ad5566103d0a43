// Parquet's value and level encodings (Encodings.md in apache/parquet-format), decoding only.
// Each decoder reads from a borrowed buffer, checks every run and length against the bytes that
// remain, and reports errors with the byte offset relative to the start of that buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::parquet::internal {

// The RLE / bit-packed hybrid, without a length prefix: decodes exactly `count` values of
// `bit_width` bits (0..32) into `out` (which must hold `count`). Values past `count` in the last
// bit-packed run are ignored. `*consumed` (optional) receives the bytes read.
absl::Status DecodeRleHybrid(std::string_view data, int bit_width, size_t count, uint32_t* out,
                             size_t* consumed = nullptr);

// The deprecated BIT_PACKED level encoding: `count` values, most significant bit first.
absl::Status DecodeBitPackedLevels(std::string_view data, int bit_width, size_t count,
                                   uint32_t* out, size_t* consumed);

// Bits needed to store values 0..max_value.
int BitWidth(uint64_t max_value);

// DELTA_BINARY_PACKED: decodes exactly `count` values into `out` (int32 columns truncate to 32
// bits, as the encoding's wrap-around arithmetic is defined). `*consumed` receives the bytes read.
absl::Status DecodeDeltaBinaryPacked(std::string_view data, size_t count, int64_t* out,
                                     size_t* consumed);

}  // namespace conveyor::parquet::internal
