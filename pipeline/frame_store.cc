#include "pipeline/frame_store.h"

#include <fcntl.h>
#include <lz4.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/cache_dir.h"
#include "base/posix_file.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "pipeline/frame_cache.h"
#include "spdlog/spdlog.h"
#include "xxhash.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;

// Version 2 (frames2/): the header has room for a MAC. A version-1 store's frames1/ is never read
// (its entries are misses) and `conveyor cache clear` removes it.
constexpr char kMagic[8] = {'C', 'V', 'Y', 'F', 'R', 'A', 'M', '2'};
constexpr size_t kHeaderBytes = 96;
constexpr size_t kMacAt = 56;   // HMAC-SHA256 of the header's first 56 bytes, the key and the payload (shared stores)
constexpr size_t kSelfAt = 88;  // XXH3 of the header's first 88 bytes
constexpr char kFramesDir[] = "frames2";
constexpr char kOldFramesDir[] = "frames1";
constexpr double kLowWater = 0.9;         // lru eviction frees down to this share of the bound
constexpr int kStaleTmpSeconds = 3600;    // tmp/ files older than this belong to a dead writer
constexpr uint64_t kCorruptLogEvery = 1000;  // after the first 10, one warning per this many

struct Header {
  uint64_t key_hash = 0;
  int32_t width = 0, height = 0;
  uint32_t codec = 0;
  uint64_t raw_bytes = 0, payload_bytes = 0, payload_xxh3 = 0;
};

void EncodeHeader(const Header& h, char* out) {
  std::memset(out, 0, kHeaderBytes);
  std::memcpy(out, kMagic, 8);
  std::memcpy(out + 8, &h.key_hash, 8);
  std::memcpy(out + 16, &h.width, 4);
  std::memcpy(out + 20, &h.height, 4);
  std::memcpy(out + 24, &h.codec, 4);
  std::memcpy(out + 32, &h.raw_bytes, 8);
  std::memcpy(out + 40, &h.payload_bytes, 8);
  std::memcpy(out + 48, &h.payload_xxh3, 8);
}

// Seals an encoded header: its own checksum, after the MAC (if any) is in place.
void SealHeader(char* out) {
  const uint64_t self = XXH3_64bits(out, kSelfAt);
  std::memcpy(out + kSelfAt, &self, 8);
}

// False for a header that is not one of ours or is damaged.
bool DecodeHeader(const char* in, Header* h) {
  if (std::memcmp(in, kMagic, 8) != 0) return false;
  uint64_t self = 0;
  std::memcpy(&self, in + kSelfAt, 8);
  if (self != XXH3_64bits(in, kSelfAt)) return false;
  std::memcpy(&h->key_hash, in + 8, 8);
  std::memcpy(&h->width, in + 16, 4);
  std::memcpy(&h->height, in + 20, 4);
  std::memcpy(&h->codec, in + 24, 4);
  std::memcpy(&h->raw_bytes, in + 32, 8);
  std::memcpy(&h->payload_bytes, in + 40, 8);
  std::memcpy(&h->payload_xxh3, in + 48, 8);
  return h->width > 0 && h->height > 0 &&
         h->raw_bytes == static_cast<uint64_t>(h->width) * static_cast<uint64_t>(h->height) * 3 &&
         h->codec <= static_cast<uint32_t>(FrameStoreOptions::Compression::kZstd);
}

// The key as the MAC covers it: the dataset key and the numbers, unambiguous.
std::string KeyBytes(const FrameCacheKey& k) {
  std::string out = k.dataset;
  const uint64_t fields[4] = {k.episode, static_cast<uint64_t>(static_cast<int64_t>(k.stream)),
                              static_cast<uint64_t>(k.frame), k.settings};
  out.append(reinterpret_cast<const char*>(fields), sizeof fields);
  return out;
}

