#include "datasets/webdataset/tar.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::webdataset {
namespace {

constexpr size_t kBlock = 512;

// Reads `file` through a window of `chunk` bytes, so walking headers over HTTP costs one request
// per chunk rather than one per header.
class WindowReader {
 public:
  WindowReader(const RandomAccessFile& file, size_t chunk)
      : file_(file), chunk_(std::max(chunk, kBlock)) {}

  // Bytes [offset, offset + n) of the file, valid until the next call. REQUIRES: within the file.
  absl::StatusOr<std::string_view> Get(uint64_t offset, size_t n) {
    if (offset < at_ || offset + n > at_ + buf_.size()) {
      const uint64_t want = std::max<uint64_t>(n, chunk_);
      const uint64_t len = std::min<uint64_t>(want, file_.size() - offset);
      buf_.resize(static_cast<size_t>(len));
      RETURN_IF_ERROR(file_.Read(offset, buf_.size(), buf_.data()));
      at_ = offset;
    }
    return std::string_view(buf_).substr(static_cast<size_t>(offset - at_), n);
  }

 private:
  const RandomAccessFile& file_;
  const size_t chunk_;
  std::string buf_;
  uint64_t at_ = 0;
};

// A NUL- or space-terminated field.
std::string Field(std::string_view h, size_t at, size_t len) {
  std::string_view f = h.substr(at, len);
  const size_t nul = f.find('\0');
  if (nul != std::string_view::npos) f = f.substr(0, nul);
  return std::string(f);
}

// A numeric field: octal digits (space or NUL padded) or, GNU's extension for sizes over 8 GiB,
// base-256 big-endian with the high bit of the first byte set.
bool Number(std::string_view h, size_t at, size_t len, uint64_t* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(h.data() + at);
  uint64_t v = 0;
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return false;  // negative
    for (size_t i = 1; i < len; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | p[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < len && p[i] == ' ') ++i;
  bool any = false;
  for (; i < len && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 61) return false;
    v = (v << 3) | (p[i] - '0');
    any = true;
  }
  for (; i < len; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return false;
  }
  *out = v;
  return any || p[0] == '\0' || p[0] == ' ';
}

// The header checksum: the sum of its bytes with the checksum field as spaces. Old tars summed
// signed chars; both are accepted, as GNU tar and Python's tarfile do.
bool ChecksumOk(std::string_view h) {
  uint64_t want = 0;
  if (!Number(h, 148, 8, &want)) return false;
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    unsigned_sum += in_field ? ' ' : static_cast<unsigned char>(h[i]);
    signed_sum += in_field ? ' ' : static_cast<signed char>(h[i]);
  }
  return static_cast<int64_t>(want) == unsigned_sum || static_cast<int64_t>(want) == signed_sum;
}

// A pax extended header's records: "LEN key=value\n", LEN counting the whole record.
absl::Status ParsePax(std::string_view data, std::string* path, std::optional<uint64_t>* size,
                      const std::string& where) {
  while (!data.empty()) {
    const size_t sp = data.find(' ');
    uint64_t len = 0;
    bool ok = sp != std::string_view::npos && sp > 0 && sp < 20;
    for (size_t i = 0; ok && i < sp; ++i) {
      ok = data[i] >= '0' && data[i] <= '9';
      len = len * 10 + static_cast<uint64_t>(data[i] - '0');
    }
    ok = ok && len > sp + 1 && len <= data.size() && data[len - 1] == '\n';
    if (!ok) {
      // Some writers pad the record area with NULs.
      if (data.find_first_not_of('\0') == std::string_view::npos) break;
      return absl::DataLossError(StrCat(where, ": malformed pax extended header record"));
    }
    const std::string_view rec = data.substr(sp + 1, len - sp - 2);
    const size_t eq = rec.find('=');
    if (eq == std::string_view::npos) {
      return absl::DataLossError(StrCat(where, ": pax record without '=': '", rec, "'"));
    }
    const std::string_view key = rec.substr(0, eq), value = rec.substr(eq + 1);
    if (key == "path") {
      *path = std::string(value);
    } else if (key == "size") {
      uint64_t v = 0;
      if (value.empty() || value.size() > 19 ||
          value.find_first_not_of("0123456789") != std::string_view::npos) {
        return absl::DataLossError(StrCat(where, ": pax size '", value, "' is not a number"));
      }
      for (char c : value) v = v * 10 + static_cast<uint64_t>(c - '0');
      *size = v;
    }
    data.remove_prefix(len);
  }
  return absl::OkStatus();
}

uint64_t Padded(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// Why a file that starts with `head` cannot be read as a tar in place, or "" when it can.
std::string CompressedReason(std::string_view head) {
  auto starts = [&](std::string_view magic) { return head.substr(0, magic.size()) == magic; };
  const char* what = starts("\x1f\x8b") ? "gzip"
                     : starts("BZh")    ? "bzip2"
                     : starts(std::string_view("\xfd"
                                               "7zXZ\0",
                                               6))
                         ? "xz"
                     : starts("\x28\xb5\x2f\xfd") ? "zstd"
                                                  : nullptr;
  if (what == nullptr) return "";
  return StrCat("is a ", what,
                "-compressed tar: a compressed stream has no byte offsets for its "
                "members, so a sample cannot be range-read from it. Decompress the shards once "
                "(e.g. `gzip -d shard.tar.gz`, or `zstd -d`) and point Conveyor at the .tar files; "
                "video and image members are compressed already, so the shards grow little");
}

}  // namespace

