#include "datasets/parquet/parquet_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>
#include <utility>

#include "base/status_macros.h"
#include "base/strings.h"
#include "datasets/parquet/internal/compression.h"
#include "datasets/parquet/internal/encodings.h"
#include "datasets/parquet/internal/metadata.h"

namespace conveyor::parquet {

using internal::Encoding;
using internal::PageType;

namespace {

constexpr std::string_view kMagic = "PAR1";
// Deeper schemas than this are refused: paths are stored per node, and no writer we read nests
// beyond a handful of levels.
constexpr int kMaxSchemaDepth = 64;

uint32_t LoadU32(const char* p) {
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

size_t PhysicalWidth(PhysicalType type, int32_t type_length) {
  switch (type) {
    case PhysicalType::kInt32:
    case PhysicalType::kFloat:
      return 4;
    case PhysicalType::kInt64:
    case PhysicalType::kDouble:
      return 8;
    case PhysicalType::kInt96:
      return 12;
    case PhysicalType::kFixedLenByteArray:
      return static_cast<size_t>(type_length);
    case PhysicalType::kBoolean:
    case PhysicalType::kByteArray:
      return 0;
  }
  return 0;
}

ColumnValues EmptyValues(PhysicalType type) {
  switch (type) {
    case PhysicalType::kBoolean:
      return std::vector<uint8_t>();
    case PhysicalType::kInt32:
      return std::vector<int32_t>();
    case PhysicalType::kInt64:
      return std::vector<int64_t>();
    case PhysicalType::kFloat:
      return std::vector<float>();
    case PhysicalType::kDouble:
      return std::vector<double>();
    default:
      return BinaryValues();
  }
}

size_t ValuesSize(const ColumnValues& v) {
  return std::visit([](const auto& x) { return x.size(); }, v);
}

// Decodes `count` PLAIN values from `data` and appends them to `out`; `*consumed` gets the bytes.
absl::Status DecodePlain(std::string_view data, PhysicalType type, int32_t type_length,
                         size_t count, ColumnValues* out, size_t* consumed) {
  switch (type) {
    case PhysicalType::kBoolean: {
      const size_t bytes = (count + 7) / 8;
      if (bytes > data.size()) {
        return absl::DataLossError(
            StrCat(count, " PLAIN booleans need ", bytes, " bytes, ", data.size(), " present"));
      }
      auto& v = std::get<std::vector<uint8_t>>(*out);
      const size_t base = v.size();
      v.resize(base + count);
      for (size_t i = 0; i < count; ++i) {
        v[base + i] = (static_cast<uint8_t>(data[i / 8]) >> (i % 8)) & 1;
      }
      *consumed = bytes;
      return absl::OkStatus();
    }
    case PhysicalType::kByteArray: {
      auto& v = std::get<BinaryValues>(*out);
      size_t pos = 0;
      for (size_t i = 0; i < count; ++i) {
        if (data.size() - pos < 4) {
          return absl::DataLossError(StrCat("BYTE_ARRAY value ", i, " of ", count,
                                            ": length runs past the end (byte ", pos, ")"));
        }
        const uint32_t len = LoadU32(data.data() + pos);
        pos += 4;
        if (len > data.size() - pos) {
          return absl::DataLossError(StrCat("BYTE_ARRAY value ", i, " of ", count, ": ", len,
                                            " bytes with ", data.size() - pos, " left (byte ",
                                            pos - 4, ")"));
        }
        v.data.append(data.data() + pos, len);
        v.offsets.push_back(static_cast<int64_t>(v.data.size()));
        pos += len;
      }
      *consumed = pos;
      return absl::OkStatus();
    }
    case PhysicalType::kInt96:
    case PhysicalType::kFixedLenByteArray: {
      const size_t width = PhysicalWidth(type, type_length);
      if (width != 0 && count > data.size() / width) {
        return absl::DataLossError(
            StrCat(count, " values of ", width, " bytes with ", data.size(), " bytes present"));
      }
      auto& v = std::get<BinaryValues>(*out);
      v.data.append(data.data(), count * width);
      for (size_t i = 0; i < count; ++i) {
        v.offsets.push_back(v.offsets.back() + static_cast<int64_t>(width));
      }
      *consumed = count * width;
      return absl::OkStatus();
    }
    default:
      return std::visit(
          [&](auto& v) -> absl::Status {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, BinaryValues>) {
              return absl::InternalError("binary values for a fixed-width type");
            } else {
              using T = typename V::value_type;
              if (count > data.size() / sizeof(T)) {
                return absl::DataLossError(StrCat(count, " PLAIN values of ", sizeof(T),
                                                  " bytes with ", data.size(), " bytes present"));
              }
              const size_t base = v.size();
              v.resize(base + count);
              if (count > 0) std::memcpy(v.data() + base, data.data(), count * sizeof(T));
              *consumed = count * sizeof(T);
              return absl::OkStatus();
            }
          },
          *out);
  }
}

// Appends dict[indices[i]] for each index to `out` (same alternative as `dict`).
// Strings cost their bytes, charged to `budget` first: a run of a few bytes can repeat a long
// dictionary entry a billion times.
absl::Status GatherDictionary(const ColumnValues& dict, const uint32_t* indices, size_t count,
                              Budget& budget, ColumnValues* out) {
  const size_t dict_size = ValuesSize(dict);
  for (size_t i = 0; i < count; ++i) {
    if (indices[i] >= dict_size) {
      return absl::DataLossError(StrCat("dictionary index ", indices[i], " (value ", i,
                                        ") past the dictionary's ", dict_size, " entries"));
    }
  }
  return std::visit(
      [&](auto& o) -> absl::Status {
        using V = std::decay_t<decltype(o)>;
        const V& d = std::get<V>(dict);
        if constexpr (std::is_same_v<V, BinaryValues>) {
          uint64_t bytes = 0;
          for (size_t i = 0; i < count; ++i) bytes += d[indices[i]].size();
          RETURN_IF_ERROR(budget.Take(bytes, "strings from the dictionary"));
          for (size_t i = 0; i < count; ++i) {
            const std::string_view s = d[indices[i]];
            o.data.append(s.data(), s.size());
            o.offsets.push_back(static_cast<int64_t>(o.data.size()));
          }
        } else {
          const size_t base = o.size();
          o.resize(base + count);
          for (size_t i = 0; i < count; ++i) o[base + i] = d[indices[i]];
        }
        return absl::OkStatus();
      },
      *out);
}

// The bytes value `count` values of this type occupy at least when decoded (binary: offsets).
uint64_t DecodedBytesPerValue(PhysicalType type, int32_t type_length) {
  switch (type) {
    case PhysicalType::kBoolean:
      return 1;
    case PhysicalType::kByteArray:
      return 8;
    case PhysicalType::kInt96:
    case PhysicalType::kFixedLenByteArray:
      return 8 + PhysicalWidth(type, type_length);
    default:
      return PhysicalWidth(type, type_length);
  }
}

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

namespace {

// Assembles Arrow-layout slots from (repetition, definition) level pairs, one column chunk after
// another. See docs/parquet.md ("Levels to lists").
class LevelAssembler {
 public:
  LevelAssembler(const std::vector<SchemaNode>& schema, const ColumnDescriptor& col, Column* out)
      : out_(out), max_def_(col.max_definition_level), max_rep_(col.max_repetition_level) {
    // Walk the path root -> leaf, recording the definition level above and including each
    // repeated node.
    std::vector<int> path;
    for (int n = col.node; n > 0; n = schema[n].parent) path.push_back(n);
    std::reverse(path.begin(), path.end());
    int16_t def = 0;
    for (int n : path) {
      const Repetition r = schema[n].repetition;
      if (r == Repetition::kRepeated) {
        def_before_.push_back(def);
        def_incl_.push_back(static_cast<int16_t>(def + 1));
      }
      if (r != Repetition::kRequired) ++def;
    }
    out_->lists.resize(max_rep_);
  }

