// A bounded, exception-free reader of the Thrift compact protocol, enough for Parquet's footer and
// page headers (docs/parquet.md says why this is not libthrift).
//
// Every length and element count read from the input is checked against the bytes that remain
// before anything is allocated or skipped, nesting is limited, and every failure is a Status that
// names the byte offset (relative to the start of the buffer given to the reader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::parquet::internal {

// Compact protocol type ids, as they appear in field headers and list headers.
enum class ThriftType : uint8_t {
  kStop = 0,
  kBoolTrue = 1,  // in a field header: a bool field whose value is true
  kBoolFalse = 2,
  kByte = 3,
  kI16 = 4,
  kI32 = 5,
  kI64 = 6,
  kDouble = 7,
  kBinary = 8,
  kList = 9,
  kSet = 10,
  kMap = 11,
  kStruct = 12,
};

// Reads values from one contiguous buffer. Not thread-safe; cheap to create.
// The buffer is borrowed: it must outlive the reader and every string_view it returns.
class CompactReader {
 public:
  // `base_offset` is added to positions in error messages (e.g. the footer's offset in the file).
  explicit CompactReader(std::string_view data, uint64_t base_offset = 0)
      : data_(data), base_offset_(base_offset) {}

  // Reads one struct: calls `on_field(id, type)` for each field, which must consume the field's
  // value with one of the Read* calls below or with Skip(type). Fields it does not know it should
  // Skip. Nested ReadStruct calls count against the nesting limit.
  absl::Status ReadStruct(absl::FunctionRef<absl::Status(int16_t id, ThriftType type)> on_field);

  // Values. `type` is the type from the field header (or list element type) and is checked.
  absl::StatusOr<bool> ReadBool(ThriftType type);
  absl::StatusOr<int32_t> ReadI32(ThriftType type);  // accepts byte, i16 and i32
  absl::StatusOr<int64_t> ReadI64(ThriftType type);  // accepts byte, i16, i32 and i64
  // A binary/string value; the view points into the buffer.
  absl::StatusOr<std::string_view> ReadBinary(ThriftType type);

  struct ListHeader {
    ThriftType element_type;
    uint32_t size;  // checked: at most the number of bytes that remain
  };
  absl::StatusOr<ListHeader> ReadListHeader(ThriftType type);

  // Skips one value of `type` (a field or a list element), however deeply nested, within limits.
  absl::Status Skip(ThriftType type);

  // Bytes consumed so far.
  size_t position() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }

  // An error at the current position: "<what> at byte N".
  absl::Status Error(std::string_view what) const;

 private:
  absl::StatusOr<uint64_t> ReadVarint();
  absl::StatusOr<int64_t> ReadZigZag();
  absl::Status SkipDepth(ThriftType type, int depth, bool list_element);
  absl::Status ReadStructDepth(absl::FunctionRef<absl::Status(int16_t, ThriftType)> on_field,
                               int depth);

  std::string_view data_;
  uint64_t base_offset_;
  size_t pos_ = 0;
  int depth_ = 0;  // nesting of ReadStruct calls in progress
};

// The deepest nesting of structs, lists and maps accepted (Parquet's own structs nest < 10 deep).
inline constexpr int kMaxThriftDepth = 32;

}  // namespace conveyor::parquet::internal
