// NumPy .npy files (format versions 1.0-3.0), read and written by hand: Debian 12 packages no
// C++ library for them, and the format is a short text header plus raw little-endian data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // C order, converted to float32
  std::string source_dtype;   // the dtype in the file, e.g. "<f8"
};

// Reads a numeric .npy (bool, int8..int64, uint8..uint64, float16/32/64; little-endian, C or
// Fortran order) as float32. Errors name the file and what is malformed.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
// The same from bytes; `name` is used in errors.
absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes, const std::string& name);

// Writes float32 values in C order with `shape` (format 1.0, dtype '<f4').
absl::Status WriteNpy(const std::string& path, const std::vector<int64_t>& shape,
                      const float* values);
// Raw little-endian data with a numpy dtype string ("|u1", "|b1", "<f4", "<f2", ...), C order.
// An empty `descr` (base/types.h NumpyDescr of bfloat16) is INVALID_ARGUMENT naming `path`.
absl::Status WriteNpyRaw(const std::string& path, const std::vector<int64_t>& shape,
                         std::string_view descr, const void* data, size_t bytes);
// float64 variant, used for timestamps.
absl::Status WriteNpyF64(const std::string& path, const std::vector<int64_t>& shape,
                         const double* values);

// A per-clip tensor stream's codec (a WebDataset .npy member's; datasets/webdataset/): "npy",
// the stored dtype and the stored shape, "npy <f2 77x4096" ("scalar" for a 0-d array), which the
// spec's `shape: stored` and the trainer reshape by.
std::string NpyCodec(std::string_view dtype, const std::vector<int64_t>& shape);
// The shape such a codec names ({} for "scalar"), or nullopt when `codec` is not one.
std::optional<std::vector<int64_t>> NpyCodecShape(std::string_view codec);

}  // namespace conveyor
