#include "datasets/webdataset/wds_index.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>

#include "base/status_macros.h"
#include "base/strings.h"
#include "format/format.h"

namespace conveyor::webdataset {
namespace {

namespace fs = std::filesystem;

// Bumped whenever the entry's layout or the meaning of a member's facts changes.
constexpr std::string_view kMagic = "CVYWDSX1";

std::string PathOf(const std::string& dir, const std::string& key) {
  return (fs::path(dir) / StrCat(format::ChecksumHex(format::Checksum(key)), ".wdsidx")).string();
}

void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }
void PutStr(std::string* s, std::string_view v) {
  PutU64(s, v.size());
  s->append(v);
}

// Reads an entry's fields in order; any overrun makes the whole entry invalid.
class Cursor {
 public:
  Cursor(const std::string& bytes, size_t at, size_t end) : bytes_(bytes), at_(at), end_(end) {}
  bool U64(uint64_t* v) {
    if (end_ - at_ < 8) return false;
    std::memcpy(v, bytes_.data() + at_, 8);
    at_ += 8;
    return true;
  }
  bool Str(std::string* v, size_t* where = nullptr) {
    uint64_t n = 0;
    if (!U64(&n) || n > end_ - at_) return false;
    if (where != nullptr) *where = at_;
    v->assign(bytes_, at_, static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return true;
  }
  bool done() const { return at_ == end_; }

 private:
  const std::string& bytes_;
  size_t at_, end_;
};

// Entry: magic | key | u64 samples | per sample (key, error, u64 members | per member (ext,
// column, offset, size, facts)) | u64 skipped | skipped strings | u64 XXH3 of all before it.
// Strings are a u64 length and the bytes. A torn, foreign or stale entry fails its checks and is
// rebuilt.
std::optional<ShardSetIndex> ReadEntry(const std::string& path, const std::string& key) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string bytes;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < (1ll << 36)) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n =
          ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    bytes.resize(got);
  }
  ::close(fd);
  if (bytes.size() < kMagic.size() + 16 || bytes.compare(0, kMagic.size(), kMagic) != 0)
    return std::nullopt;
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  if (format::Checksum(std::string_view(bytes).substr(0, bytes.size() - 8)) != sum)
    return std::nullopt;
  Cursor c(bytes, kMagic.size(), bytes.size() - 8);
  std::string got_key;
  uint64_t n = 0;
  if (!c.Str(&got_key) || got_key != key || !c.U64(&n) || n > bytes.size()) return std::nullopt;
  ShardSetIndex index;
  index.from_cache = true;
  index.cache_path = path;
  index.samples.resize(static_cast<size_t>(n));
  for (SampleEntry& s : index.samples) {
    uint64_t m = 0;
    if (!c.Str(&s.key) || !c.Str(&s.error) || !c.U64(&m) || m > bytes.size()) return std::nullopt;
    s.members.resize(static_cast<size_t>(m));
    for (MemberRef& r : s.members) {
      uint64_t column = 0;
      size_t at = 0;
      if (!c.Str(&r.ext) || !c.U64(&column) || !c.U64(&r.offset) || !c.U64(&r.size) ||
          !c.Str(&r.facts, &at)) {
        return std::nullopt;
      }
      r.column = static_cast<uint32_t>(column);
      r.facts_at = at;
    }
  }
  if (!c.U64(&n) || n > bytes.size()) return std::nullopt;
  index.skipped.resize(static_cast<size_t>(n));
  for (std::string& s : index.skipped) {
    if (!c.Str(&s)) return std::nullopt;
  }
  if (!c.done()) return std::nullopt;
  return index;
}