absl::StatusOr<TarListing> ListTar(const RandomAccessFile& file, size_t chunk) {
  TarListing out;
  const uint64_t end = file.size();
  const std::string& name = file.name();
  WindowReader reader(file, chunk);
  if (end == 0) {
    out.error = StrCat(name, " is empty (a tar ends with two zero blocks)");
    return out;
  }
  {
    ASSIGN_OR_RETURN(std::string_view head,
                     reader.Get(0, static_cast<size_t>(std::min<uint64_t>(end, 8))));
    const std::string why = CompressedReason(head);
    if (!why.empty()) return absl::FailedPreconditionError(StrCat(name, " ", why));
  }
  std::string long_name;  // GNU 'L' for the next entry
  std::string pax_path;   // pax 'x' for the next entry
  std::optional<uint64_t> pax_size;
  uint64_t pos = 0;
  while (true) {
    if (pos >= end || end - pos < kBlock) {
      out.error =
          StrCat(name, ": the archive ends at byte ", end, " inside or before a header at byte ",
                 pos, ", without the end-of-archive blocks (a truncated shard)");
      return out;
    }
    ASSIGN_OR_RETURN(std::string_view h, reader.Get(pos, kBlock));
    if (h.find_first_not_of('\0') == std::string_view::npos) return out;  // end of archive
    const std::string where = StrCat(name, ", header at byte ", pos);
    if (!ChecksumOk(h)) {
      out.error = StrCat(
          where,
          ": bad header checksum (not a tar, or damaged here); the members after it are not read");
      return out;
    }
    uint64_t size = 0;
    if (!Number(h, 124, 12, &size)) {
      out.error = StrCat(where, ": the size field is not a number");
      return out;
    }
    const char type = h[156];
    if (pax_size.has_value() && type != 'x' && type != 'g') size = *pax_size;
    const uint64_t data = pos + kBlock;
    if (size > end - data) {
      out.error =
          StrCat(where, " ('",
                 long_name.empty() ? (pax_path.empty() ? Field(h, 0, 100) : pax_path) : long_name,
                 "'): its data is ", size, " bytes from byte ", data,
                 ", past the end of the file at byte ", end, " (a truncated shard)");
      return out;
    }
    const uint64_t next = data + Padded(size);
    if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
      if (size > (16u << 20)) {
        out.error = StrCat(where, ": a ", size, "-byte extended header (over 16 MiB)");
        return out;
      }
      ASSIGN_OR_RETURN(std::string_view body, reader.Get(data, static_cast<size_t>(size)));
      if (type == 'x') {
        absl::Status st = ParsePax(body, &pax_path, &pax_size, where);
        if (!st.ok()) {
          out.error = std::string(st.message());
          return out;
        }
      } else if (type == 'L') {
        long_name = std::string(body.substr(0, body.find('\0')));
      }
      // 'g' (global pax defaults) and 'K' (a long link target) name no member.
      pos = next;
      continue;
    }
    std::string path;
    if (!pax_path.empty()) {
      path = pax_path;
    } else if (!long_name.empty()) {
      path = long_name;
    } else {
      path = Field(h, 0, 100);
      // POSIX ustar splits long names into prefix/name; GNU's "ustar  " uses that area otherwise.
      if (h.substr(257, 6) == std::string_view("ustar\0", 6)) {
        const std::string prefix = Field(h, 345, 155);
        if (!prefix.empty()) path = StrCat(prefix, "/", path);
      }
    }
    long_name.clear();
    pax_path.clear();
    pax_size.reset();
    if (type == '0' || type == '\0' || type == '7') {
      while (path.rfind("./", 0) == 0) path.erase(0, 2);
      out.members.push_back({std::move(path), pos, data, size});
    } else if (type != '5') {
      out.skipped.push_back(StrCat(path, " (type '", std::string(1, type), "')"));
    }
    pos = next;
  }
}

namespace {

class SubRange final : public RandomAccessFile {
 public:
  SubRange(const RandomAccessFile& file, uint64_t offset, uint64_t size, std::string name)
      : file_(file), offset_(offset), size_(size), name_(std::move(name)) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError(StrCat(name_, ": read of ", n, " bytes at ", offset,
                                          " is past its end (", size_, " bytes)"));
    }
    return file_.Read(offset_ + offset, n, dst);
  }
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string version() const override { return file_.version(); }

 private:
  const RandomAccessFile& file_;
  const uint64_t offset_, size_;
  const std::string name_;
};

}  // namespace

std::unique_ptr<RandomAccessFile> SubRangeFile(const RandomAccessFile& file, uint64_t offset,
                                               uint64_t size, std::string name) {
  return std::make_unique<SubRange>(file, offset, size, std::move(name));
}

}  // namespace conveyor::webdataset
