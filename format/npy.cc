#include "format/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <charconv>

#include "absl/strings/escaping.h"
#include "base/float16.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::string_view Unquote(std::string_view s) {
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) {
    return s.substr(1, s.size() - 2);
  }
  return s;
}

bool ParseInt(std::string_view s, int64_t* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

absl::Status Malformed(const std::string& name, std::string_view what) {
  return absl::InvalidArgumentError(StrCat(name, ": malformed .npy file: ", what));
}

// Extracts the value text after 'key': in the header dict, up to the next top-level ',' or '}'.
bool FindValue(std::string_view header, std::string_view key, std::string* value) {
  std::string quoted1 = StrCat("'", key, "'");
  std::string quoted2 = StrCat("\"", key, "\"");
  size_t pos = header.find(quoted1);
  if (pos == std::string_view::npos) pos = header.find(quoted2);
  if (pos == std::string_view::npos) return false;
  pos = header.find(':', pos);
  if (pos == std::string_view::npos) return false;
  ++pos;
  int depth = 0;
  size_t end = pos;
  for (; end < header.size(); ++end) {
    char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    if (depth < 0) return false;
  }
  *value = std::string(Trim(header.substr(pos, end - pos)));
  return true;
}

template <typename T>
void Convert(const char* src, size_t count, float* dst) {
  for (size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<float>(v);
  }
}

std::string NumpyShapeTuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    StrAppend(&s, shape[i], shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  }
  return s + ")";
}

absl::Status WriteRaw(const std::string& path, const std::vector<int64_t>& shape,
                      std::string_view descr, const void* data, size_t bytes) {
  std::string header = StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ",
                                    NumpyShapeTuple(shape), ", }");
  // Magic (6) + version (2) + length (2) + header + '\n' is padded to a multiple of 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  f.close();
  if (!f) return absl::UnavailableError(StrCat("cannot write ", path));
  return absl::OkStatus();
}

// The little-endian values at `src` of numpy type `type` (f, i, u, b) and `width` bytes, as float.
absl::Status ConvertValues(char type, int64_t width, const char* src, uint64_t count, float* dst,
                           const std::string& name, const std::string& descr) {
  if (type == 'f' && width == 4) {
    Convert<float>(src, count, dst);
  } else if (type == 'f' && width == 8) {
    Convert<double>(src, count, dst);
  } else if (type == 'f' && width == 2) {
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = HalfToFloat(h);
    }
  } else if ((type == 'i' || type == 'u' || type == 'b') && width == 1) {
    if (type == 'i') {
      Convert<int8_t>(src, count, dst);
    } else {
      Convert<uint8_t>(src, count, dst);
    }
  } else if (type == 'i' && width == 2) {
    Convert<int16_t>(src, count, dst);
  } else if (type == 'i' && width == 4) {
    Convert<int32_t>(src, count, dst);
  } else if (type == 'i' && width == 8) {
    Convert<int64_t>(src, count, dst);
  } else if (type == 'u' && width == 2) {
    Convert<uint16_t>(src, count, dst);
  } else if (type == 'u' && width == 4) {
    Convert<uint32_t>(src, count, dst);
  } else if (type == 'u' && width == 8) {
    Convert<uint64_t>(src, count, dst);
  } else {
    return absl::InvalidArgumentError(StrCat(
        name, ": dtype '", descr, "' is not numeric (expected bool, int, uint or float)"));
  }
  return absl::OkStatus();
}

