#include "datasets/parquet/parquet_file.h"

// The Parquet file (datasets/parquet/parquet_file.h): footer, schema, row groups and the column
// chunks' byte ranges; a chunk's pages are decoded by internal/column_chunk.cc.
#include "datasets/parquet/parquet_file.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "base/status_macros.h"
#include "base/strings.h"
#include "datasets/parquet/internal/column_chunk.h"
#include "datasets/parquet/internal/metadata.h"

namespace conveyor::parquet {

using internal::Budget;
using internal::EmptyValues;
using internal::LoadU32;

namespace {

constexpr std::string_view kMagic = "PAR1";
// Deeper schemas than this are refused: paths are stored per node, and no writer we read nests
// beyond a handful of levels.
constexpr int kMaxSchemaDepth = 64;

}  // namespace

std::string_view PhysicalTypeName(PhysicalType type) {
  switch (type) {
    case PhysicalType::kBoolean:
      return "BOOLEAN";
    case PhysicalType::kInt32:
      return "INT32";
    case PhysicalType::kInt64:
      return "INT64";
    case PhysicalType::kInt96:
      return "INT96";
    case PhysicalType::kFloat:
      return "FLOAT";
    case PhysicalType::kDouble:
      return "DOUBLE";
    case PhysicalType::kByteArray:
      return "BYTE_ARRAY";
    case PhysicalType::kFixedLenByteArray:
      return "FIXED_LEN_BYTE_ARRAY";
  }
  return "unknown";
}

std::string LogicalTypeName(const LogicalType& t) {
  using K = LogicalType::Kind;
  auto unit = [&] {
    switch (t.unit) {
      case LogicalType::TimeUnit::kMillis:
        return "MILLIS";
      case LogicalType::TimeUnit::kMicros:
        return "MICROS";
      case LogicalType::TimeUnit::kNanos:
        return "NANOS";
    }
    return "?";
  };
  switch (t.kind) {
    case K::kNone:
      return "";
    case K::kString:
      return "STRING";
    case K::kMap:
      return "MAP";
    case K::kList:
      return "LIST";
    case K::kEnum:
      return "ENUM";
    case K::kDecimal:
      return StrCat("DECIMAL(", t.decimal_precision, ",", t.decimal_scale, ")");
    case K::kDate:
      return "DATE";
    case K::kTime:
      return StrCat("TIME(", unit(), t.adjusted_to_utc ? ",UTC)" : ")");
    case K::kTimestamp:
      return StrCat("TIMESTAMP(", unit(), t.adjusted_to_utc ? ",UTC)" : ")");
    case K::kInteger:
      return StrCat("INT(", t.bit_width, t.is_signed ? ",signed)" : ",unsigned)");
    case K::kNull:
      return "NULL";
    case K::kJson:
      return "JSON";
    case K::kBson:
      return "BSON";
    case K::kUuid:
      return "UUID";
    case K::kFloat16:
      return "FLOAT16";
    case K::kOther:
      return "OTHER";
  }
  return "";
}

struct ParquetFile::Impl {
  std::string name;
  uint64_t file_size = 0;
  uint64_t data_end = 0;  // where the footer starts: column chunks lie in [4, data_end)
  ReadRangeFn read;
  ParquetReadOptions options;
  internal::FileMetaData meta;
  std::vector<SchemaNode> schema;
  std::vector<ColumnDescriptor> columns;
  // Dotted path of every node -> node index; -1 where two nodes share a dotted path.
  std::map<std::string, int, std::less<>> by_path;