  // Starts a column chunk: its first level must begin a row.
  void StartChunk() { chunk_started_ = false; }

  // Consumes `n` level pairs (rep may be null when max_rep is 0, def null when max_def is 0).
  // `non_null` receives the count of slots with a value (def == max_def); values are appended by
  // the caller afterwards with Spread.
  absl::Status Add(const uint32_t* rep, const uint32_t* def, size_t n, size_t* non_null) {
    size_t present = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t d = def != nullptr ? def[i] : static_cast<uint32_t>(max_def_);
      const uint32_t r = rep != nullptr ? rep[i] : 0;
      if (d > static_cast<uint32_t>(max_def_)) {
        return absl::DataLossError(
            StrCat("definition level ", d, " above the maximum ", max_def_, " (value ", i, ")"));
      }
      if (r > static_cast<uint32_t>(max_rep_)) {
        return absl::DataLossError(
            StrCat("repetition level ", r, " above the maximum ", max_rep_, " (value ", i, ")"));
      }
      if (!chunk_started_ && r != 0) {
        return absl::DataLossError("a column chunk starts inside a row (repetition level > 0)");
      }
      chunk_started_ = true;
      if (r == 0) ++rows_;
      const bool has_value = static_cast<int>(d) == max_def_;
      if (max_rep_ == 0) {
        out_->valid.push_back(has_value);
      } else {
        const int16_t dd = static_cast<int16_t>(d);
        if (r > 0 && dd < def_incl_[r - 1]) {
          return absl::DataLossError(StrCat("repetition level ", r, " with definition level ", d,
                                            " below its list's (value ", i, ")"));
        }
        int k = static_cast<int>(r);
        bool deeper = true;
        for (; k < max_rep_; ++k) {
          if (k > 0 && dd < def_incl_[k - 1]) {
            deeper = false;
            break;
          }
          ListLevel& level = out_->lists[k];
          if (k > 0) ++out_->lists[k - 1].offsets.back();
          level.offsets.push_back(level.offsets.back());
          level.valid.push_back(dd >= def_before_[k]);
        }
        if (deeper && dd >= def_incl_[max_rep_ - 1]) {
          ++out_->lists[max_rep_ - 1].offsets.back();
          out_->valid.push_back(has_value);
        } else {
          continue;  // an empty or null list: no value slot
        }
      }
      if (has_value) ++present;
    }
    *non_null = present;
    return absl::OkStatus();
  }