uint64_t KeyHash(const FrameCacheKey& k) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, k.dataset.data(), k.dataset.size());
  const uint64_t fields[4] = {k.episode, static_cast<uint64_t>(static_cast<int64_t>(k.stream)),
                              static_cast<uint64_t>(k.frame), k.settings};
  XXH3_64bits_update(s, fields, sizeof fields);
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A directory name for the dataset key: itself when it is short and plain, else its hash.
std::string DatasetDir(const std::string& key) {
  const bool plain = !key.empty() && key.size() <= 80 && key[0] != '.' &&
                     std::all_of(key.begin(), key.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
                     });
  if (plain) return key;
  return StrCat("h", Hex(XXH3_64bits(key.data(), key.size())));
}

uint64_t ReadUsage(int fd) {
  uint64_t usage = 0;
  if (fd < 0 || !ReadFull(fd, reinterpret_cast<char*>(&usage), 8, 0)) return 0;
  return usage;
}

void WriteUsage(int fd, uint64_t usage) {
  if (fd >= 0) WriteFull(fd, reinterpret_cast<const char*>(&usage), 8, 0);
}

// Entries under frames1/ (optionally only one dataset directory), with their sizes and mtimes.
struct EntryFile {
  fs::path path;
  uint64_t bytes;
  std::time_t used;
};
std::vector<EntryFile> ListEntries(const std::string& dir) {
  std::vector<EntryFile> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(fs::path(dir) / kFramesDir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    // lstat: a planted symbolic link is neither counted nor followed (eviction unlinks the link).
    struct stat st;
    if (it->path().filename() == "source" || ::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back({it->path(), static_cast<uint64_t>(st.st_size), st.st_mtime});
  }
  return out;
}

// A regular file of the store opened by path for `conveyor cache info|clear`, which look at a store
// without the key: never through a symbolic link, never blocking on a FIFO; invalid otherwise.
Fd OpenRegular(const std::string& path, int flags) {
  Fd fd(::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
  struct stat st;
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return Fd();
  return fd;
}

// Holds the store's flock (and, within this process, `mu`: flock does not exclude threads that
// share one open file description).
class LockedStore {
 public:
  LockedStore(absl::Mutex* mu, int fd) : lock_(mu), fd_(fd) { ok_ = fd_ >= 0 && ::flock(fd_, LOCK_EX) == 0; }
  ~LockedStore() {
    if (ok_) ::flock(fd_, LOCK_UN);
  }
  bool ok() const { return ok_; }

 private:
  absl::MutexLock lock_;
  int fd_;
  bool ok_ = false;
};

}  // namespace

struct FrameStore::Counters {
  std::atomic<uint64_t> hits{0}, misses{0}, hit_bytes{0}, published{0}, published_bytes{0},
      already_present{0}, rejected{0}, evicted_bytes{0}, corrupt{0}, write_errors{0}, usage{0};
  std::atomic<bool> warned{false};
  absl::Mutex mu;  // with the flock: one publisher at a time in this process
  std::unique_ptr<CacheDir> dir;  // checked and opened once (base/cache_dir.h)
  Fd tmp_fd;                      // DIR/tmp
  Fd lock_fd;
  Fd usage_fd;
};

FrameStore::FrameStore(FrameStoreOptions options)
    : options_(std::move(options)), counters_(std::make_unique<Counters>()) {}

FrameStore::~FrameStore() = default;

absl::StatusOr<std::unique_ptr<FrameStore>> FrameStore::Open(FrameStoreOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("frame cache directory: empty path");
  if (options.max_bytes == 0) {
    return absl::InvalidArgumentError(StrCat("frame cache directory ", options.dir, ": the bound (bytes) must be > 0"));
  }
  std::unique_ptr<FrameStore> store(new FrameStore(std::move(options)));
  const std::string& dir = store->options_.dir;
  Counters& c = *store->counters_;
  ASSIGN_OR_RETURN(c.dir, CacheDir::Open({dir, "frame cache directory", store->options_.shared_key_file}));
  auto refuse = [&](const char* name) {
    const int e = errno;
    return absl::PermissionDeniedError(StrCat(
        "frame cache directory ", dir, ": cannot open ", name, ": ", std::strerror(e),
        e == ELOOP ? " (a symbolic link: refused, not followed)" : e == EINVAL ? " (not a regular file: refused)" : ""));
  };
  if (!c.dir->OpenDir(kFramesDir, /*create=*/true).ok()) return refuse(kFramesDir);
  c.tmp_fd = c.dir->OpenDir("tmp", /*create=*/true);
  if (!c.tmp_fd.ok()) return refuse("tmp");
  c.lock_fd = c.dir->OpenFile(c.dir->fd(), "lock", O_RDWR, /*create=*/true);
  if (!c.lock_fd.ok()) return refuse("lock");
  c.usage_fd = c.dir->OpenFile(c.dir->fd(), "usage", O_RDWR, /*create=*/true);
  if (!c.usage_fd.ok()) return refuse("usage");
  LockedStore lock(&c.mu, c.lock_fd.get());
  if (!lock.ok()) {
    return absl::PermissionDeniedError(StrCat("frame cache directory ", dir, ": cannot lock: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(c.usage_fd.get(), &st) == 0 && st.st_size != 8) {
    // A new store, or an account lost: count what is there.
    uint64_t total = 0;
    for (const EntryFile& e : ListEntries(dir)) total += e.bytes;
    WriteUsage(c.usage_fd.get(), total);
  }
  c.usage.store(ReadUsage(c.usage_fd.get()));
  return store;
}

namespace {
// An entry's directory under the store and its file name there.
std::string EntryDir(const FrameCacheKey& k) {
  return StrCat(kFramesDir, "/", DatasetDir(k.dataset), "/", Hex(k.settings), "/", k.episode);
}
std::string EntryName(const FrameCacheKey& k) { return StrCat(k.stream, ".", k.frame); }

bool IsRegularAt(int dirfd, const std::string& name) {
  struct stat st;
  return dirfd >= 0 && ::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}
}  // namespace

bool FrameStore::Contains(const FrameCacheKey& key) const {
  return IsRegularAt(counters_->dir->OpenDir(EntryDir(key), false).get(), EntryName(key));
}

std::shared_ptr<const RgbImage> FrameStore::Find(const FrameCacheKey& key) const {
  Counters& c = *counters_;
  const std::string name = EntryName(key);
  const std::string path = StrCat(options_.dir, "/", EntryDir(key), "/", name);
  const Fd dfd = c.dir->OpenDir(EntryDir(key), false);
  Fd fd = dfd.ok() ? c.dir->OpenFile(dfd.get(), name, O_RDONLY) : Fd();
  if (!fd.ok() && dfd.ok() && (errno == ELOOP || errno == EINVAL || errno == EPERM)) {
    // Something that is not our entry (a link, a FIFO, another uid's file) where an entry goes:
    // not opened, not followed; counted, and removed below when it is still there.
    c.misses.fetch_add(1, std::memory_order_relaxed);
    const uint64_t n = c.corrupt.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n <= 10 || n % kCorruptLogEvery == 0) {
      spdlog::warn("frame cache {}: {} is {}; not followed, removed, the frame is decoded again", options_.dir, path,
                   errno == ELOOP ? "a symbolic link" : errno == EPERM ? "another user's file" : "not a regular file");
    }
    ::unlinkat(dfd.get(), name.c_str(), 0);
    return nullptr;
  }
  if (!fd.ok()) {
    c.misses.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  // Every check that fails lands here: the entry is removed (if it is still the one we read)
  // and the frame is decoded again.
  auto corrupt = [&](const char* why) -> std::shared_ptr<const RgbImage> {
    c.misses.fetch_add(1, std::memory_order_relaxed);
    const uint64_t n = c.corrupt.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n <= 10 || n % kCorruptLogEvery == 0) {
      spdlog::warn("frame cache {}: entry {} {}; removed, the frame is decoded again ({} so far)", options_.dir,
                   path, why, n);
    }
    struct stat mine, now;
    if (::fstat(fd.get(), &mine) != 0) return nullptr;
    LockedStore lock(&c.mu, c.lock_fd.get());
    if (lock.ok() && ::fstatat(dfd.get(), name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == mine.st_ino &&
        now.st_dev == mine.st_dev && ::unlinkat(dfd.get(), name.c_str(), 0) == 0) {
      // The entry may have been accounted at another size than it has now (a torn write), so
      // the account is recounted (damage is rare; a scan is milliseconds).
      uint64_t total = 0;
      for (const EntryFile& e : ListEntries(options_.dir)) total += e.bytes;
      WriteUsage(c.usage_fd.get(), total);
      c.usage.store(total, std::memory_order_relaxed);
    }
    return nullptr;
  };
  struct stat st;
  char hbuf[kHeaderBytes];
  Header h;
  if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
      !ReadFull(fd.get(), hbuf, kHeaderBytes, 0) || !DecodeHeader(hbuf, &h)) {
    return corrupt("has a damaged header");
  }
  if (h.key_hash != KeyHash(key)) return corrupt("belongs to another key");
  if (static_cast<uint64_t>(st.st_size) != kHeaderBytes + h.payload_bytes) return corrupt("is truncated");
  // A shared store: the entry must carry the MAC of the node secret over its header, key and
  // payload; anyone who could write the entry without the secret wrote a miss.
  auto authentic = [&](const char* payload, size_t n) {
    CacheMac mac;
    return !c.dir->shared() ||
           (c.dir->Mac({std::string_view(hbuf, kMacAt), KeyBytes(key), std::string_view(payload, n)}, &mac) &&
            CacheDir::MacEqual(mac, reinterpret_cast<const uint8_t*>(hbuf + kMacAt)));
  };
  auto img = std::make_shared<RgbImage>();
  img->width = h.width;
  img->height = h.height;
  img->pixels.resize(h.raw_bytes);
  const auto codec = static_cast<FrameStoreOptions::Compression>(h.codec);
  if (codec == FrameStoreOptions::Compression::kNone) {
    if (h.payload_bytes != h.raw_bytes) return corrupt("has the wrong size");
    if (!ReadFull(fd.get(), reinterpret_cast<char*>(img->pixels.data()), h.raw_bytes, kHeaderBytes)) {
      return corrupt("cannot be read");
    }
    if (XXH3_64bits(img->pixels.data(), h.raw_bytes) != h.payload_xxh3) return corrupt("fails its checksum");
    if (!authentic(reinterpret_cast<const char*>(img->pixels.data()), h.raw_bytes)) {
      return corrupt("fails its MAC (not written with this store's key)");
    }
  } else {
    thread_local std::string payload;
    payload.resize(h.payload_bytes);
    if (!ReadFull(fd.get(), payload.data(), h.payload_bytes, kHeaderBytes)) return corrupt("cannot be read");
    if (XXH3_64bits(payload.data(), payload.size()) != h.payload_xxh3) return corrupt("fails its checksum");
    if (!authentic(payload.data(), payload.size())) return corrupt("fails its MAC (not written with this store's key)");
    size_t got = 0;
    if (codec == FrameStoreOptions::Compression::kLz4) {
      const int r = LZ4_decompress_safe(payload.data(), reinterpret_cast<char*>(img->pixels.data()),
                                        static_cast<int>(payload.size()), static_cast<int>(h.raw_bytes));
      got = r < 0 ? 0 : static_cast<size_t>(r);
    } else {
      const size_t r = ZSTD_decompress(img->pixels.data(), h.raw_bytes, payload.data(), payload.size());
      got = ZSTD_isError(r) ? 0 : r;
    }
    if (got != h.raw_bytes) return corrupt("does not decompress");
  }
  if (options_.policy == FrameStoreOptions::Policy::kLru) ::futimens(fd.get(), nullptr);  // recently used
  c.hits.fetch_add(1, std::memory_order_relaxed);
  c.hit_bytes.fetch_add(h.raw_bytes, std::memory_order_relaxed);
  return img;
}

namespace {

// The frame's bytes as the store keeps them: compressed when that is smaller (pointing into a
// thread-local buffer), else the frame's own pixels. False, saying why, when a compressor fails.
bool PackFrame(FrameStoreOptions::Compression compression, const RgbImage& frame,
               const char** payload, size_t* payload_bytes, std::string* error) {
  *payload = reinterpret_cast<const char*>(frame.pixels.data());
  *payload_bytes = frame.pixels.size();
  thread_local std::string packed;
  if (compression == FrameStoreOptions::Compression::kLz4) {
    packed.resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(*payload_bytes))));
    const int n = LZ4_compress_default(*payload, packed.data(), static_cast<int>(*payload_bytes),
                                       static_cast<int>(packed.size()));
    if (n <= 0) {
      *error = "lz4 compression failed";
      return false;
    }
    if (static_cast<size_t>(n) < *payload_bytes) {
      *payload = packed.data();
      *payload_bytes = static_cast<size_t>(n);
    }
  } else if (compression == FrameStoreOptions::Compression::kZstd) {
    packed.resize(ZSTD_compressBound(*payload_bytes));
    const size_t n = ZSTD_compress(packed.data(), packed.size(), *payload, *payload_bytes, 1);
    if (ZSTD_isError(n)) {
      *error = "zstd compression failed";
      return false;
    }
    if (n < *payload_bytes) {
      *payload = packed.data();
      *payload_bytes = n;
    }
  }
  return true;
}

