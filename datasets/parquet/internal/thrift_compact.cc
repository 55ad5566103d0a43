#include "datasets/parquet/internal/thrift_compact.h"

#include <cstring>
#include <limits>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::parquet::internal {
namespace {

bool IsValidType(uint8_t t) { return t >= 1 && t <= 12; }

}  // namespace

absl::Status CompactReader::Error(std::string_view what) const {
  return absl::DataLossError(StrCat("thrift: ", what, " at byte ", base_offset_ + pos_));
}

absl::StatusOr<uint64_t> CompactReader::ReadVarint() {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos_ >= data_.size()) return Error("varint runs past the end");
    const uint8_t b = static_cast<uint8_t>(data_[pos_++]);
    value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return value;
  }
  return Error("varint longer than 10 bytes");
}

absl::StatusOr<int64_t> CompactReader::ReadZigZag() {
  ASSIGN_OR_RETURN(const uint64_t u, ReadVarint());
  return static_cast<int64_t>(u >> 1) ^ -static_cast<int64_t>(u & 1);
}

absl::Status CompactReader::ReadStruct(
    absl::FunctionRef<absl::Status(int16_t id, ThriftType type)> on_field) {
  return ReadStructDepth(on_field, depth_ + 1);
}

absl::Status CompactReader::ReadStructDepth(
    absl::FunctionRef<absl::Status(int16_t, ThriftType)> on_field, int depth) {
  if (depth > kMaxThriftDepth) return Error("structs nested too deeply");
  const int saved_depth = depth_;
  depth_ = depth;
  int16_t last_id = 0;
  absl::Status status;
  while (status.ok()) {
    if (pos_ >= data_.size()) {
      status = Error("struct runs past the end (no stop field)");
      break;
    }
    const uint8_t header = static_cast<uint8_t>(data_[pos_++]);
    const uint8_t type = header & 0x0f;
    if (type == 0) break;  // stop field
    if (!IsValidType(type)) {
      --pos_;
      status = Error(StrCat("unknown field type ", type));
      break;
    }
    const uint8_t delta = header >> 4;
    int64_t id = last_id + delta;
    if (delta == 0) {
      absl::StatusOr<int64_t> explicit_id = ReadZigZag();
      if (!explicit_id.ok()) {
        status = explicit_id.status();
        break;
      }
      id = *explicit_id;
    }
    if (id < std::numeric_limits<int16_t>::min() || id > std::numeric_limits<int16_t>::max()) {
      status = Error(StrCat("field id ", id, " out of range"));
      break;
    }
    last_id = static_cast<int16_t>(id);
    status = on_field(last_id, static_cast<ThriftType>(type));
  }
  depth_ = saved_depth;
  return status;
}

absl::StatusOr<bool> CompactReader::ReadBool(ThriftType type) {
  if (type == ThriftType::kBoolTrue) return true;
  if (type == ThriftType::kBoolFalse) return false;
  return Error(StrCat("expected a bool, found type ", static_cast<int>(type)));
}

absl::StatusOr<int64_t> CompactReader::ReadI64(ThriftType type) {
  switch (type) {
    case ThriftType::kByte:
      if (pos_ >= data_.size()) return Error("byte runs past the end");
      return static_cast<int8_t>(data_[pos_++]);
    case ThriftType::kI16:
    case ThriftType::kI32:
    case ThriftType::kI64:
      return ReadZigZag();
    default:
      return Error(StrCat("expected an integer, found type ", static_cast<int>(type)));
  }
}

absl::StatusOr<int32_t> CompactReader::ReadI32(ThriftType type) {
  if (type == ThriftType::kI64) return Error("expected a 32-bit integer, found i64");
  ASSIGN_OR_RETURN(const int64_t v, ReadI64(type));
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    return Error(StrCat("i32 value ", v, " out of range"));
  }
  return static_cast<int32_t>(v);
}

absl::StatusOr<std::string_view> CompactReader::ReadBinary(ThriftType type) {
  if (type != ThriftType::kBinary) {
    return Error(StrCat("expected binary, found type ", static_cast<int>(type)));
  }
  ASSIGN_OR_RETURN(const uint64_t len, ReadVarint());
  if (len > remaining()) {
    return Error(StrCat("binary of ", len, " bytes with ", remaining(), " bytes left"));
  }
  std::string_view out = data_.substr(pos_, len);
  pos_ += len;
  return out;
}

