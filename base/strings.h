// String building that accepts std::string_view.
//
// Debian 12's abseil is built with its own absl::string_view (not an alias of std::string_view),
// so absl::StrCat rejects std::string_view arguments. conveyor::StrCat converts them and forwards
// everything else to absl::StrCat unchanged (numbers formatted as absl formats them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace conveyor {
namespace strings_internal {

inline absl::string_view Piece(std::string_view s) { return absl::string_view(s.data(), s.size()); }
template <typename T>
const T& Piece(const T& v) {
  return v;
}

}  // namespace strings_internal

template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(strings_internal::Piece(args)...);
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  absl::StrAppend(out, strings_internal::Piece(args)...);
}

// "[T, H, W, 3]": a shape as the tree's errors and logs print it.
inline std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

}  // namespace conveyor