  absl::Status BuildSchema();
  absl::Status CheckRowGroups() const;
  absl::Status ReadChunk(const ColumnDescriptor& col, int row_group, Budget& budget,
                         Column* out) const;
};

absl::Status ParquetFile::Impl::BuildSchema() {
  const auto& elems = meta.schema;
  if (elems.empty()) return absl::DataLossError(StrCat(name, ": the schema is empty"));
  schema.resize(elems.size());
  // Iterative depth-first walk: each stack entry is a group and how many children it still owes.
  struct Open {
    int node;
    int32_t children_left;
  };
  std::vector<Open> stack;
  std::vector<int16_t> def(elems.size(), 0), rep(elems.size(), 0);
  for (size_t i = 0; i < elems.size(); ++i) {
    const internal::SchemaElement& e = elems[i];
    SchemaNode& node = schema[i];
    node.name = e.name;
    if (i == 0) {
      if (e.num_children == 0 && !e.type) {
        // A file with no columns; valid.
      }
    } else {
      while (!stack.empty() && stack.back().children_left == 0) stack.pop_back();
      if (stack.empty()) {
        return absl::DataLossError(StrCat(name, ": schema element ", i, " ('", e.name,
                                          "') lies outside the root's children"));
      }
      --stack.back().children_left;
      node.parent = stack.back().node;
      const SchemaNode& parent = schema[node.parent];
      node.path = node.parent == 0 ? e.name : StrCat(parent.path, ".", e.name);
      if (!e.repetition_type || *e.repetition_type < 0 || *e.repetition_type > 2) {
        return absl::DataLossError(
            StrCat(name, ": schema element '", node.path, "' has no valid repetition type"));
      }
      node.repetition = static_cast<Repetition>(*e.repetition_type);
      def[i] = def[node.parent] + (node.repetition != Repetition::kRequired ? 1 : 0);
      rep[i] = rep[node.parent] + (node.repetition == Repetition::kRepeated ? 1 : 0);
      schema[node.parent].children.push_back(static_cast<int>(i));
    }
    if (stack.size() >= kMaxSchemaDepth) {
      return absl::DataLossError(StrCat(name, ": schema nested deeper than ", kMaxSchemaDepth));
    }
    node.type_length = e.type_length;
    node.converted_type =
        e.converted_type ? static_cast<ConvertedType>(*e.converted_type) : ConvertedType::kNone;
    if (e.converted_type && (*e.converted_type < 0 || *e.converted_type > 21)) {
      node.converted_type = ConvertedType::kNone;  // unknown annotation: read the physical type
    }
    node.logical_type = e.logical_type;
    const bool is_leaf = e.type.has_value() && i != 0;
    if (is_leaf) {
      if (e.num_children != 0) {
        return absl::DataLossError(
            StrCat(name, ": schema element '", node.path, "' has both a type and children"));
      }
      if (*e.type < 0 || *e.type > 7) {
        return absl::DataLossError(
            StrCat(name, ": column '", node.path, "' has unknown type ", *e.type));
      }
      node.physical_type = static_cast<PhysicalType>(*e.type);
      if (node.physical_type == PhysicalType::kFixedLenByteArray &&
          (e.type_length <= 0 || e.type_length > (1 << 20))) {
        return absl::DataLossError(StrCat(name, ": column '", node.path,
                                          "' is FIXED_LEN_BYTE_ARRAY of length ", e.type_length));
      }
      ColumnDescriptor c;
      c.index = static_cast<int>(columns.size());
      c.node = static_cast<int>(i);
      c.path = node.path;
      c.physical_type = *node.physical_type;
      c.type_length = e.type_length;
      c.converted_type = node.converted_type;
      c.logical_type = node.logical_type;
      c.max_definition_level = def[i];
      c.max_repetition_level = rep[i];
      for (int n = static_cast<int>(i); n > 0; n = schema[n].parent) {
        c.path_parts.push_back(schema[n].name);
      }
      std::reverse(c.path_parts.begin(), c.path_parts.end());
      node.column = c.index;
      columns.push_back(std::move(c));
    } else {
      if (e.num_children > static_cast<int64_t>(elems.size() - i - 1)) {
        return absl::DataLossError(StrCat(name, ": schema group '", i == 0 ? "(root)" : node.path,
                                          "' claims ", e.num_children, " children, ",
                                          elems.size() - i - 1, " elements follow"));
      }
      stack.push_back({static_cast<int>(i), e.num_children});
    }
    if (i != 0) {
      auto [it, inserted] = by_path.emplace(node.path, static_cast<int>(i));
      if (!inserted) it->second = -1;
    }
  }
  while (!stack.empty() && stack.back().children_left == 0) stack.pop_back();
  if (!stack.empty()) {
    return absl::DataLossError(StrCat(name, ": the schema ends before group '",
                                      schema[stack.back().node].path, "' has all its children"));
  }
  return absl::OkStatus();
}

absl::Status ParquetFile::Impl::CheckRowGroups() const {
  int64_t rows = 0;
  for (size_t g = 0; g < meta.row_groups.size(); ++g) {
    const internal::RowGroup& rg = meta.row_groups[g];
    const std::string where = StrCat(name, ": row group ", g);
    if (rg.columns.size() != columns.size()) {
      return absl::DataLossError(StrCat(where, " has ", rg.columns.size(),
                                        " column chunks, the schema has ", columns.size(),
                                        " columns"));
    }
    if (rg.num_rows > std::numeric_limits<int64_t>::max() - rows) {
      return absl::DataLossError(StrCat(where, ": row count overflows"));
    }
    rows += rg.num_rows;
    for (size_t c = 0; c < rg.columns.size(); ++c) {
      const internal::ColumnChunk& chunk = rg.columns[c];
      const ColumnDescriptor& col = columns[c];
      const std::string at = StrCat(where, ", column '", col.path, "'");
      if (chunk.encrypted) return absl::UnimplementedError(StrCat(at, " is encrypted"));
      if (!chunk.file_path.empty()) {
        return absl::UnimplementedError(
            StrCat(at, " lives in another file ('", chunk.file_path, "')"));
      }
      if (!chunk.meta_data) return absl::DataLossError(StrCat(at, " has no metadata"));
      const internal::ColumnMetaData& m = *chunk.meta_data;
      if (m.path_in_schema != col.path_parts) {
        return absl::DataLossError(StrCat(at, ": its chunk names another path"));
      }
      if (m.type != static_cast<int32_t>(col.physical_type)) {
        return absl::DataLossError(StrCat(at, ": chunk type ", m.type,
                                          " differs from the schema's ",
                                          PhysicalTypeName(col.physical_type)));
      }
    }
  }
  if (rows != meta.num_rows) {
    return absl::DataLossError(
        StrCat(name, ": the row groups hold ", rows, " rows, the footer says ", meta.num_rows));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParquetFile> ParquetFile::Open(std::string name, uint64_t file_size,
                                              ReadRangeFn read, const ParquetReadOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(name);
  impl->file_size = file_size;
  impl->read = std::move(read);
  impl->options = options;
  const std::string& n = impl->name;
  if (file_size < 12) {
    return absl::DataLossError(
        StrCat(n, ": ", file_size, " bytes is too small to be a Parquet file (at least 12)"));
  }
  const uint64_t tail_len =
      std::min<uint64_t>(file_size, std::max<uint64_t>(8, options.footer_read_hint));
  const uint64_t tail_offset = file_size - tail_len;
  ASSIGN_OR_RETURN(std::string tail, impl->read(tail_offset, tail_len));
  if (tail.size() != tail_len) {
    return absl::DataLossError(
        StrCat(n, ": read ", tail.size(), " bytes at ", tail_offset, ", asked for ", tail_len));
  }
  const std::string_view magic(tail.data() + tail_len - 4, 4);
  if (magic == "PARE") {
    return absl::UnimplementedError(StrCat(n, ": encrypted footers (PARE) are not supported"));
  }
  if (magic != kMagic) {
    return absl::DataLossError(
        StrCat(n, ": not a Parquet file: the last 4 bytes (at ", file_size - 4, ") are not PAR1"));
  }
  const uint64_t footer_len = LoadU32(tail.data() + tail_len - 8);
  if (footer_len > file_size - 12) {
    return absl::DataLossError(StrCat(n, ": footer length ", footer_len, " (at byte ",
                                      file_size - 8, ") exceeds the file's ", file_size,
                                      " bytes; truncated file?"));
  }
  if (tail_offset == 0 && std::string_view(tail.data(), 4) != kMagic) {
    return absl::DataLossError(StrCat(n, ": not a Parquet file: the first 4 bytes are not PAR1"));
  }
  if (footer_len > options.max_footer_bytes) {
    return absl::ResourceExhaustedError(
        StrCat(n, ": footer of ", footer_len, " bytes exceeds max_footer_bytes"));
  }
  const uint64_t footer_offset = file_size - 8 - footer_len;
  std::string footer_storage;
  std::string_view footer;
  if (footer_len + 8 <= tail_len) {
    footer = std::string_view(tail).substr(tail_len - 8 - footer_len, footer_len);
  } else {
    ASSIGN_OR_RETURN(footer_storage, impl->read(footer_offset, footer_len));
    if (footer_storage.size() != footer_len) {
      return absl::DataLossError(StrCat(n, ": read ", footer_storage.size(), " bytes at ",
                                        footer_offset, ", asked for ", footer_len));
    }
    footer = footer_storage;
  }
  impl->data_end = footer_offset;
  absl::StatusOr<internal::FileMetaData> meta = internal::DecodeFileMetaData(footer, footer_offset);
  if (!meta.ok()) return Annotate(meta.status(), StrCat(n, ": footer"));
  if (meta->encrypted) {
    return absl::UnimplementedError(StrCat(n, ": encrypted files are not supported"));
  }
  impl->meta = std::move(*meta);
  RETURN_IF_ERROR(impl->BuildSchema());
  RETURN_IF_ERROR(impl->CheckRowGroups());
  return ParquetFile(std::move(impl));
}

absl::StatusOr<ParquetFile> ParquetFile::OpenBytes(std::string name, std::string bytes,
                                                   const ParquetReadOptions& options) {
  auto shared = std::make_shared<const std::string>(std::move(bytes));
  const uint64_t size = shared->size();
  ReadRangeFn read = [shared](uint64_t offset, uint64_t length) -> absl::StatusOr<std::string> {
    if (offset > shared->size() || length > shared->size() - offset) {
      return absl::OutOfRangeError(StrCat("read of ", length, " bytes at ", offset,
                                          " past the end (", shared->size(), " bytes)"));
    }
    return shared->substr(offset, length);
  };
  return Open(std::move(name), size, std::move(read), options);
}

ParquetFile::ParquetFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ParquetFile::ParquetFile(ParquetFile&&) noexcept = default;
ParquetFile& ParquetFile::operator=(ParquetFile&&) noexcept = default;
ParquetFile::~ParquetFile() = default;

const std::string& ParquetFile::name() const { return impl_->name; }
int64_t ParquetFile::num_rows() const { return impl_->meta.num_rows; }
int ParquetFile::num_row_groups() const { return static_cast<int>(impl_->meta.row_groups.size()); }
int64_t ParquetFile::row_group_num_rows(int g) const { return impl_->meta.row_groups[g].num_rows; }
const std::string& ParquetFile::created_by() const { return impl_->meta.created_by; }
const std::vector<std::pair<std::string, std::string>>& ParquetFile::key_value_metadata() const {
  return impl_->meta.key_value_metadata;
}
const std::vector<SchemaNode>& ParquetFile::schema() const { return impl_->schema; }
const std::vector<ColumnDescriptor>& ParquetFile::columns() const { return impl_->columns; }

absl::StatusOr<const ColumnDescriptor*> ParquetFile::FindColumn(std::string_view path) const {
  auto it = impl_->by_path.find(path);
  if (it == impl_->by_path.end()) {
    std::string fields;
    for (int child : impl_->schema[0].children) {
      StrAppend(&fields, fields.empty() ? "" : ", ", impl_->schema[child].name);
    }
    return absl::NotFoundError(
        StrCat(impl_->name, ": no column '", path, "'; the top-level fields are: ", fields));
  }
  if (it->second < 0) {
    return absl::InvalidArgumentError(
        StrCat(impl_->name, ": '", path, "' names more than one schema node"));
  }
  // Descend through groups with one child (LIST -> list -> element) to a leaf.
  int node = it->second;
  std::vector<int> leaves;
  std::vector<int> todo{node};
  while (!todo.empty()) {
    const int n = todo.back();
    todo.pop_back();
    const SchemaNode& s = impl_->schema[n];
    if (s.column >= 0) leaves.push_back(s.column);
    for (int c : s.children) todo.push_back(c);
    if (leaves.size() > 1) break;
  }
  if (leaves.size() != 1) {
    return absl::InvalidArgumentError(
        StrCat(impl_->name, ": '", path, "' is a group with ",
               leaves.empty() ? "no leaf columns" : "several leaf columns; name one of them"));
  }
  return &impl_->columns[leaves[0]];
}

absl::StatusOr<Column> ParquetFile::ReadColumn(std::string_view path) const {
  ASSIGN_OR_RETURN(const ColumnDescriptor* col, FindColumn(path));
  return ReadColumn(*col, 0, num_row_groups());
}

absl::StatusOr<Column> ParquetFile::ReadColumn(std::string_view path, int row_group) const {
  ASSIGN_OR_RETURN(const ColumnDescriptor* col, FindColumn(path));
  return ReadColumn(*col, row_group, 1);
}

absl::StatusOr<Column> ParquetFile::ReadColumn(const ColumnDescriptor& column, int first_row_group,
                                               int num_row_groups) const {
  if (column.index < 0 || static_cast<size_t>(column.index) >= impl_->columns.size() ||
      impl_->columns[column.index].path != column.path) {
    return absl::InvalidArgumentError(
        StrCat(impl_->name, ": column '", column.path, "' is not one of this file's"));
  }
  if (first_row_group < 0 || num_row_groups < 0 ||
      first_row_group > this->num_row_groups() - num_row_groups) {
    return absl::OutOfRangeError(StrCat(impl_->name, ": row groups [", first_row_group, ", ",
                                        int64_t{first_row_group} + num_row_groups,
                                        ") outside the file's ", this->num_row_groups()));
  }
  const ColumnDescriptor& col = impl_->columns[column.index];
  Column out;
  out.descriptor = col;
  out.values = EmptyValues(col.physical_type);
  Budget budget(impl_->options.max_column_bytes);
  for (int g = first_row_group; g < first_row_group + num_row_groups; ++g) {
    RETURN_IF_ERROR(impl_->ReadChunk(col, g, budget, &out));
  }
  out.null_count = static_cast<int64_t>(std::count(out.valid.begin(), out.valid.end(), 0));
  return out;
}

absl::Status ParquetFile::Impl::ReadChunk(const ColumnDescriptor& col, int row_group,
                                          Budget& budget, Column* out) const {
  const internal::RowGroup& rg = meta.row_groups[row_group];
  const internal::ColumnMetaData& m = *rg.columns[col.index].meta_data;
  std::string where = StrCat(name, ": row group ", row_group, ", column '", col.path, "'");
  // The chunk starts at its dictionary page when it has one (some writers put a dictionary page
  // offset of 0 for "none").
  uint64_t start = static_cast<uint64_t>(m.data_page_offset);
  if (m.dictionary_page_offset && *m.dictionary_page_offset > 0 &&
      static_cast<uint64_t>(*m.dictionary_page_offset) < start) {
    start = static_cast<uint64_t>(*m.dictionary_page_offset);
  }
  const uint64_t length = static_cast<uint64_t>(m.total_compressed_size);
  if (start < 4 || start > data_end || length > data_end - start) {
    return absl::DataLossError(StrCat(where, ": column chunk [", start, ", +", length,
                                      ") lies outside the data section [4, ", data_end,
                                      "); truncated file?"));
  }
  RETURN_IF_ERROR(Annotate(budget.Take(length, "the column chunk"), where));
  ASSIGN_OR_RETURN(const std::string chunk, read(start, length));
  if (chunk.size() != length) {
    return absl::DataLossError(
        StrCat(where, ": read ", chunk.size(), " bytes at ", start, ", asked for ", length));
  }
  int64_t rows = 0;
  RETURN_IF_ERROR(internal::DecodeColumnChunk(where, start, chunk, m, schema, col, budget, out, &rows));
  if (rows != rg.num_rows) {
    return absl::DataLossError(StrCat(where, ": ", rows, " rows, the row group has ", rg.num_rows));
  }
  out->num_rows += rows;
  return absl::OkStatus();
}

}  // namespace conveyor::parquet
