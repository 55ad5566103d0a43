// Fuzzes the Parquet reader (datasets/parquet): any bytes, opened as a file, must open or be
// refused, and every column must read or be refused, within the memory limits, never reading out
// of bounds or hitting undefined behaviour. Each input is opened twice: with the footer in the
// first range read, and with a tiny first read so that the footer needs a second.
#include <cstddef>
#include <cstdint>
#include <string>

#include "datasets/parquet/parquet_file.h"

namespace {

void ReadEverything(const std::string& bytes, uint64_t footer_read_hint) {
  conveyor::parquet::ParquetReadOptions options;
  options.footer_read_hint = footer_read_hint;
  options.max_footer_bytes = 1 << 20;
  options.max_column_bytes = 64 << 20;  // within -rss_limit_mb with the sanitizers' overhead
  absl::StatusOr<conveyor::parquet::ParquetFile> file =
      conveyor::parquet::ParquetFile::OpenBytes("fuzz.parquet", bytes, options);
  if (!file.ok()) return;
  for (const conveyor::parquet::SchemaNode& node : file->schema()) {
    (void)file->FindColumn(node.path);
  }
  for (const conveyor::parquet::ColumnDescriptor& column : file->columns()) {
    absl::StatusOr<conveyor::parquet::Column> c =
        file->ReadColumn(column, 0, file->num_row_groups());
    if (!c.ok()) continue;
    // The layout's invariants hold for whatever was accepted.
    size_t values = std::visit([](const auto& v) { return v.size(); }, c->values);
    if (values != c->valid.size()) __builtin_trap();
    for (size_t k = 0; k < c->lists.size(); ++k) {
      const auto& level = c->lists[k];
      if (level.offsets.size() != level.valid.size() + 1) __builtin_trap();
      const size_t children =
          k + 1 < c->lists.size() ? c->lists[k + 1].valid.size() : c->valid.size();
      if (static_cast<size_t>(level.offsets.back()) != children) __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ReadEverything(bytes, 64 << 10);
  ReadEverything(bytes, 8);
  return 0;
}
