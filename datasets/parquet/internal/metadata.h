// The parts of Parquet's Thrift structs (parquet.thrift in apache/parquet-format) that the reader
// uses, and their decoders. Field ids are parquet.thrift's; fields not listed here are skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/parquet/parquet_file.h"

namespace conveyor::parquet::internal {

// parquet.thrift enum values.
enum class PageType : int32_t {
  kDataPage = 0,
  kIndexPage = 1,
  kDictionaryPage = 2,
  kDataPageV2 = 3
};
enum class Encoding : int32_t {
  kPlain = 0,
  kPlainDictionary = 2,
  kRle = 3,
  kBitPacked = 4,
  kDeltaBinaryPacked = 5,
  kDeltaLengthByteArray = 6,
  kDeltaByteArray = 7,
  kRleDictionary = 8,
  kByteStreamSplit = 9,
};
enum class Codec : int32_t {
  kUncompressed = 0,
  kSnappy = 1,
  kGzip = 2,
  kLzo = 3,
  kBrotli = 4,
  kLz4 = 5,
  kZstd = 6,
  kLz4Raw = 7,
};
std::string_view EncodingName(int32_t encoding);
std::string_view CodecName(int32_t codec);

struct SchemaElement {                     // SchemaElement
  std::optional<int32_t> type;             // 1: Type (physical), leaves only
  int32_t type_length = 0;                 // 2
  std::optional<int32_t> repetition_type;  // 3: FieldRepetitionType
  std::string name;                        // 4
  int32_t num_children = 0;                // 5
  std::optional<int32_t> converted_type;   // 6
  int32_t scale = 0;                       // 7
  int32_t precision = 0;                   // 8
  LogicalType logical_type;                // 10 (kind kNone when absent)
};

struct ColumnMetaData {                           // ColumnMetaData
  int32_t type = 0;                               // 1
  std::vector<std::string> path_in_schema;        // 3
  int32_t codec = 0;                              // 4
  int64_t num_values = 0;                         // 5
  int64_t total_uncompressed_size = 0;            // 6
  int64_t total_compressed_size = 0;              // 7
  int64_t data_page_offset = 0;                   // 9
  std::optional<int64_t> dictionary_page_offset;  // 11
};

struct ColumnChunk {                        // ColumnChunk
  std::string file_path;                    // 1: data in another file (unsupported when set)
  std::optional<ColumnMetaData> meta_data;  // 3
  bool encrypted = false;                   // 8 or 9 present
};

struct RowGroup {                    // RowGroup
  std::vector<ColumnChunk> columns;  // 1
  int64_t num_rows = 0;              // 3
};

struct FileMetaData {                                                   // FileMetaData
  int32_t version = 0;                                                  // 1
  std::vector<SchemaElement> schema;                                    // 2
  int64_t num_rows = 0;                                                 // 3
  std::vector<RowGroup> row_groups;                                     // 4
  std::vector<std::pair<std::string, std::string>> key_value_metadata;  // 5
  std::string created_by;                                               // 6
  bool encrypted = false;                                               // 8 present
};

struct DataPageHeader {                   // DataPageHeader
  int32_t num_values = 0;                 // 1
  int32_t encoding = 0;                   // 2
  int32_t definition_level_encoding = 0;  // 3
  int32_t repetition_level_encoding = 0;  // 4
};

struct DictionaryPageHeader {  // DictionaryPageHeader
  int32_t num_values = 0;      // 1
  int32_t encoding = 0;        // 2
};

struct DataPageHeaderV2 {                     // DataPageHeaderV2
  int32_t num_values = 0;                     // 1
  int32_t num_nulls = 0;                      // 2
  int32_t num_rows = 0;                       // 3
  int32_t encoding = 0;                       // 4
  int32_t definition_levels_byte_length = 0;  // 5
  int32_t repetition_levels_byte_length = 0;  // 6
  bool is_compressed = true;                  // 7
};

struct PageHeader {                                     // PageHeader
  int32_t type = 0;                                     // 1
  int32_t uncompressed_page_size = 0;                   // 2
  int32_t compressed_page_size = 0;                     // 3
  std::optional<DataPageHeader> data_page;              // 5
  std::optional<DictionaryPageHeader> dictionary_page;  // 7
  std::optional<DataPageHeaderV2> data_page_v2;         // 8
};

// Decode the footer (the Thrift bytes between the data and the length + "PAR1" trailer), and a
// page header at the start of `bytes` (`*header_size` receives its length). `base_offset` is the
// position of `bytes` in the file, for error messages. Required fields that are missing, negative
// sizes and counts are errors.
absl::StatusOr<FileMetaData> DecodeFileMetaData(std::string_view bytes, uint64_t base_offset);
absl::StatusOr<PageHeader> DecodePageHeader(std::string_view bytes, uint64_t base_offset,
                                            size_t* header_size);

}  // namespace conveyor::parquet::internal
