// Parquet files, read by hand: the subset that LeRobot (through pyarrow / Hugging Face datasets)
// and similar writers produce. Debian 12 packages no C++ Parquet library; docs/parquet.md lists
// what is supported and why the Thrift footer is decoded by our own bounded decoder.
//
// A file is opened over a range-read callback, so that only the footer and the column chunks a
// caller asks for are read (the file may sit on HTTP or S3). Columns come back in Arrow's layout:
// one slot per value with a validity byte, and for list columns one offsets array per level of
// nesting.
//
// Malformed input never crashes: every size and count read from the file is checked against the
// bytes present (and against ParquetReadOptions' limits) before anything is allocated, and every
// error names the file, and where it applies the row group, column, page and byte offset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::parquet {

// Physical types; the values are parquet.thrift's `Type`.
enum class PhysicalType : int32_t {
  kBoolean = 0,
  kInt32 = 1,
  kInt64 = 2,
  kInt96 = 3,
  kFloat = 4,
  kDouble = 5,
  kByteArray = 6,
  kFixedLenByteArray = 7,
};
std::string_view PhysicalTypeName(PhysicalType type);

// parquet.thrift's FieldRepetitionType.
enum class Repetition : int32_t { kRequired = 0, kOptional = 1, kRepeated = 2 };

// The legacy annotation (parquet.thrift's ConvertedType); kNone when absent.
enum class ConvertedType : int32_t {
  kNone = -1,
  kUtf8 = 0,
  kMap = 1,
  kMapKeyValue = 2,
  kList = 3,
  kEnum = 4,
  kDecimal = 5,
  kDate = 6,
  kTimeMillis = 7,
  kTimeMicros = 8,
  kTimestampMillis = 9,
  kTimestampMicros = 10,
  kUint8 = 11,
  kUint16 = 12,
  kUint32 = 13,
  kUint64 = 14,
  kInt8 = 15,
  kInt16 = 16,
  kInt32 = 17,
  kInt64 = 18,
  kJson = 19,
  kBson = 20,
  kInterval = 21,
};

// The logical type annotation (parquet.thrift's LogicalType union).
struct LogicalType {
  enum class Kind {
    kNone,  // no annotation
    kString,
    kMap,
    kList,
    kEnum,
    kDecimal,
    kDate,
    kTime,
    kTimestamp,
    kInteger,
    kNull,  // parquet.thrift's UNKNOWN: always null
    kJson,
    kBson,
    kUuid,
    kFloat16,
    kOther,  // an annotation this reader does not interpret (VARIANT, GEOMETRY, ...)
  };
  enum class TimeUnit { kMillis, kMicros, kNanos };

  Kind kind = Kind::kNone;
  int32_t decimal_scale = 0;          // kDecimal
  int32_t decimal_precision = 0;      // kDecimal
  TimeUnit unit = TimeUnit::kMillis;  // kTime, kTimestamp
  bool adjusted_to_utc = false;       // kTime, kTimestamp
  int32_t bit_width = 0;              // kInteger: 8, 16, 32 or 64
  bool is_signed = true;              // kInteger
};
// "STRING", "LIST", "TIMESTAMP(MICROS,UTC)", "INT(8,unsigned)", ... ("" for kNone).
std::string LogicalTypeName(const LogicalType& type);

// One node of the schema tree (the file's SchemaElement list, linked). Node 0 is the root.
struct SchemaNode {
  std::string name;
  // Dotted path from the root's child down to this node, e.g. "observation.state.list.element".
  // Names may themselves contain dots (LeRobot's "observation.state" is one top-level name).
  std::string path;
  Repetition repetition = Repetition::kRequired;  // the root: kRequired
  std::optional<PhysicalType> physical_type;      // leaves only
  int32_t type_length = 0;                        // FIXED_LEN_BYTE_ARRAY width
  ConvertedType converted_type = ConvertedType::kNone;
  LogicalType logical_type;
  int parent = -1;  // -1 for the root
  std::vector<int> children;
  int column = -1;  // for leaves: the index into ParquetFile::columns()
};

// A leaf column: what one column chunk per row group holds.
struct ColumnDescriptor {
  int index = 0;     // position among the leaves, and of its chunk in every row group
  int node = 0;      // its SchemaNode
  std::string path;  // dotted physical path, e.g. "action.list.element"
  std::vector<std::string> path_parts;  // the names along that path
  PhysicalType physical_type = PhysicalType::kInt32;
  int32_t type_length = 0;
  ConvertedType converted_type = ConvertedType::kNone;
  LogicalType logical_type;
  int16_t max_definition_level = 0;
  int16_t max_repetition_level = 0;  // the number of lists the values are nested in
};

// BYTE_ARRAY (and FIXED_LEN_BYTE_ARRAY, INT96) values: value i is
// data[offsets[i], offsets[i+1]). offsets has size() + 1 entries.
struct BinaryValues {
  std::vector<int64_t> offsets{0};
  std::string data;