// The lru policy, under the store's lock: removes the least recently used entries until the store
// plus `entry_bytes` is down to the low-water mark, and temporary files left by writers that died.
// Returns the store's bytes after; *evicted: the bytes removed.
uint64_t EvictLeastRecentlyUsed(const std::string& dir, uint64_t max_bytes, uint64_t entry_bytes,
                                uint64_t* evicted) {
  std::vector<EntryFile> entries = ListEntries(dir);
  uint64_t total = 0;
  for (const EntryFile& e : entries) total += e.bytes;
  std::sort(entries.begin(), entries.end(),
            [](const EntryFile& a, const EntryFile& b) { return a.used < b.used; });
  const auto target = static_cast<uint64_t>(static_cast<double>(max_bytes) * kLowWater);
  for (const EntryFile& e : entries) {
    if (total + entry_bytes <= target) break;
    if (::unlink(e.path.c_str()) == 0) {
      total -= e.bytes;
      *evicted += e.bytes;
    }
  }
  const std::time_t now = std::time(nullptr);
  std::error_code ec;
  for (auto it = fs::directory_iterator(fs::path(dir) / "tmp", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) == 0 && now - st.st_mtime > kStaleTmpSeconds) {
      ::unlink(it->path().c_str());
    }
  }
  return total;
}

