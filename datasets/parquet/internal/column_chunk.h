// One column chunk's pages decoded into a Column (docs/parquet.md): PLAIN and dictionary values,
// v1 and v2 data pages, compressed pages, and the (repetition, definition) levels assembled into
// Arrow-layout slots. Internal to the Parquet reader: parquet_file.cc finds and reads a chunk's
// bytes, this decodes them, every length checked against the bytes left and the memory budget.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "base/strings.h"
#include "datasets/parquet/internal/metadata.h"
#include "datasets/parquet/parquet_file.h"

namespace conveyor::parquet::internal {

inline uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // Parquet is little-endian, as are the machines Conveyor runs on
}

// The memory one ReadColumn call may still allocate.
class Budget {
 public:
  explicit Budget(uint64_t bytes) : left_(bytes) {}
  absl::Status Take(uint64_t bytes, std::string_view what) {
    if (bytes > left_) {
      return absl::ResourceExhaustedError(
          StrCat(what, " needs ", bytes, " bytes, beyond ParquetReadOptions::max_column_bytes (",
                 left_, " bytes left)"));
    }
    left_ -= bytes;
    return absl::OkStatus();
  }
  uint64_t left() const { return left_; }

 private:
  uint64_t left_;
};

// An empty Column::values of the alternative `type` decodes into.
ColumnValues EmptyValues(PhysicalType type);

// Decodes every page of the column chunk `chunk` (its bytes, which start at file offset
// `chunk_offset`) of column `col`, described by `meta`, appending its slots to `out`; `*rows`
// gets the rows it held. Errors start with `where` and name the page and its offset.
absl::Status DecodeColumnChunk(const std::string& where, uint64_t chunk_offset,
                               std::string_view chunk, const ColumnMetaData& meta,
                               const std::vector<SchemaNode>& schema, const ColumnDescriptor& col,
                               Budget& budget, Column* out, int64_t* rows);

}  // namespace conveyor::parquet::internal