  size_t size() const { return offsets.size() - 1; }
  // REQUIRES: i < size(). The view is valid while this object lives and is not modified.
  std::string_view operator[](size_t i) const {
    return std::string_view(data).substr(offsets[i], offsets[i + 1] - offsets[i]);
  }
};

// Values by physical type: BOOLEAN as uint8_t (0 or 1), INT32, INT64, FLOAT, DOUBLE as themselves,
// BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY and INT96 (12 raw bytes) as BinaryValues.
using ColumnValues = std::variant<std::vector<uint8_t>, std::vector<int32_t>, std::vector<int64_t>,
                                  std::vector<float>, std::vector<double>, BinaryValues>;

// One level of list nesting, in Arrow's list layout. Level 0's slots are the rows; the slots of
// level k+1 are the elements of level k's lists; the innermost level's elements are value slots.
struct ListLevel {
  // List slot i holds the child slots [offsets[i], offsets[i+1]). size: slots + 1.
  std::vector<int64_t> offsets{0};
  // Per slot: 1 when it holds a list (possibly empty), 0 when it is null.
  std::vector<uint8_t> valid;
};

// A column read from one or more row groups.
struct Column {
  ColumnDescriptor descriptor;
  int64_t num_rows = 0;
  // One entry per repeated node on the path, outermost first; empty for a flat column.
  std::vector<ListLevel> lists;
  // One slot per value: rows for a flat column, the innermost lists' elements otherwise. A null
  // slot (valid 0) holds 0 or an empty string in `values`.
  std::vector<uint8_t> valid;
  ColumnValues values;
  int64_t null_count = 0;  // value slots with valid 0

  size_t size() const { return valid.size(); }
};

// A range read: exactly `length` bytes at `offset`, or an error. Called from ReadColumn's thread.
using ReadRangeFn = std::function<absl::StatusOr<std::string>(uint64_t offset, uint64_t length)>;

struct ParquetReadOptions {
  // Bytes read from the end of the file in Open's first request, so that a footer up to this size
  // costs one read instead of two (a round trip over HTTP). Default 64 KiB.
  uint64_t footer_read_hint = 64 << 10;
  // Largest footer accepted. Default 64 MiB; LeRobot's footers are a few KiB.
  uint64_t max_footer_bytes = 64 << 20;
  // Bound on the bytes one ReadColumn call may allocate: decompressed pages, levels and decoded
  // values. Run-length encoding lets a few bytes claim billions of values; this bound turns such a
  // file into a RESOURCE_EXHAUSTED error instead of an out-of-memory kill. Default 4 GiB.
  uint64_t max_column_bytes = uint64_t{4} << 30;
};

// An open Parquet file: the decoded footer and the callback to read column chunks with.
// Thread-safety: const methods may be called concurrently when the ReadRangeFn is thread-safe.
class ParquetFile {
 public:
  // Reads the footer with at most two calls to `read` (see footer_read_hint). `name` is used in
  // every error message; `file_size` is the size of the file in bytes.
  static absl::StatusOr<ParquetFile> Open(std::string name, uint64_t file_size, ReadRangeFn read,
                                          const ParquetReadOptions& options = {});
  // The same over a file already in memory.
  static absl::StatusOr<ParquetFile> OpenBytes(std::string name, std::string bytes,
                                               const ParquetReadOptions& options = {});

  ParquetFile(ParquetFile&&) noexcept;
  ParquetFile& operator=(ParquetFile&&) noexcept;
  ~ParquetFile();

  const std::string& name() const;
  int64_t num_rows() const;
  int num_row_groups() const;
  int64_t row_group_num_rows(int row_group) const;  // REQUIRES: 0 <= row_group < num_row_groups()
  const std::string& created_by() const;
  // Key-value metadata of the file (pyarrow's "ARROW:schema", pandas' "pandas", HF's
  // "huggingface"), in file order.
  const std::vector<std::pair<std::string, std::string>>& key_value_metadata() const;

  // The schema tree; schema()[0] is the root.
  const std::vector<SchemaNode>& schema() const;
  // The leaf columns, in file order.
  const std::vector<ColumnDescriptor>& columns() const;

  // The leaf a dotted path names: the leaf's own path ("observation.state.list.element"), or a
  // group with exactly one leaf below it ("observation.state", a LIST of floats). NOT_FOUND names
  // the top-level fields; INVALID_ARGUMENT when the group has several leaves (a struct).
  absl::StatusOr<const ColumnDescriptor*> FindColumn(std::string_view path) const;

  // Reads a column from every row group, or from one.
  absl::StatusOr<Column> ReadColumn(std::string_view path) const;
  absl::StatusOr<Column> ReadColumn(std::string_view path, int row_group) const;
  absl::StatusOr<Column> ReadColumn(const ColumnDescriptor& column, int first_row_group,
                                    int num_row_groups) const;

 private:
  struct Impl;
  explicit ParquetFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::parquet