// A Fortran-order (column-major) array's values in C order (row-major).
void FortranToCOrder(uint64_t count, NpyArray* arr_ptr) {
  NpyArray& arr = *arr_ptr;
  // Column-major to row-major: walk C-order indices and fetch from Fortran strides.
  std::vector<float> c_order(count);
  const size_t nd = arr.shape.size();
  std::vector<uint64_t> fstride(nd, 1);
  for (size_t d = 1; d < nd; ++d) fstride[d] = fstride[d - 1] * arr.shape[d - 1];
  std::vector<int64_t> idx(nd, 0);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t f = 0;
    for (size_t d = 0; d < nd; ++d) f += idx[d] * fstride[d];
    c_order[i] = arr.values[f];
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < arr.shape[d]) break;
      idx[d] = 0;
    }
  }
  arr.values = std::move(c_order);
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes, const std::string& name) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) {
    return Malformed(name, "no \\x93NUMPY magic at byte offset 0");
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Malformed(name, "truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    return Malformed(name, StrCat("unsupported format version ", major));
  }
  if (header_start + header_len > bytes.size()) return Malformed(name, "header runs past the end");
  std::string_view header(bytes.data() + header_start, header_len);

  NpyArray arr;
  std::string descr, fortran, shape;
  if (!FindValue(header, "descr", &descr) || !FindValue(header, "fortran_order", &fortran) ||
      !FindValue(header, "shape", &shape)) {
    return Malformed(name, StrCat("header lacks descr, fortran_order or shape: ", header));
  }
  descr = std::string(Unquote(descr));
  arr.source_dtype = descr;
  const bool fortran_order = fortran == "True";
  if (!fortran_order && fortran != "False") return Malformed(name, "fortran_order is not a bool");
  std::string_view dims = shape;
  if (dims.size() < 2 || dims.front() != '(' || dims.back() != ')') {
    return Malformed(name, StrCat("shape is not a tuple: ", shape));
  }
  dims = dims.substr(1, dims.size() - 2);
  uint64_t count = 1;
  while (!dims.empty()) {
    size_t comma = dims.find(',');
    std::string_view d = Trim(dims.substr(0, comma));
    dims = comma == std::string_view::npos ? std::string_view() : dims.substr(comma + 1);
    if (d.empty() && Trim(dims).empty()) break;
    int64_t v;
    if (!ParseInt(d, &v) || v < 0) {
      return Malformed(name, StrCat("bad dimension '", d, "' in shape ", shape));
    }
    arr.shape.push_back(v);
    if (v != 0 && count > (1ull << 40) / static_cast<uint64_t>(v)) return Malformed(name, "shape too large");
    count *= static_cast<uint64_t>(v);
  }
  if (descr.size() < 3) return Malformed(name, StrCat("unsupported dtype '", descr, "'"));
  const char order = descr[0];
  const char type = descr[1];
  if (order != '<' && order != '>' && order != '|' && order != '=') {  // numpy's byte orders
    return Malformed(name, StrCat("unsupported dtype '", absl::CHexEscape(descr), "'"));
  }
  int64_t width = 0;
  if (!ParseInt(std::string_view(descr).substr(2), &width) || width <= 0 || width > 16) {
    return Malformed(name, StrCat("unsupported dtype '", descr, "'"));
  }
  if (order == '>' && width > 1) {
    return absl::InvalidArgumentError(
        StrCat(name, ": big-endian dtype '", descr, "' is not supported; save as '<", descr.substr(1), "'"));
  }
  const size_t data_start = header_start + header_len;
  const uint64_t need = count * static_cast<uint64_t>(width);
  if (bytes.size() - data_start != need) {
    return Malformed(name, StrCat("data is ", bytes.size() - data_start, " bytes, shape ",
                                        shape, " of ", descr, " needs ", need, " (truncated?)"));
  }
  arr.values.resize(count);
  RETURN_IF_ERROR(ConvertValues(type, width, bytes.data() + data_start, count,
                                arr.values.data(), name, descr));
  if (fortran_order && arr.shape.size() > 1) FortranToCOrder(count, &arr);
  return arr;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseNpy(ss.str(), path);
}

absl::Status WriteNpy(const std::string& path, const std::vector<int64_t>& shape,
                      const float* values) {
  size_t count = 1;
  for (int64_t d : shape) count *= static_cast<size_t>(d);
  return WriteRaw(path, shape, "<f4", values, count * sizeof(float));
}

absl::Status WriteNpyRaw(const std::string& path, const std::vector<int64_t>& shape,
                         std::string_view descr, const void* data, size_t bytes) {
  if (descr.empty()) {  // NumpyDescr of bfloat16: writing its bits as another type would lie
    return absl::InvalidArgumentError(
        StrCat("cannot write ", path, ": the tensor is bfloat16, which numpy has no .npy type "
               "for; serve the stream as float16 or float32 to write .npy files, or read the "
               "batch through the Python package (docs/sampling.md \"Tensor dtypes\")"));
  }
  return WriteRaw(path, shape, descr, data, bytes);
}

absl::Status WriteNpyF64(const std::string& path, const std::vector<int64_t>& shape,
                         const double* values) {
  size_t count = 1;
  for (int64_t d : shape) count *= static_cast<size_t>(d);
  return WriteRaw(path, shape, "<f8", values, count * sizeof(double));
}

std::string NpyCodec(std::string_view dtype, const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) StrAppend(&dims, dims.empty() ? "" : "x", d);
  return StrCat("npy ", dtype, " ", dims.empty() ? "scalar" : dims);
}

std::optional<std::vector<int64_t>> NpyCodecShape(std::string_view codec) {
  std::istringstream words{std::string(codec)};
  std::string format, dtype, dims, extra;
  words >> format >> dtype >> dims;
  if (format != "npy" || dims.empty() || (words >> extra)) return std::nullopt;
  std::vector<int64_t> shape;
  if (dims == "scalar") return shape;
  std::istringstream parts(dims);
  for (std::string d; std::getline(parts, d, 'x');) {
    int64_t v = 0;
    if (!ParseInt(d, &v) || v < 0) return std::nullopt;
    shape.push_back(v);
  }
  if (shape.empty() || dims.back() == 'x') return std::nullopt;
  return shape;
}

}  // namespace conveyor
