#include "datasets/parquet/internal/metadata.h"

#include <utility>

#include "base/status_macros.h"
#include "base/strings.h"
#include "datasets/parquet/internal/thrift_compact.h"

namespace conveyor::parquet::internal {
namespace {

using Reader = CompactReader;

// Reads a list<T> field with `read_element` called once per element.
template <typename F>
absl::Status ReadList(Reader& r, ThriftType type, F&& read_element) {
  ASSIGN_OR_RETURN(const Reader::ListHeader h, r.ReadListHeader(type));
  for (uint32_t i = 0; i < h.size; ++i) RETURN_IF_ERROR(read_element(h.element_type));
  return absl::OkStatus();
}

absl::Status ReadString(Reader& r, ThriftType type, std::string* out) {
  ASSIGN_OR_RETURN(const std::string_view s, r.ReadBinary(type));
  out->assign(s.data(), s.size());
  return absl::OkStatus();
}

absl::Status RequireStruct(Reader& r, ThriftType type) {
  if (type != ThriftType::kStruct) {
    return r.Error(StrCat("expected a struct, found type ", static_cast<int>(type)));
  }
  return absl::OkStatus();
}

// TimeUnit union: 1 MILLIS, 2 MICROS, 3 NANOS (each an empty struct).
absl::Status ReadTimeUnit(Reader& r, ThriftType type, LogicalType::TimeUnit* unit) {
  RETURN_IF_ERROR(RequireStruct(r, type));
  return r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    if (id == 1) *unit = LogicalType::TimeUnit::kMillis;
    if (id == 2) *unit = LogicalType::TimeUnit::kMicros;
    if (id == 3) *unit = LogicalType::TimeUnit::kNanos;
    return r.Skip(t);
  });
}

// LogicalType union.
absl::Status ReadLogicalType(Reader& r, ThriftType type, LogicalType* out) {
  RETURN_IF_ERROR(RequireStruct(r, type));
  using K = LogicalType::Kind;
  return r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    if (t != ThriftType::kStruct) return r.Skip(t);
    switch (id) {
      case 1:
        out->kind = K::kString;
        break;
      case 2:
        out->kind = K::kMap;
        break;
      case 3:
        out->kind = K::kList;
        break;
      case 4:
        out->kind = K::kEnum;
        break;
      case 5:  // DecimalType {1: scale, 2: precision}
        out->kind = K::kDecimal;
        return r.ReadStruct([&](int16_t fid, ThriftType ft) -> absl::Status {
          if (fid == 1) {
            ASSIGN_OR_RETURN(out->decimal_scale, r.ReadI32(ft));
            return absl::OkStatus();
          }
          if (fid == 2) {
            ASSIGN_OR_RETURN(out->decimal_precision, r.ReadI32(ft));
            return absl::OkStatus();
          }
          return r.Skip(ft);
        });
      case 6:
        out->kind = K::kDate;
        break;
      case 7:  // TimeType, 8: TimestampType {1: isAdjustedToUTC, 2: unit}
      case 8:
        out->kind = id == 7 ? K::kTime : K::kTimestamp;
        return r.ReadStruct([&](int16_t fid, ThriftType ft) -> absl::Status {
          if (fid == 1) {
            ASSIGN_OR_RETURN(out->adjusted_to_utc, r.ReadBool(ft));
            return absl::OkStatus();
          }
          if (fid == 2) return ReadTimeUnit(r, ft, &out->unit);
          return r.Skip(ft);
        });
      case 10:  // IntType {1: bitWidth (i8), 2: isSigned}
        out->kind = K::kInteger;
        return r.ReadStruct([&](int16_t fid, ThriftType ft) -> absl::Status {
          if (fid == 1) {
            ASSIGN_OR_RETURN(out->bit_width, r.ReadI32(ft));
            return absl::OkStatus();
          }
          if (fid == 2) {
            ASSIGN_OR_RETURN(out->is_signed, r.ReadBool(ft));
            return absl::OkStatus();
          }
          return r.Skip(ft);
        });
      case 11:
        out->kind = K::kNull;
        break;
      case 12:
        out->kind = K::kJson;
        break;
      case 13:
        out->kind = K::kBson;
        break;
      case 14:
        out->kind = K::kUuid;
        break;
      case 15:
        out->kind = K::kFloat16;
        break;
      default:
        out->kind = K::kOther;
        break;
    }
    return r.Skip(t);
  });
}