  int64_t rows() const { return rows_; }

 private:
  Column* out_;
  int max_def_, max_rep_;
  std::vector<int16_t> def_before_, def_incl_;
  bool chunk_started_ = false;
  int64_t rows_ = 0;
};

// Appends `page` (the non-null values in order) to `out`: at the slots valid[first_slot..] that
// are 1 the next value, at the others a zero or empty value. Moves when nothing needs placing.
void Spread(ColumnValues& page, const std::vector<uint8_t>& valid, size_t first_slot,
            ColumnValues* out) {
  std::visit(
      [&](auto& o) {
        using V = std::decay_t<decltype(o)>;
        V& p = std::get<V>(page);
        const size_t slots = valid.size() - first_slot;
        if (slots == p.size() && o.size() == 0) {
          o = std::move(p);
          return;
        }
        if constexpr (std::is_same_v<V, BinaryValues>) {
          size_t j = 0;
          for (size_t s = first_slot; s < valid.size(); ++s) {
            if (valid[s]) {
              const std::string_view v = p[j++];
              o.data.append(v.data(), v.size());
            }
            o.offsets.push_back(static_cast<int64_t>(o.data.size()));
          }
        } else if (slots == p.size()) {
          o.insert(o.end(), p.begin(), p.end());
        } else {
          const size_t base = o.size();
          o.resize(base + slots);
          size_t j = 0;
          for (size_t s = 0; s < slots; ++s) {
            o[base + s] = valid[first_slot + s] ? p[j++] : typename V::value_type{};
          }
        }
      },
      *out);
}

}  // namespace

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

namespace {

// Decodes the pages of one column chunk, in order, into a Column. One per chunk; not thread-safe.
class ChunkDecoder {
 public:
  ChunkDecoder(std::string where, uint64_t chunk_offset, std::string_view chunk,
               const internal::ColumnMetaData& meta, const std::vector<SchemaNode>& schema,
               const ColumnDescriptor& col, Budget& budget, Column* out)
      : where_(std::move(where)),
        chunk_offset_(chunk_offset),
        chunk_(chunk),
        meta_(meta),
        col_(col),
        budget_(budget),
        out_(out),
        assembler_(schema, col, out),
        rep_width_(internal::BitWidth(col.max_repetition_level)),
        def_width_(internal::BitWidth(col.max_definition_level)) {}

