// Decoding one column chunk (datasets/parquet/internal/column_chunk.h): values, pages, levels.
#include "datasets/parquet/internal/column_chunk.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>

#include "base/status_macros.h"
#include "datasets/parquet/internal/compression.h"
#include "datasets/parquet/internal/encodings.h"

namespace conveyor::parquet::internal {

namespace {

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

absl::Status DecodeColumnChunk(const std::string& where, uint64_t chunk_offset,
                               std::string_view chunk, const ColumnMetaData& meta,
                               const std::vector<SchemaNode>& schema, const ColumnDescriptor& col,
                               Budget& budget, Column* out, int64_t* rows) {
  ChunkDecoder decoder(where, chunk_offset, chunk, meta, schema, col, budget, out);
  RETURN_IF_ERROR(decoder.Run());
  *rows = decoder.rows();
  return absl::OkStatus();
}

}  // namespace conveyor::parquet::internal