absl::Status ReadSchemaElement(Reader& r, ThriftType type, SchemaElement* e) {
  RETURN_IF_ERROR(RequireStruct(r, type));
  bool has_name = false;
  RETURN_IF_ERROR(r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    switch (id) {
      case 1: {
        ASSIGN_OR_RETURN(e->type, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 2: {
        ASSIGN_OR_RETURN(e->type_length, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 3: {
        ASSIGN_OR_RETURN(e->repetition_type, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 4:
        has_name = true;
        return ReadString(r, t, &e->name);
      case 5: {
        ASSIGN_OR_RETURN(e->num_children, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 6: {
        ASSIGN_OR_RETURN(e->converted_type, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 7: {
        ASSIGN_OR_RETURN(e->scale, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 8: {
        ASSIGN_OR_RETURN(e->precision, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 10:
        return ReadLogicalType(r, t, &e->logical_type);
      default:
        return r.Skip(t);
    }
  }));
  if (!has_name) return r.Error("schema element without a name");
  if (e->num_children < 0)
    return r.Error(StrCat("schema element '", e->name, "' has negative num_children"));
  return absl::OkStatus();
}

absl::Status ReadColumnMetaData(Reader& r, ThriftType type, ColumnMetaData* m) {
  RETURN_IF_ERROR(RequireStruct(r, type));
  uint32_t seen = 0;
  RETURN_IF_ERROR(r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    if (id >= 1 && id <= 31) seen |= 1u << id;
    switch (id) {
      case 1: {
        ASSIGN_OR_RETURN(m->type, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 3:
        return ReadList(r, t, [&](ThriftType et) {
          m->path_in_schema.emplace_back();
          return ReadString(r, et, &m->path_in_schema.back());
        });
      case 4: {
        ASSIGN_OR_RETURN(m->codec, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 5: {
        ASSIGN_OR_RETURN(m->num_values, r.ReadI64(t));
        return absl::OkStatus();
      }
      case 6: {
        ASSIGN_OR_RETURN(m->total_uncompressed_size, r.ReadI64(t));
        return absl::OkStatus();
      }
      case 7: {
        ASSIGN_OR_RETURN(m->total_compressed_size, r.ReadI64(t));
        return absl::OkStatus();
      }
      case 9: {
        ASSIGN_OR_RETURN(m->data_page_offset, r.ReadI64(t));
        return absl::OkStatus();
      }
      case 11: {
        ASSIGN_OR_RETURN(m->dictionary_page_offset, r.ReadI64(t));
        return absl::OkStatus();
      }
      default:
        return r.Skip(t);
    }
  }));
  for (int id : {1, 3, 4, 5, 7, 9}) {
    if ((seen & (1u << id)) == 0) return r.Error(StrCat("column metadata lacks field ", id));
  }
  if (m->num_values < 0 || m->total_compressed_size < 0 || m->data_page_offset < 0) {
    return r.Error("column metadata with a negative count, size or offset");
  }
  return absl::OkStatus();
}

absl::Status ReadColumnChunk(Reader& r, ThriftType type, ColumnChunk* c) {
  RETURN_IF_ERROR(RequireStruct(r, type));
  return r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    switch (id) {
      case 1:
        return ReadString(r, t, &c->file_path);
      case 3:
        c->meta_data.emplace();
        return ReadColumnMetaData(r, t, &*c->meta_data);
      case 8:
      case 9:
        c->encrypted = true;
        return r.Skip(t);
      default:
        return r.Skip(t);
    }
  });
}

absl::Status ReadRowGroup(Reader& r, ThriftType type, RowGroup* g) {
  RETURN_IF_ERROR(RequireStruct(r, type));
  bool has_rows = false;
  RETURN_IF_ERROR(r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    switch (id) {
      case 1:
        return ReadList(r, t, [&](ThriftType et) {
          g->columns.emplace_back();
          return ReadColumnChunk(r, et, &g->columns.back());
        });
      case 3:
        has_rows = true;
        {
          ASSIGN_OR_RETURN(g->num_rows, r.ReadI64(t));
          return absl::OkStatus();
        }
      default:
        return r.Skip(t);
    }
  }));
  if (!has_rows || g->num_rows < 0) return r.Error("row group without a valid num_rows");
  return absl::OkStatus();
}

}  // namespace

std::string_view EncodingName(int32_t encoding) {
  switch (encoding) {
    case 0:
      return "PLAIN";
    case 2:
      return "PLAIN_DICTIONARY";
    case 3:
      return "RLE";
    case 4:
      return "BIT_PACKED";
    case 5:
      return "DELTA_BINARY_PACKED";
    case 6:
      return "DELTA_LENGTH_BYTE_ARRAY";
    case 7:
      return "DELTA_BYTE_ARRAY";
    case 8:
      return "RLE_DICTIONARY";
    case 9:
      return "BYTE_STREAM_SPLIT";
    default:
      return "unknown";
  }
}

std::string_view CodecName(int32_t codec) {
  switch (codec) {
    case 0:
      return "UNCOMPRESSED";
    case 1:
      return "SNAPPY";
    case 2:
      return "GZIP";
    case 3:
      return "LZO";
    case 4:
      return "BROTLI";
    case 5:
      return "LZ4";
    case 6:
      return "ZSTD";
    case 7:
      return "LZ4_RAW";
    default:
      return "unknown";
  }
}

absl::StatusOr<FileMetaData> DecodeFileMetaData(std::string_view bytes, uint64_t base_offset) {
  Reader r(bytes, base_offset);
  FileMetaData f;
  uint32_t seen = 0;
  RETURN_IF_ERROR(r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    if (id >= 1 && id <= 31) seen |= 1u << id;
    switch (id) {
      case 1: {
        ASSIGN_OR_RETURN(f.version, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 2:
        return ReadList(r, t, [&](ThriftType et) {
          f.schema.emplace_back();
          return ReadSchemaElement(r, et, &f.schema.back());
        });
      case 3: {
        ASSIGN_OR_RETURN(f.num_rows, r.ReadI64(t));
        return absl::OkStatus();
      }
      case 4:
        return ReadList(r, t, [&](ThriftType et) {
          f.row_groups.emplace_back();
          return ReadRowGroup(r, et, &f.row_groups.back());
        });
      case 5:
        return ReadList(r, t, [&](ThriftType et) -> absl::Status {
          RETURN_IF_ERROR(RequireStruct(r, et));
          std::pair<std::string, std::string> kv;
          RETURN_IF_ERROR(r.ReadStruct([&](int16_t kid, ThriftType kt) -> absl::Status {
            if (kid == 1) return ReadString(r, kt, &kv.first);
            if (kid == 2) return ReadString(r, kt, &kv.second);
            return r.Skip(kt);
          }));
          f.key_value_metadata.push_back(std::move(kv));
          return absl::OkStatus();
        });
      case 6:
        return ReadString(r, t, &f.created_by);
      case 8:
        f.encrypted = true;
        return r.Skip(t);
      default:
        return r.Skip(t);
    }
  }));
  for (int id : {1, 2, 3, 4}) {
    if ((seen & (1u << id)) == 0) return r.Error(StrCat("file metadata lacks field ", id));
  }
  if (f.num_rows < 0) return r.Error("negative num_rows");
  return f;
}

absl::StatusOr<PageHeader> DecodePageHeader(std::string_view bytes, uint64_t base_offset,
                                            size_t* header_size) {
  Reader r(bytes, base_offset);
  PageHeader h;
  uint32_t seen = 0;
  RETURN_IF_ERROR(r.ReadStruct([&](int16_t id, ThriftType t) -> absl::Status {
    if (id >= 1 && id <= 31) seen |= 1u << id;
    switch (id) {
      case 1: {
        ASSIGN_OR_RETURN(h.type, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 2: {
        ASSIGN_OR_RETURN(h.uncompressed_page_size, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 3: {
        ASSIGN_OR_RETURN(h.compressed_page_size, r.ReadI32(t));
        return absl::OkStatus();
      }
      case 5: {
        RETURN_IF_ERROR(RequireStruct(r, t));
        DataPageHeader& d = h.data_page.emplace();
        return r.ReadStruct([&](int16_t fid, ThriftType ft) -> absl::Status {
          switch (fid) {
            case 1: {
              ASSIGN_OR_RETURN(d.num_values, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 2: {
              ASSIGN_OR_RETURN(d.encoding, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 3: {
              ASSIGN_OR_RETURN(d.definition_level_encoding, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 4: {
              ASSIGN_OR_RETURN(d.repetition_level_encoding, r.ReadI32(ft));
              return absl::OkStatus();
            }
            default:
              return r.Skip(ft);
          }
        });
      }
      case 7: {
        RETURN_IF_ERROR(RequireStruct(r, t));
        DictionaryPageHeader& d = h.dictionary_page.emplace();
        return r.ReadStruct([&](int16_t fid, ThriftType ft) -> absl::Status {
          switch (fid) {
            case 1: {
              ASSIGN_OR_RETURN(d.num_values, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 2: {
              ASSIGN_OR_RETURN(d.encoding, r.ReadI32(ft));
              return absl::OkStatus();
            }
            default:
              return r.Skip(ft);
          }
        });
      }
      case 8: {
        RETURN_IF_ERROR(RequireStruct(r, t));
        DataPageHeaderV2& d = h.data_page_v2.emplace();
        return r.ReadStruct([&](int16_t fid, ThriftType ft) -> absl::Status {
          switch (fid) {
            case 1: {
              ASSIGN_OR_RETURN(d.num_values, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 2: {
              ASSIGN_OR_RETURN(d.num_nulls, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 3: {
              ASSIGN_OR_RETURN(d.num_rows, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 4: {
              ASSIGN_OR_RETURN(d.encoding, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 5: {
              ASSIGN_OR_RETURN(d.definition_levels_byte_length, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 6: {
              ASSIGN_OR_RETURN(d.repetition_levels_byte_length, r.ReadI32(ft));
              return absl::OkStatus();
            }
            case 7: {
              ASSIGN_OR_RETURN(d.is_compressed, r.ReadBool(ft));
              return absl::OkStatus();
            }
            default:
              return r.Skip(ft);
          }
        });
      }
      default:
        return r.Skip(t);
    }
  }));
  for (int id : {1, 2, 3}) {
    if ((seen & (1u << id)) == 0) return r.Error(StrCat("page header lacks field ", id));
  }
  if (h.uncompressed_page_size < 0 || h.compressed_page_size < 0) {
    return r.Error("page header with a negative size");
  }
  if (h.data_page && (h.data_page->num_values < 0)) return r.Error("negative num_values");
  if (h.dictionary_page && h.dictionary_page->num_values < 0) return r.Error("negative num_values");
  if (h.data_page_v2) {
    const DataPageHeaderV2& d = *h.data_page_v2;
    if (d.num_values < 0 || d.num_nulls < 0 || d.num_rows < 0 ||
        d.definition_levels_byte_length < 0 || d.repetition_levels_byte_length < 0) {
      return r.Error("data page v2 header with a negative count or length");
    }
  }
  *header_size = r.position();
  return h;
}

}  // namespace conveyor::parquet::internal