// Writes an entry, its header sealed (and MAC'd in a group-shared store), to a new file in
// `tmp_dir` (DIR/tmp) named in `*tmp_name`, to be renamed into place under the lock. False with
// `*error` set, and nothing left behind, when it cannot.
bool WriteTempEntry(const CacheDir& cache_dir, int tmp_dir, const std::string& dir, const Header& h,
                    const FrameCacheKey& key, std::string_view payload, std::string* tmp_name,
                    std::string* error) {
  char hbuf[kHeaderBytes];
  EncodeHeader(h, hbuf);
  if (cache_dir.shared()) {
    CacheMac mac;
    if (!cache_dir.Mac({std::string_view(hbuf, kMacAt), KeyBytes(key), payload}, &mac)) {
      *error = "cannot compute an entry's MAC (libcrypto failed)";
      return false;
    }
    std::memcpy(hbuf + kMacAt, mac.data(), mac.size());
  }
  SealHeader(hbuf);
  Fd fd = cache_dir.CreateTemp(tmp_dir, tmp_name);
  if (!fd.ok() || !WriteFull(fd.get(), hbuf, kHeaderBytes, 0) ||
      !WriteFull(fd.get(), payload.data(), payload.size(), kHeaderBytes)) {
    *error = StrCat("cannot write ", dir, "/tmp/", *tmp_name, ": ", std::strerror(errno));
    if (fd.ok()) ::unlinkat(tmp_dir, tmp_name->c_str(), 0);
    return false;
  }
  return true;
}

}  // namespace