absl::StatusOr<CompactReader::ListHeader> CompactReader::ReadListHeader(ThriftType type) {
  if (type != ThriftType::kList && type != ThriftType::kSet) {
    return Error(StrCat("expected a list, found type ", static_cast<int>(type)));
  }
  if (pos_ >= data_.size()) return Error("list header runs past the end");
  const uint8_t header = static_cast<uint8_t>(data_[pos_++]);
  const uint8_t element_type = header & 0x0f;
  uint64_t size = header >> 4;
  if (size == 15) {
    ASSIGN_OR_RETURN(size, ReadVarint());
  }
  if (size > 0 && !IsValidType(element_type)) {
    return Error(StrCat("unknown list element type ", element_type));
  }
  // Every element takes at least one byte, so a count above the bytes left is a lie; checking it
  // here keeps callers from reserving memory for it.
  if (size > remaining()) {
    return Error(StrCat("list of ", size, " elements with ", remaining(), " bytes left"));
  }
  return ListHeader{static_cast<ThriftType>(element_type), static_cast<uint32_t>(size)};
}

absl::Status CompactReader::Skip(ThriftType type) { return SkipDepth(type, depth_ + 1, false); }

absl::Status CompactReader::SkipDepth(ThriftType type, int depth, bool list_element) {
  if (depth > kMaxThriftDepth) return Error("values nested too deeply");
  auto skip_bytes = [&](uint64_t n) -> absl::Status {
    if (n > remaining()) return Error(StrCat("value of ", n, " bytes runs past the end"));
    pos_ += n;
    return absl::OkStatus();
  };
  switch (type) {
    case ThriftType::kBoolTrue:
    case ThriftType::kBoolFalse:
      // A bool field carries its value in the field header; a bool list element is one byte.
      return list_element ? skip_bytes(1) : absl::OkStatus();
    case ThriftType::kByte:
      return skip_bytes(1);
    case ThriftType::kI16:
    case ThriftType::kI32:
    case ThriftType::kI64:
      return ReadVarint().status();
    case ThriftType::kDouble:
      return skip_bytes(8);
    case ThriftType::kBinary: {
      ASSIGN_OR_RETURN(const uint64_t len, ReadVarint());
      return skip_bytes(len);
    }
    case ThriftType::kList:
    case ThriftType::kSet: {
      ASSIGN_OR_RETURN(const ListHeader h, ReadListHeader(type));
      for (uint32_t i = 0; i < h.size; ++i) {
        RETURN_IF_ERROR(SkipDepth(h.element_type, depth + 1, true));
      }
      return absl::OkStatus();
    }
    case ThriftType::kMap: {
      ASSIGN_OR_RETURN(const uint64_t size, ReadVarint());
      if (size == 0) return absl::OkStatus();
      if (pos_ >= data_.size()) return Error("map header runs past the end");
      const uint8_t types = static_cast<uint8_t>(data_[pos_++]);
      const uint8_t key_type = types >> 4, value_type = types & 0x0f;
      if (!IsValidType(key_type) || !IsValidType(value_type)) return Error("unknown map types");
      if (size > remaining() / 2) {
        return Error(StrCat("map of ", size, " entries with ", remaining(), " bytes left"));
      }
      for (uint64_t i = 0; i < size; ++i) {
        RETURN_IF_ERROR(SkipDepth(static_cast<ThriftType>(key_type), depth + 1, true));
        RETURN_IF_ERROR(SkipDepth(static_cast<ThriftType>(value_type), depth + 1, true));
      }
      return absl::OkStatus();
    }
    case ThriftType::kStruct:
      return ReadStructDepth(
          [&](int16_t, ThriftType field_type) { return SkipDepth(field_type, depth + 1, false); },
          depth);
    case ThriftType::kStop:
      break;
  }
  return Error(StrCat("cannot skip type ", static_cast<int>(type)));
}

}  // namespace conveyor::parquet::internal