// Writes the entry (O_EXCL temporary, 0600, renamed into place) and records where each member's
// facts lie in it. Failing to write is a warning: the index then lives in memory only.
void WriteEntry(const std::string& dir, const std::string& key, ShardSetIndex* index) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string bytes(kMagic);
  PutStr(&bytes, key);
  PutU64(&bytes, index->samples.size());
  std::vector<uint64_t*> at;
  std::vector<uint64_t> positions;
  for (SampleEntry& s : index->samples) {
    PutStr(&bytes, s.key);
    PutStr(&bytes, s.error);
    PutU64(&bytes, s.members.size());
    for (MemberRef& r : s.members) {
      PutStr(&bytes, r.ext);
      PutU64(&bytes, r.column);
      PutU64(&bytes, r.offset);
      PutU64(&bytes, r.size);
      PutStr(&bytes, r.facts);
      at.push_back(&r.facts_at);
      positions.push_back(bytes.size() - r.facts.size());
    }
  }
  PutU64(&bytes, index->skipped.size());
  for (const std::string& s : index->skipped) PutStr(&bytes, s);
  PutU64(&bytes, format::Checksum(bytes));
  const std::string path = PathOf(dir, key);
  const std::string tmp = StrCat(path, ".tmp.", ::getpid(), ".", std::random_device()());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    spdlog::warn(
        "webdataset: cannot create the member index cache entry {} (continuing without it)", tmp);
    return;
  }
  size_t put = 0;
  while (put < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + put, bytes.size() - put);
    if (n <= 0) break;
    put += static_cast<size_t>(n);
  }
  ::close(fd);
  if (put != bytes.size() || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    spdlog::warn("webdataset: cannot write the member index cache entry {} (continuing without it)",
                 path);
    return;
  }
  for (size_t i = 0; i < at.size(); ++i) *at[i] = positions[i];
  index->cache_path = path;
}

}  // namespace

std::pair<std::string, std::string> SplitKey(std::string_view path) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', base);
  if (dot == std::string_view::npos) return {std::string(path), ""};
  return {std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

absl::StatusOr<ShardSetIndex> IndexShardSet(const std::vector<const RandomAccessFile*>& tars,
                                            const std::string& cache_dir,
                                            const MemberProber& probe) {
  std::string key = "webdataset-members-v1\n";
  bool cacheable = !cache_dir.empty();
  for (const RandomAccessFile* f : tars) {
    StrAppend(&key, f->name(), "\n", f->size(), "\n", f->version(), "\n");
    cacheable = cacheable && !f->version().empty();
  }
  if (cacheable) {
    if (std::optional<ShardSetIndex> hit = ReadEntry(PathOf(cache_dir, key), key))
      return *std::move(hit);
  }
  ShardSetIndex index;
  std::map<std::string, size_t, std::less<>> by_key;
  std::vector<std::vector<TarMember>> listed(tars.size());
  std::vector<std::string> tail_errors;
  for (size_t c = 0; c < tars.size(); ++c) {
    ASSIGN_OR_RETURN(TarListing l, ListTar(*tars[c]));
    for (std::string& s : l.skipped) index.skipped.push_back(StrCat(tars[c]->name(), ": ", s));
    if (!l.error.empty()) tail_errors.push_back(std::move(l.error));
    for (TarMember& m : l.members) {
      auto [k, ext] = SplitKey(m.path);
      auto [it, fresh] = by_key.try_emplace(k, index.samples.size());
      if (fresh) index.samples.push_back({k, "", {}});
      SampleEntry& s = index.samples[it->second];
      for (const MemberRef& r : s.members) {
        if (r.ext == ext && s.error.empty()) {
          s.error = StrCat(tars[c]->name(), ": sample '", k, "' has two members '", m.path,
                           "' (at bytes ", r.offset, " and ", m.offset, ")");
        }
      }
      s.members.push_back(
          {std::move(ext), static_cast<uint32_t>(c), m.offset, m.size, "", 0, 0, 0});
      listed[c].push_back(std::move(m));
    }
  }
  for (size_t si = 0; si < index.samples.size(); ++si) {
    SampleEntry& s = index.samples[si];
    for (MemberRef& r : s.members) {
      if (!s.error.empty()) break;
      const RandomAccessFile& tar = *tars[r.column];
      const TarMember m{StrCat(s.key, ".", r.ext), 0, r.offset, r.size};
      const std::string where = StrCat(tar.name(), ", sample '", s.key, "', member '", m.path,
                                       "' (", r.size, " bytes at byte ", r.offset, ")");
      absl::StatusOr<std::string> facts = probe(tar, m, r.ext, where);
      if (facts.ok()) {
        r.facts = *std::move(facts);
      } else {
        s.error = std::string(facts.status().message());
      }
    }
  }
  // A damaged tar: the samples before the damage are read; the damage itself is a broken sample,
  // so `conveyor check` names it and its quarantine accounts for it.
  for (std::string& e : tail_errors) index.samples.push_back({StrCat("(damaged tar) ", e), e, {}});
  if (cacheable) WriteEntry(cache_dir, key, &index);
  return index;
}

}  // namespace conveyor::webdataset