  // Decodes every page; then the values seen must be the chunk's num_values.
  absl::Status Run() {
    size_t pos = 0;
    for (; pos < chunk_.size() && values_seen_ < meta_.num_values; ++page_index_) {
      page_offset_ = chunk_offset_ + pos;
      size_t header_size = 0;
      absl::StatusOr<internal::PageHeader> header =
          internal::DecodePageHeader(chunk_.substr(pos), page_offset_, &header_size);
      if (!header.ok()) return Annotate(header.status(), At("page header"));
      const size_t payload_at = pos + header_size;
      const uint64_t payload_size = static_cast<uint64_t>(header->compressed_page_size);
      if (payload_size > chunk_.size() - payload_at) {
        return absl::DataLossError(
            At(StrCat("page of ", payload_size, " bytes runs past the ", "column chunk's end (",
                      chunk_.size() - payload_at, " bytes left)")));
      }
      const std::string_view payload = chunk_.substr(payload_at, payload_size);
      pos = payload_at + payload_size;
      switch (static_cast<PageType>(header->type)) {
        case PageType::kDictionaryPage:
          RETURN_IF_ERROR(DictionaryPage(*header, payload));
          break;
        case PageType::kDataPage:
        case PageType::kDataPageV2:
          RETURN_IF_ERROR(DataPage(*header, payload));
          break;
        default:
          break;  // index pages and unknown page types carry nothing we read
      }
    }
    if (values_seen_ != meta_.num_values) {
      return absl::DataLossError(StrCat(where_, ": the column chunk ends after ", values_seen_,
                                        " of ", meta_.num_values, " values (", page_index_,
                                        " pages, ", pos, " bytes)"));
    }
    return absl::OkStatus();
  }

  int64_t rows() const { return assembler_.rows(); }

 private:
  // "<file>: row group R, column 'c', page P at byte O: <what>".
  std::string At(std::string_view what) const {
    return StrCat(where_, ", page ", page_index_, " at byte ", page_offset_,
                  what.empty() ? "" : ": ", what);
  }

