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
#include "datasets/parquet/parquet_file.h"

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
// bits, as the encoding's wrap-around arithmetic is defined). The header's value count must be
// `count`. `*consumed` receives the bytes read.
absl::Status DecodeDeltaBinaryPacked(std::string_view data, size_t count, int64_t* out,
                                     size_t* consumed);

// DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY: append `count` values to `out`. Decoded bytes
// beyond `max_bytes` are a RESOURCE_EXHAUSTED error (DELTA_BYTE_ARRAY's shared prefixes let a small
// input expand without bound).
absl::Status DecodeDeltaLengthByteArray(std::string_view data, size_t count, uint64_t max_bytes,
                                        BinaryValues* out, size_t* consumed);
absl::Status DecodeDeltaByteArray(std::string_view data, size_t count, uint64_t max_bytes,
                                  BinaryValues* out);

// BYTE_STREAM_SPLIT: `count` values of `width` bytes, byte b of value i at data[b * count + i],
// written to `out` (count * width bytes) in the usual order.
absl::Status DecodeByteStreamSplit(std::string_view data, size_t count, size_t width, char* out);

}  // namespace conveyor::parquet::internal
