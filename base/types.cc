#include "base/types.h"

#include "absl/strings/str_cat.h"

namespace conveyor {

std::string Cursor::ToString() const {
  return position ? absl::StrCat(epoch, "@", *position) : absl::StrCat(epoch, ":", step);
}

bool Cursor::PositionAt(uint64_t batch, uint64_t* out) const {
  if (position) {
    *out = *position;
    return true;
  }
  return CheckedMul(step, batch, out);
}

absl::StatusOr<Cursor> Cursor::Parse(std::string_view text) {
  auto num = [](std::string_view s, uint64_t* out) {
    if (s.empty() || s.size() > 19) return false;  // 19 digits always fit in 64 bits
    uint64_t v = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9') return false;
      v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    *out = v;
    return true;
  };
  Cursor c;
  const size_t sep = text.find_first_of(":@");
  uint64_t second = 0;
  if (sep == std::string_view::npos || !num(text.substr(0, sep), &c.epoch) ||
      !num(text.substr(sep + 1), &second)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cursor '", absl::string_view(text.data(), text.size()),
        "' is neither EPOCH:STEP nor EPOCH@POSITION (two non-negative integers, e.g. 0:120 or "
        "0@3840)"));
  }
  if (text[sep] == ':') {
    c.step = second;
  } else {
    c.position = second;
  }
  return c;
}

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kUint8:
    case DType::kBool: return 1;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
  }
  return 1;
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kUint8: return "uint8";
    case DType::kBool: return "bool";
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

std::string_view NumpyDescr(DType t) {
  switch (t) {
    case DType::kUint8: return "|u1";
    case DType::kBool: return "|b1";
    case DType::kFloat32: return "<f4";
    case DType::kInt32: return "<i4";
    case DType::kFloat16: return "<f2";
    case DType::kBFloat16: return "";
  }
  return "|u1";
}

}  // namespace conveyor