  // Decompresses `in` to exactly `size` bytes; the result stays valid until the next call.
  absl::Status Decompress(std::string_view in, uint64_t size, std::string_view* result) {
    if (meta_.codec == static_cast<int32_t>(internal::Codec::kUncompressed)) {
      if (in.size() != size) {
        return absl::DataLossError(
            At(StrCat("uncompressed page of ", in.size(), " bytes, header says ", size)));
      }
      *result = in;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(Annotate(budget_.Take(size, "a decompressed page"), At("")));
    page_buffer_.resize(size);
    RETURN_IF_ERROR(Annotate(internal::Decompress(meta_.codec, in, page_buffer_.data(), size),
                             At(StrCat(internal::CodecName(meta_.codec), " page"))));
    *result = page_buffer_;
    return absl::OkStatus();
  }

  absl::Status DictionaryPage(const internal::PageHeader& header, std::string_view payload) {
    if (!header.dictionary_page)
      return absl::DataLossError(At("dictionary page without its header"));
    if (dictionary_ || seen_data_page_) {
      return absl::DataLossError(At("a second dictionary page, or one after data pages"));
    }
    const int32_t encoding = header.dictionary_page->encoding;
    if (encoding != static_cast<int32_t>(Encoding::kPlain) &&
        encoding != static_cast<int32_t>(Encoding::kPlainDictionary)) {
      return absl::UnimplementedError(
          At(StrCat("dictionary page encoding ", internal::EncodingName(encoding))));
    }
    std::string_view data;
    RETURN_IF_ERROR(
        Decompress(payload, static_cast<uint64_t>(header.uncompressed_page_size), &data));
    const uint64_t count = static_cast<uint64_t>(header.dictionary_page->num_values);
    RETURN_IF_ERROR(
        Annotate(budget_.Take(count * DecodedBytesPerValue(col_.physical_type, col_.type_length),
                              "the dictionary"),
                 At("")));
    dictionary_ = EmptyValues(col_.physical_type);
    size_t consumed = 0;
    return Annotate(
        DecodePlain(data, col_.physical_type, col_.type_length, count, &*dictionary_, &consumed),
        At("dictionary page"));
  }

  // Decodes `count` levels of one kind from a v1 page's `*data` (RLE with a 4-byte length, or the
  // deprecated BIT_PACKED), advancing `*data` past them.
  absl::Status LevelsV1(std::string_view* data, int width, int32_t encoding, size_t count,
                        std::vector<uint32_t>& levels, std::string_view what) {
    if (levels.empty()) return absl::OkStatus();
    size_t consumed = 0;
    if (encoding == static_cast<int32_t>(Encoding::kRle)) {
      if (data->size() < 4) {
        return absl::DataLossError(At(StrCat(what, ": length prefix past the page end")));
      }
      const uint32_t len = LoadU32(data->data());
      if (len > data->size() - 4) {
        return absl::DataLossError(
            At(StrCat(what, " of ", len, " bytes, ", data->size() - 4, " left in the page")));
      }
      RETURN_IF_ERROR(Annotate(
          internal::DecodeRleHybrid(data->substr(4, len), width, count, levels.data()), At(what)));
      consumed = 4 + len;
    } else if (encoding == static_cast<int32_t>(Encoding::kBitPacked)) {
      RETURN_IF_ERROR(
          Annotate(internal::DecodeBitPackedLevels(*data, width, count, levels.data(), &consumed),
                   At(what)));
    } else {
      return absl::UnimplementedError(
          At(StrCat(what, " in encoding ", internal::EncodingName(encoding))));
    }
    data->remove_prefix(consumed);
    return absl::OkStatus();
  }

  absl::Status DataPage(const internal::PageHeader& header, std::string_view payload) {
    seen_data_page_ = true;
    const bool v2 = header.type == static_cast<int32_t>(PageType::kDataPageV2);
    if (v2 ? !header.data_page_v2 : !header.data_page) {
      return absl::DataLossError(At("data page without its header"));
    }
    const uint64_t num_values =
        static_cast<uint64_t>(v2 ? header.data_page_v2->num_values : header.data_page->num_values);
    const int32_t encoding = v2 ? header.data_page_v2->encoding : header.data_page->encoding;
    const uint64_t uncompressed = static_cast<uint64_t>(header.uncompressed_page_size);
    if (num_values > static_cast<uint64_t>(meta_.num_values - values_seen_)) {
      return absl::DataLossError(
          At(StrCat(num_values, " values, beyond the ", meta_.num_values - values_seen_,
                    " the column chunk has left")));
    }
    // Levels (4 bytes each while decoding) and the output slots: validity, value, list offsets.
    const bool has_rep = col_.max_repetition_level > 0, has_def = col_.max_definition_level > 0;
    const uint64_t per_value = DecodedBytesPerValue(col_.physical_type, col_.type_length) + 1 +
                               9 * static_cast<uint64_t>(col_.max_repetition_level) + 4 * has_rep +
                               4 * has_def;
    RETURN_IF_ERROR(
        Annotate(budget_.Take(num_values * per_value, StrCat(num_values, " values")), At("")));
    rep_.resize(has_rep ? num_values : 0);
    def_.resize(has_def ? num_values : 0);

    std::string_view body;  // the values, after the levels, decompressed
    if (v2) {
      const internal::DataPageHeaderV2& h = *header.data_page_v2;
      const uint64_t rep_len = static_cast<uint64_t>(h.repetition_levels_byte_length);
      const uint64_t def_len = static_cast<uint64_t>(h.definition_levels_byte_length);
      if (rep_len + def_len > payload.size() || rep_len + def_len > uncompressed) {
        return absl::DataLossError(At(StrCat("levels of ", rep_len, " + ", def_len,
                                             " bytes exceed the page's ", payload.size())));
      }
      if (has_rep) {
        RETURN_IF_ERROR(Annotate(internal::DecodeRleHybrid(payload.substr(0, rep_len), rep_width_,
                                                           num_values, rep_.data()),
                                 At("repetition levels")));
      }
      if (has_def) {
        RETURN_IF_ERROR(Annotate(internal::DecodeRleHybrid(payload.substr(rep_len, def_len),
                                                           def_width_, num_values, def_.data()),
                                 At("definition levels")));
      }
      const std::string_view values = payload.substr(rep_len + def_len);
      const uint64_t values_size = uncompressed - rep_len - def_len;
      if (values_size == 0 && values.empty()) {
        body = values;  // all null: some writers compress nothing at all
      } else if (h.is_compressed) {
        RETURN_IF_ERROR(Decompress(values, values_size, &body));
      } else if (values.size() != values_size) {
        return absl::DataLossError(At("uncompressed v2 page values of the wrong size"));
      } else {
        body = values;
      }
    } else {
      RETURN_IF_ERROR(Decompress(payload, uncompressed, &body));
      const internal::DataPageHeader& h = *header.data_page;
      RETURN_IF_ERROR(LevelsV1(&body, rep_width_, h.repetition_level_encoding, num_values, rep_,
                               "repetition levels"));
      RETURN_IF_ERROR(LevelsV1(&body, def_width_, h.definition_level_encoding, num_values, def_,
                               "definition levels"));
    }

    const size_t first_slot = out_->valid.size();
    size_t non_null = 0;
    RETURN_IF_ERROR(Annotate(assembler_.Add(has_rep ? rep_.data() : nullptr,
                                            has_def ? def_.data() : nullptr, num_values, &non_null),
                             At("levels")));
    ColumnValues page_values = EmptyValues(col_.physical_type);
    RETURN_IF_ERROR(Values(encoding, body, non_null, &page_values));
    if (ValuesSize(page_values) != non_null) {
      return absl::InternalError(At("decoded value count differs from the levels'"));
    }
    Spread(page_values, out_->valid, first_slot, &out_->values);
    values_seen_ += static_cast<int64_t>(num_values);
    return absl::OkStatus();
  }

  // Decodes `non_null` values in `encoding` from `body` into `values`.
  absl::Status Values(int32_t encoding, std::string_view body, size_t non_null,
                      ColumnValues* values) {
    const std::string_view name = internal::EncodingName(encoding);
    const std::string what = StrCat(name, " values");
    const PhysicalType type = col_.physical_type;
    switch (static_cast<Encoding>(encoding)) {
      case Encoding::kPlain: {
        size_t consumed = 0;
        return Annotate(DecodePlain(body, type, col_.type_length, non_null, values, &consumed),
                        At(what));
      }
      case Encoding::kPlainDictionary:
      case Encoding::kRleDictionary: {
        if (!dictionary_) {
          return absl::DataLossError(At("dictionary-encoded page without a dictionary page"));
        }
        if (non_null == 0) return absl::OkStatus();
        if (body.empty()) return absl::DataLossError(At("dictionary indices missing"));
        const int width = static_cast<uint8_t>(body[0]);
        indices_.resize(non_null);
        RETURN_IF_ERROR(
            Annotate(internal::DecodeRleHybrid(body.substr(1), width, non_null, indices_.data()),
                     At("dictionary indices")));
        return Annotate(GatherDictionary(*dictionary_, indices_.data(), non_null, budget_, values),
                        At("dictionary indices"));
      }
      case Encoding::kRle: {  // booleans, with a 4-byte length
        if (type != PhysicalType::kBoolean) {
          return absl::UnimplementedError(At("RLE values for a non-boolean column"));
        }
        if (non_null == 0) return absl::OkStatus();
        if (body.size() < 4) return absl::DataLossError(At("RLE booleans: no length prefix"));
        const uint32_t len = LoadU32(body.data());
        if (len > body.size() - 4) return absl::DataLossError(At("RLE booleans past the page end"));
        indices_.resize(non_null);
        RETURN_IF_ERROR(
            Annotate(internal::DecodeRleHybrid(body.substr(4, len), 1, non_null, indices_.data()),
                     At("RLE booleans")));
        std::get<std::vector<uint8_t>>(*values).assign(indices_.begin(), indices_.end());
        return absl::OkStatus();
      }
      case Encoding::kDeltaBinaryPacked: {
        if (type != PhysicalType::kInt32 && type != PhysicalType::kInt64) {
          return absl::DataLossError(
              At(StrCat(what, " for a ", PhysicalTypeName(type), " column")));
        }
        if (non_null == 0) return absl::OkStatus();
        std::vector<int64_t> decoded(non_null);
        size_t consumed = 0;
        RETURN_IF_ERROR(
            Annotate(internal::DecodeDeltaBinaryPacked(body, non_null, decoded.data(), &consumed),
                     At(what)));
        if (type == PhysicalType::kInt64) {
          std::get<std::vector<int64_t>>(*values) = std::move(decoded);
        } else {
          auto& v = std::get<std::vector<int32_t>>(*values);
          v.reserve(non_null);
          // int32 columns wrap modulo 2^32, as the encoding's arithmetic is defined.
          for (int64_t x : decoded) v.push_back(static_cast<int32_t>(static_cast<uint32_t>(x)));
        }
        return absl::OkStatus();
      }
      case Encoding::kDeltaLengthByteArray:
      case Encoding::kDeltaByteArray: {
        if (type != PhysicalType::kByteArray) {
          return absl::DataLossError(
              At(StrCat(what, " for a ", PhysicalTypeName(type), " column")));
        }
        if (non_null == 0) return absl::OkStatus();
        auto& v = std::get<BinaryValues>(*values);
        size_t consumed = 0;
        RETURN_IF_ERROR(
            Annotate(encoding == static_cast<int32_t>(Encoding::kDeltaLengthByteArray)
                         ? internal::DecodeDeltaLengthByteArray(body, non_null, budget_.left(), &v,
                                                                &consumed)
                         : internal::DecodeDeltaByteArray(body, non_null, budget_.left(), &v),
                     At(what)));
        return Annotate(budget_.Take(v.data.size(), "the values"), At(""));
      }
      case Encoding::kByteStreamSplit: {
        const size_t width = PhysicalWidth(type, col_.type_length);
        if (width == 0 || type == PhysicalType::kInt96) {
          return absl::DataLossError(
              At(StrCat(what, " for a ", PhysicalTypeName(type), " column")));
        }
        return std::visit(
            [&](auto& v) -> absl::Status {
              using V = std::decay_t<decltype(v)>;
              if constexpr (std::is_same_v<V, BinaryValues>) {  // FIXED_LEN_BYTE_ARRAY
                v.data.resize(non_null * width);
                RETURN_IF_ERROR(
                    Annotate(internal::DecodeByteStreamSplit(body, non_null, width, v.data.data()),
                             At(what)));
                for (size_t i = 0; i < non_null; ++i) {
                  v.offsets.push_back(static_cast<int64_t>((i + 1) * width));
                }
              } else {
                if (sizeof(typename V::value_type) != width) {
                  return absl::InternalError(At("BYTE_STREAM_SPLIT width"));
                }
                v.resize(non_null);
                RETURN_IF_ERROR(
                    Annotate(internal::DecodeByteStreamSplit(body, non_null, width,
                                                             reinterpret_cast<char*>(v.data())),
                             At(what)));
              }
              return absl::OkStatus();
            },
            *values);
      }
      default:
        return absl::UnimplementedError(
            At(StrCat("value encoding ", name, " (", encoding, ") is not supported")));
    }
  }

  const std::string where_;
  const uint64_t chunk_offset_;
  const std::string_view chunk_;  // borrowed from ReadChunk, which outlives this decoder
  const internal::ColumnMetaData& meta_;
  const ColumnDescriptor& col_;
  Budget& budget_;
  Column* out_;
  LevelAssembler assembler_;
  const int rep_width_, def_width_;

  std::optional<ColumnValues> dictionary_;
  bool seen_data_page_ = false;
  int64_t values_seen_ = 0;
  int page_index_ = 0;
  uint64_t page_offset_ = 0;
  // Reused from page to page.
  std::string page_buffer_;
  std::vector<uint32_t> rep_, def_, indices_;
};

}  // namespace

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
  ChunkDecoder decoder(where, start, chunk, m, schema, col, budget, out);
  RETURN_IF_ERROR(decoder.Run());
  if (decoder.rows() != rg.num_rows) {
    return absl::DataLossError(
        StrCat(where, ": ", decoder.rows(), " rows, the row group has ", rg.num_rows));
  }
  out->num_rows += decoder.rows();
  return absl::OkStatus();
}

}  // namespace conveyor::parquet