void FrameStore::Insert(const FrameCacheKey& key, const RgbImage& frame) const {
  Counters& c = *counters_;
  const std::string name = EntryName(key);
  const std::string path = StrCat(options_.dir, "/", EntryDir(key), "/", name);
  if (Contains(key)) {
    c.already_present.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto warn_once = [&](const std::string& what) {
    c.write_errors.fetch_add(1, std::memory_order_relaxed);
    if (!c.warned.exchange(true)) {
      spdlog::warn("frame cache {}: {} (frames are decoded as without it)", options_.dir, what);
    }
  };
  Header h;
  h.key_hash = KeyHash(key);
  h.width = frame.width;
  h.height = frame.height;
  h.codec = static_cast<uint32_t>(options_.compression);
  h.raw_bytes = frame.pixels.size();
  if (h.raw_bytes != static_cast<uint64_t>(frame.width) * static_cast<uint64_t>(frame.height) * 3 || h.raw_bytes == 0) {
    return;
  }
  const char* payload = nullptr;
  size_t payload_bytes = 0;
  if (std::string error; !PackFrame(options_.compression, frame, &payload, &payload_bytes, &error)) {
    return warn_once(error);
  }
  // An incompressible frame is kept raw.
  if (payload == reinterpret_cast<const char*>(frame.pixels.data())) h.codec = 0;
  h.payload_bytes = payload_bytes;
  h.payload_xxh3 = XXH3_64bits(payload, payload_bytes);
  const uint64_t entry_bytes = kHeaderBytes + payload_bytes;
  if (entry_bytes > options_.max_bytes ||
      (options_.policy == FrameStoreOptions::Policy::kPinWhatFits &&
       ReadUsage(c.usage_fd.get()) + entry_bytes > options_.max_bytes)) {
    c.rejected.fetch_add(1, std::memory_order_relaxed);  // checked again under the lock
    return;
  }
  std::string tmp_name;
  const int tmp_dir = c.tmp_fd.get();
  if (std::string error; !WriteTempEntry(*c.dir, tmp_dir, options_.dir, h, key,
                                         std::string_view(payload, payload_bytes), &tmp_name, &error)) {
    return warn_once(error);
  }
  const Fd entry_dir = c.dir->OpenDir(EntryDir(key), /*create=*/true);
  if (!entry_dir.ok()) {
    warn_once(StrCat("cannot create ", options_.dir, "/", EntryDir(key), ": ", std::strerror(errno)));
    ::unlinkat(tmp_dir, tmp_name.c_str(), 0);
    return;
  }
  LockedStore lock(&c.mu, c.lock_fd.get());
  if (!lock.ok()) {
    warn_once(StrCat("cannot lock ", options_.dir, "/lock: ", std::strerror(errno)));
    ::unlinkat(tmp_dir, tmp_name.c_str(), 0);
    return;
  }
  // Under the lock: present already, admitted, evicted for, accounted, then published.
  if (IsRegularAt(entry_dir.get(), name)) {
    c.already_present.fetch_add(1, std::memory_order_relaxed);
    ::unlinkat(tmp_dir, tmp_name.c_str(), 0);
    return;
  }
  uint64_t usage = ReadUsage(c.usage_fd.get());
  if (usage + entry_bytes > options_.max_bytes) {
    if (options_.policy == FrameStoreOptions::Policy::kPinWhatFits) {
      c.rejected.fetch_add(1, std::memory_order_relaxed);
      c.usage.store(usage, std::memory_order_relaxed);
      ::unlinkat(tmp_dir, tmp_name.c_str(), 0);
      return;
    }
    uint64_t evicted = 0;
    usage = EvictLeastRecentlyUsed(options_.dir, options_.max_bytes, entry_bytes, &evicted);
    c.evicted_bytes.fetch_add(evicted, std::memory_order_relaxed);
  }
  WriteUsage(c.usage_fd.get(), usage + entry_bytes);
  if (::renameat(tmp_dir, tmp_name.c_str(), entry_dir.get(), name.c_str()) != 0) {
    WriteUsage(c.usage_fd.get(), usage);
    warn_once(StrCat("cannot publish ", path, ": ", std::strerror(errno)));
    ::unlinkat(tmp_dir, tmp_name.c_str(), 0);
    return;
  }
  c.usage.store(usage + entry_bytes, std::memory_order_relaxed);
  c.published.fetch_add(1, std::memory_order_relaxed);
  c.published_bytes.fetch_add(entry_bytes, std::memory_order_relaxed);
}

void FrameStore::NameDataset(const std::string& dataset_key, const std::string& name) const {
  const Counters& c = *counters_;
  const Fd dir = c.dir->OpenDir(StrCat(kFramesDir, "/", DatasetDir(dataset_key)), /*create=*/true);
  const std::string text = StrCat(dataset_key, "\n", name, "\n");
  std::string tmp_name;
  Fd fd = dir.ok() ? c.dir->CreateTemp(c.tmp_fd.get(), &tmp_name) : Fd();
  if (fd.ok() && (!WriteFull(fd.get(), text.data(), text.size(), 0) ||
                  ::renameat(c.tmp_fd.get(), tmp_name.c_str(), dir.get(), "source") != 0)) {
    ::unlinkat(c.tmp_fd.get(), tmp_name.c_str(), 0);
  }
}

FrameStoreStats FrameStore::stats() const {
  const Counters& c = *counters_;
  FrameStoreStats s;
  s.hits = c.hits.load();
  s.misses = c.misses.load();
  s.hit_bytes = c.hit_bytes.load();
  s.published = c.published.load();
  s.published_bytes = c.published_bytes.load();
  s.already_present = c.already_present.load();
  s.rejected = c.rejected.load();
  s.evicted_bytes = c.evicted_bytes.load();
  s.corrupt = c.corrupt.load();
  s.write_errors = c.write_errors.load();
  s.usage_bytes = c.usage.load();
  s.max_bytes = options_.max_bytes;
  return s;
}

absl::StatusOr<FrameStoreUsage> FrameStore::Scan(const std::string& dir) {
  std::error_code ec;
  // A store of an older release (frames1/ alone) is a store too: empty to this one, and cleared.
  if (!fs::is_directory(fs::path(dir) / kFramesDir, ec) && !fs::is_directory(fs::path(dir) / kOldFramesDir, ec)) {
    return absl::NotFoundError(StrCat("frame cache directory ", dir, ": no ", kFramesDir, "/ in it (not a frame cache)"));
  }
  FrameStoreUsage u;
  std::map<std::string, FrameStoreUsage::Dataset> by_dir;
  for (auto it = fs::directory_iterator(fs::path(dir) / kFramesDir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    FrameStoreUsage::Dataset d;
    d.key = it->path().filename().string();
    if (Fd f = OpenRegular((it->path() / "source").string(), O_RDONLY); f.ok()) {
      char text[8192];
      const ssize_t n = ::pread(f.get(), text, sizeof text, 0);
      const std::string_view all(text, n > 0 ? static_cast<size_t>(n) : 0);
      const size_t eol = all.find('\n');
      if (eol != std::string_view::npos) {
        d.key = std::string(all.substr(0, eol));
        const std::string_view rest = all.substr(eol + 1);
        d.name = std::string(rest.substr(0, rest.find('\n')));
      }
    }
    for (auto e = fs::recursive_directory_iterator(it->path(), ec); !ec && e != fs::recursive_directory_iterator();
         e.increment(ec)) {
      struct stat st;
      if (e->path().filename() == "source" || ::lstat(e->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      ++d.entries;
      d.bytes += static_cast<uint64_t>(st.st_size);
      Fd fd = OpenRegular(e->path().string(), O_RDONLY);
      char hbuf[kHeaderBytes];
      Header h;
      if (fd.ok() && ReadFull(fd.get(), hbuf, kHeaderBytes, 0) && DecodeHeader(hbuf, &h)) d.pixel_bytes += h.raw_bytes;
    }
    u.entries += d.entries;
    u.bytes += d.bytes;
    u.pixel_bytes += d.pixel_bytes;
    by_dir.emplace(it->path().filename().string(), std::move(d));
  }
  for (auto& [k, d] : by_dir) u.datasets.push_back(std::move(d));
  for (auto it = fs::directory_iterator(fs::path(dir) / "tmp", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0) continue;
    ++u.tmp_files;
    u.tmp_bytes += static_cast<uint64_t>(st.st_size);
  }
  Fd usage = OpenRegular(dir + "/usage", O_RDONLY);
  u.accounted_bytes = ReadUsage(usage.get());
  return u;
}

absl::StatusOr<FrameStoreUsage> FrameStore::Clear(const std::string& dir, const std::string& dataset_prefix) {
  std::error_code ec;
  // A store of an older release (frames1/ alone) is a store too: empty to this one, and cleared.
  if (!fs::is_directory(fs::path(dir) / kFramesDir, ec) && !fs::is_directory(fs::path(dir) / kOldFramesDir, ec)) {
    return absl::NotFoundError(StrCat("frame cache directory ", dir, ": no ", kFramesDir, "/ in it (not a frame cache)"));
  }
  absl::Mutex mu;
  Fd lock_fd = OpenRegular(dir + "/lock", O_RDWR | O_CREAT);
  Fd usage_fd = OpenRegular(dir + "/usage", O_RDWR | O_CREAT);
  LockedStore lock(&mu, lock_fd.get());
  if (!lock.ok() || !usage_fd.ok()) {
    return absl::PermissionDeniedError(StrCat("frame cache directory ", dir, ": cannot lock: ", std::strerror(errno)));
  }
  ASSIGN_OR_RETURN(FrameStoreUsage before, Scan(dir));
  for (const FrameStoreUsage::Dataset& d : before.datasets) {
    if (d.key.rfind(dataset_prefix, 0) != 0) continue;
    fs::remove_all(fs::path(dir) / kFramesDir / DatasetDir(d.key), ec);
    if (ec) return absl::InternalError(StrCat("frame cache directory ", dir, ": cannot remove ", d.key, ": ", ec.message()));
  }
  if (dataset_prefix.empty()) {
    fs::remove_all(fs::path(dir) / kOldFramesDir, ec);  // a version-1 store's entries, never read
    for (auto it = fs::directory_iterator(fs::path(dir) / "tmp", ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      ::unlink(it->path().c_str());
    }
  }
  uint64_t total = 0;
  for (const EntryFile& e : ListEntries(dir)) total += e.bytes;
  WriteUsage(usage_fd.get(), total);
  return before;
}

bool ParseFrameStoreCompression(const std::string& name, FrameStoreOptions::Compression* out) {
  if (name == "none") {
    *out = FrameStoreOptions::Compression::kNone;
  } else if (name == "lz4") {
    *out = FrameStoreOptions::Compression::kLz4;
  } else if (name == "zstd") {
    *out = FrameStoreOptions::Compression::kZstd;
  } else {
    return false;
  }
  return true;
}

const char* FrameStoreCompressionName(FrameStoreOptions::Compression c) {
  switch (c) {
    case FrameStoreOptions::Compression::kNone: return "none";
    case FrameStoreOptions::Compression::kLz4: return "lz4";
    case FrameStoreOptions::Compression::kZstd: return "zstd";
  }
  return "none";
}

}  // namespace conveyor
