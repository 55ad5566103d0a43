// The node-local cache of byte ranges in front of a remote root (StorageCacheOptions).
//
// Layout under the cache directory, shared by every process of its uid on the node (or of its
// group, with a shared-cache key: base/cache_dir.h, docs/serving.md "Shared nodes"):
//   blocks2/XX/KEY.BLOCK  one entry: a 56-byte header (magic, payload length, XXH3-64 of the
//                         payload, in a shared cache the HMAC-SHA256 of the key, block and
//                         payload) and the payload, the file's bytes [BLOCK * B, BLOCK * B + len)
//                         (version 2; a version-1 cache's blocks/ is never read)
//   tmp/                  entries being written; renamed into blocks/ when complete
//   lock                  flock'd while the byte account changes and while evicting
//   usage                 the bytes of entries published, as this cache's processes counted them
// KEY hashes the root, the relative path, the file's size and version (ETag) and the block size,
// so a rewritten object, a different block size or another dataset never hits a stale entry.
//
// Why this shape:
// - Private unless shared on purpose: the directory is this uid's (0700, entries 0600) and one
//   owned by another user is refused; a group-shared cache authenticates every entry, so one
//   written without the node secret is a counted corrupt entry, never a hit. No open follows a
//   symbolic link or blocks on a FIFO; temporary names are random and created with O_EXCL.
// - Atomic publish: an entry is written whole under tmp/ and renamed into place, so a reader sees
//   either no entry or a complete one; a crash leaves only a tmp/ file (removed by a later
//   eviction once it is an hour old).
// - Verified on every read: the payload's checksum is checked before a byte is served, so a torn
//   or corrupted entry (a bad disk, a crash during rename on a filesystem that does not order
//   it) is removed and fetched again, never served.
// - The bound: `usage` only grows by what is published and is recomputed by a scan when it passes
//   max_bytes, under the flock, so all processes together stay within max_bytes. Evicting unlinks
//   the least recently used entries (mtime, which a hit touches) down to 90% of the bound, so
//   scans are rare. An entry open in a reader while it is unlinked is still read whole (POSIX).
// - A cache that cannot be written (a full disk) never fails a read: the bytes come from the
//   backend and a warning is logged once.
// - Reads of several missing blocks go to the backend as one range request (fewer round trips);
//   a block is the unit of the cache, so a small read costs one block from the backend once.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/base/thread_annotations.h"
#include "base/cache_dir.h"
#include "base/cancel.h"
#include "base/posix_file.h"
#include "base/status_macros.h"
#include "base/worker_pool.h"
#include "base/strings.h"
#include "storage/storage.h"
#include "spdlog/spdlog.h"
#include "xxhash.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'C', 'V', 'Y', 'C', 'A', 'C', 'H', '2'};
constexpr size_t kHeaderBytes = 56;
constexpr size_t kMacAt = 24;
constexpr char kBlocksDir[] = "blocks2";
// Eviction frees down to this share of the bound.
constexpr double kLowWater = 0.9;
// Blocks fetched past a sequential read (readahead: 8 MiB with the default 1 MiB blocks).
// (kRamBlocks below: checked blocks kept in memory per CachingStorage.)
constexpr size_t kRamBlocks = 16;
constexpr uint64_t kReadAheadBlocks = 8;
// A parallel range request covers at least this many blocks.
constexpr uint64_t kMinPartBlocks = 2;
// tmp/ files older than this belong to a process that died while writing.
constexpr int kStaleTmpSeconds = 3600;

std::string Hex128(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

class CachingStorage;

// Thread-safe, as its backend file is.
class CachedFile final : public RandomAccessFile {
 public:
  CachedFile(const CachingStorage* cache, std::unique_ptr<RandomAccessFile> backend,
             std::string key)
      : cache_(cache), backend_(std::move(backend)), key_(std::move(key)) {}

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override;
  uint64_t size() const override { return backend_->size(); }
  // [offset, offset + n) from the backend as `parts` concurrent range requests of whole blocks
  // (the calling thread takes the first), under the caller's cancellation; the first error wins.
  absl::Status ReadParallel(uint64_t offset, size_t n, char* dst, uint64_t parts) const;
  const std::string& name() const override { return backend_->name(); }
  std::string version() const override { return backend_->version(); }

 private:
  const CachingStorage* cache_;  // outlives its files
  const std::unique_ptr<RandomAccessFile> backend_;
  const std::string key_;
  // The block after the last read's end: a read starting there, or in the block where the last
  // one ended, is sequential and gets read-ahead (none before the first read). A hint only: a race between threads costs at most
  // one read-ahead too many or too few, never a wrong byte.
  mutable std::atomic<uint64_t> next_block_{~uint64_t{0}};
};

// Thread-safe: counters are atomics, the rest is constant; processes coordinate through the
// directory (rename, flock).
class CachingStorage final : public Storage {
 public:
  CachingStorage(std::unique_ptr<Storage> backend, std::string root,
                 const StorageCacheOptions& options)
      : backend_(std::move(backend)), root_(std::move(root)), options_(options) {}

  absl::Status Init() {
    ASSIGN_OR_RETURN(dir_, CacheDir::Open({options_.dir, "storage cache", options_.shared_key_file}));
    Fd blocks = dir_->OpenDir(kBlocksDir, /*create=*/true);
    tmp_fd_ = dir_->OpenDir("tmp", /*create=*/true);
    Fd lock = dir_->OpenFile(dir_->fd(), "lock", O_RDWR, /*create=*/true);
    if (!blocks.ok() || !tmp_fd_.ok() || !lock.ok()) {
      const int e = errno;
      return absl::FailedPreconditionError(StrCat(
          "storage cache ", options_.dir, ": cannot create or open its blocks2/, tmp/ or lock: ", std::strerror(e),
          e == ELOOP ? " (a symbolic link: refused, not followed)" : e == EINVAL ? " (not a regular file: refused)" : ""));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) override {
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, backend_->Open(relpath));
    const std::string version = file->version();
    constexpr std::string_view kSep("\0", 1);
    const std::string id = StrCat(root_, kSep, relpath, kSep, file->size(), kSep, version, kSep,
                                  options_.block_bytes);
    std::string key = Hex128(XXH3_128bits(id.data(), id.size()));
    return std::make_unique<CachedFile>(this, std::move(file), std::move(key));
  }

  std::string Describe(std::string_view relpath) const override {
    return backend_->Describe(relpath);
  }

  StorageStats stats() const override {
    StorageStats s = backend_->stats();
    s.cache_hits = hits_.load(std::memory_order_relaxed);
    s.cache_misses = misses_.load(std::memory_order_relaxed);
    s.cache_hit_bytes = hit_bytes_.load(std::memory_order_relaxed);
    s.cache_fill_bytes = fill_bytes_.load(std::memory_order_relaxed);
    s.cache_corrupt = corrupt_.load(std::memory_order_relaxed);
    s.cache_evicted_bytes = evicted_bytes_.load(std::memory_order_relaxed);
    return s;
  }

  uint32_t block_bytes() const { return options_.block_bytes; }
  uint64_t parallel_ranges() const { return std::max<uint32_t>(options_.parallel_ranges, 1); }

  // Reads entry (key, block) of `len` bytes into dst; false when absent or corrupt (then
  // removed).
  bool Lookup(const std::string& key, uint64_t block, size_t len, char* dst) const {
    const std::string name = EntryName(key, block);
    const Fd dfd = dir_->OpenDir(EntryDir(key), /*create=*/false);
    Fd fd = dfd.ok() ? dir_->OpenFile(dfd.get(), name, O_RDONLY) : Fd();
    if (!fd.ok()) {
      if (dfd.ok() && (errno == ELOOP || errno == EINVAL || errno == EPERM)) {
        // A link, a FIFO or another uid's file where an entry goes: not followed, removed.
        corrupt_.fetch_add(1, std::memory_order_relaxed);
        ::unlinkat(dfd.get(), name.c_str(), 0);
      }
      return false;
    }
    char header[kHeaderBytes];
    struct stat st;
    bool good = ::fstat(fd.get(), &st) == 0 &&
                static_cast<uint64_t>(st.st_size) == kHeaderBytes + len &&
                ReadFull(fd.get(), header, kHeaderBytes, 0) &&
                std::memcmp(header, kMagic, sizeof kMagic) == 0;
    uint64_t stored_len = 0, stored_sum = 0;
    if (good) {
      std::memcpy(&stored_len, header + 8, 8);
      std::memcpy(&stored_sum, header + 16, 8);
      good = stored_len == len && ReadFull(fd.get(), dst, len, kHeaderBytes) &&
             XXH3_64bits(dst, len) == stored_sum;
    }
    if (good && dir_->shared()) {
      // Written by a holder of the node secret, for this key and block: else never served.
      CacheMac mac;
      good = EntryMac(key, block, dst, len, &mac) &&
             CacheDir::MacEqual(mac, reinterpret_cast<const uint8_t*>(header + kMacAt));
    }
    if (!good) {
      // Torn, corrupted or forged: never served. Removed so the next reader fetches it again.
      corrupt_.fetch_add(1, std::memory_order_relaxed);
      ::unlinkat(dfd.get(), name.c_str(), 0);
      return false;
    }
    ::futimens(fd.get(), nullptr);  // recently used: evicted last
    hits_.fetch_add(1, std::memory_order_relaxed);
    hit_bytes_.fetch_add(len, std::memory_order_relaxed);
    return true;
  }

  // The in-memory tier: the kRamBlocks blocks most recently read or fetched, already checked, so
  // a run of small reads in one block (an episode's packets, one after another) reads and checks
  // the block's file once instead of once per read. Bounded: kRamBlocks x block_bytes.
  std::shared_ptr<const std::string> RamLookup(const std::string& key, uint64_t block) const {
    absl::MutexLock lock(&ram_mu_);
    for (auto it = ram_.begin(); it != ram_.end(); ++it) {
      if (it->block == block && it->key == key) {
        ram_.splice(ram_.begin(), ram_, it);  // most recent first
        hits_.fetch_add(1, std::memory_order_relaxed);
        hit_bytes_.fetch_add(it->bytes->size(), std::memory_order_relaxed);
        return it->bytes;
      }
    }
    return nullptr;
  }

  void RamInsert(const std::string& key, uint64_t block, std::string_view bytes) const {
    auto copy = std::make_shared<const std::string>(bytes);
    absl::MutexLock lock(&ram_mu_);
    ram_.push_front({key, block, std::move(copy)});
    if (ram_.size() > kRamBlocks) ram_.pop_back();
  }

  // Publishes entry (key, block). Failures are logged once and otherwise ignored.
  void Insert(const std::string& key, uint64_t block, const char* data, size_t len) const {
    misses_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t entry_bytes = kHeaderBytes + len;
    if (entry_bytes > options_.max_bytes) return;
    std::string tmp;
    const int tmp_dir = tmp_fd_.get();
    {
      char header[kHeaderBytes] = {};
      std::memcpy(header, kMagic, sizeof kMagic);
      const uint64_t len64 = len, sum = XXH3_64bits(data, len);
      std::memcpy(header + 8, &len64, 8);
      std::memcpy(header + 16, &sum, 8);
      if (dir_->shared()) {
        CacheMac mac;
        if (!EntryMac(key, block, data, len, &mac)) return WarnOnce("cannot compute an entry's MAC (libcrypto failed)");
        std::memcpy(header + kMacAt, mac.data(), mac.size());
      }
      Fd fd = dir_->CreateTemp(tmp_dir, &tmp);
      if (!fd.ok() || !WriteFull(fd.get(), header, kHeaderBytes, 0) ||
          !WriteFull(fd.get(), data, len, kHeaderBytes)) {
        WarnOnce(StrCat("cannot write ", options_.dir, "/tmp/", tmp, ": ", std::strerror(errno)));
        if (fd.ok()) ::unlinkat(tmp_dir, tmp.c_str(), 0);
        return;
      }
    }
    const std::string name = EntryName(key, block);
    const std::string path = StrCat(options_.dir, "/", EntryDir(key), "/", name);
    const Fd entry_dir = dir_->OpenDir(EntryDir(key), /*create=*/true);
    Fd lock = dir_->OpenFile(dir_->fd(), "lock", O_RDWR, /*create=*/true);
    if (!entry_dir.ok() || !lock.ok() || ::flock(lock.get(), LOCK_EX) != 0) {
      WarnOnce(StrCat("cannot open ", EntryDir(key), "/ or lock ", LockPath(), ": ", std::strerror(errno)));
      ::unlinkat(tmp_dir, tmp.c_str(), 0);
      return;
    }
    // Under the lock: account for the entry, evict when over the bound, then publish.
    Fd usage_fd = dir_->OpenFile(dir_->fd(), "usage", O_RDWR, /*create=*/true);
    uint64_t usage = 0;
    if (usage_fd.ok() && !ReadFull(usage_fd.get(), reinterpret_cast<char*>(&usage), 8, 0)) {
      usage = 0;
    }
    usage += entry_bytes;
    if (usage > options_.max_bytes) usage = Evict(entry_bytes) + entry_bytes;
    if (usage_fd.ok()) WriteFull(usage_fd.get(), reinterpret_cast<const char*>(&usage), 8, 0);
    if (::renameat(tmp_dir, tmp.c_str(), entry_dir.get(), name.c_str()) != 0) {
      WarnOnce(StrCat("cannot publish ", path, ": ", std::strerror(errno)));
      ::unlinkat(tmp_dir, tmp.c_str(), 0);
      return;
    }
    fill_bytes_.fetch_add(len, std::memory_order_relaxed);
  }

  bool Contains(const std::string& key, uint64_t block) const {
    const Fd dfd = dir_->OpenDir(EntryDir(key), /*create=*/false);
    struct stat st;
    return dfd.ok() && ::fstatat(dfd.get(), EntryName(key, block).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
           S_ISREG(st.st_mode);
  }

 private:
  // An entry's directory under the cache and its file name there.
  static std::string EntryDir(const std::string& key) { return StrCat(kBlocksDir, "/", key.substr(0, 2)); }
  static std::string EntryName(const std::string& key, uint64_t block) { return StrCat(key, ".", block); }
  std::string LockPath() const { return options_.dir + "/lock"; }
  bool EntryMac(const std::string& key, uint64_t block, const char* data, size_t len, CacheMac* mac) const {
    const std::string at = StrCat(key, ".", block);
    return dir_->Mac({at, std::string_view(data, len)}, mac);
  }

  // With the lock held: scans the entries, removes the least recently used until they and
  // `incoming` bytes fit under the low-water mark, and returns the bytes left.
  uint64_t Evict(uint64_t incoming) const {
    struct Entry {
      fs::path path;
      uint64_t bytes;
      std::time_t used;
    };
    std::vector<Entry> entries;
    uint64_t total = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(fs::path(options_.dir) / kBlocksDir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      struct stat st;  // lstat: a planted link is neither counted nor followed
      if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      entries.push_back({it->path(), static_cast<uint64_t>(st.st_size), st.st_mtime});
      total += static_cast<uint64_t>(st.st_size);
    }
    const std::time_t now = std::time(nullptr);
    for (auto it = fs::directory_iterator(fs::path(options_.dir) / "tmp", ec);
         !ec && it != fs::directory_iterator(); it.increment(ec)) {
      struct stat st;
      if (::lstat(it->path().c_str(), &st) == 0 && now - st.st_mtime > kStaleTmpSeconds) {
        ::unlink(it->path().c_str());
      }
    }
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.used < b.used; });
    const uint64_t target = static_cast<uint64_t>(static_cast<double>(options_.max_bytes) * kLowWater);
    for (const Entry& e : entries) {
      if (total + incoming <= target) break;
      if (::unlink(e.path.c_str()) == 0) {
        total -= e.bytes;
        evicted_bytes_.fetch_add(e.bytes, std::memory_order_relaxed);
      }
    }
    return total;
  }

  void WarnOnce(const std::string& what) const {
    if (!warned_.exchange(true)) {
      spdlog::warn("storage cache {}: {} (reads go to the backend)", options_.dir, what);
    }
  }

  const std::unique_ptr<Storage> backend_;
  const std::string root_;
  const StorageCacheOptions options_;
  std::unique_ptr<CacheDir> dir_;  // set by Init
  Fd tmp_fd_;                      // DIR/tmp

  struct RamBlock {
    std::string key;
    uint64_t block;
    std::shared_ptr<const std::string> bytes;
  };
  mutable absl::Mutex ram_mu_;
  mutable std::list<RamBlock> ram_ ABSL_GUARDED_BY(ram_mu_);  // most recently used first
  mutable std::atomic<uint64_t> hits_{0};
  mutable std::atomic<uint64_t> misses_{0};
  mutable std::atomic<uint64_t> hit_bytes_{0};
  mutable std::atomic<uint64_t> fill_bytes_{0};
  mutable std::atomic<uint64_t> corrupt_{0};
  mutable std::atomic<uint64_t> evicted_bytes_{0};
  mutable std::atomic<bool> warned_{false};
};

absl::Status CachedFile::Read(uint64_t offset, size_t n, char* dst) const {
  const uint64_t size = backend_->size();
  if (offset > size || n > size - offset) {
    return absl::OutOfRangeError(StrCat(name(), ": read of ", n, " bytes at offset ", offset,
                                        " is past the end of the file (", size, " bytes)"));
  }
  if (n == 0) return absl::OkStatus();
  const uint64_t b = cache_->block_bytes();
  const uint64_t first = offset / b;
  const uint64_t last = (offset + n - 1) / b;
  auto block_len = [&](uint64_t block) { return std::min<uint64_t>(b, size - block * b); };
  // Copies the part of `block` (whose bytes are at `src`) that [offset, offset + n) covers.
  auto deliver = [&](uint64_t block, const char* src) {
    const uint64_t start = std::max(offset, block * b);
    const uint64_t end = std::min(offset + n, block * b + block_len(block));
    std::memcpy(dst + (start - offset), src + (start - block * b), end - start);
  };
  std::string buf;
  uint64_t block = first;
  while (block <= last) {
    if (std::shared_ptr<const std::string> ram = cache_->RamLookup(key_, block)) {
      deliver(block, ram->data());
      ++block;
      continue;
    }
    buf.resize(block_len(block));
    if (cache_->Lookup(key_, block, buf.size(), buf.data())) {
      cache_->RamInsert(key_, block, buf);
      deliver(block, buf.data());
      ++block;
      continue;
    }
    // A run of missing blocks: one backend read for all of them. When the reads of this file
    // go forward block by block (a scan, an episode's packets in order), the run also takes up
    // to kReadAheadBlocks blocks past the read, so a scan costs one request per 8 MiB instead of
    // one per block; random reads get no read-ahead, and so no extra bytes.
    uint64_t run_end = block + 1;
    const uint64_t blocks_in_file = (size + b - 1) / b;
    const uint64_t next = next_block_.load(std::memory_order_relaxed);
    const bool sequential = first == next || first + 1 == next;
    const uint64_t limit = std::min(blocks_in_file, sequential ? last + 1 + kReadAheadBlocks : last + 1);
    while (run_end < limit && !cache_->Contains(key_, run_end)) {
      ++run_end;
    }
    const uint64_t run_offset = block * b;
    const uint64_t run_bytes = std::min(size, run_end * b) - run_offset;
    buf.resize(run_bytes);
    const uint64_t parts = std::min<uint64_t>(cache_->parallel_ranges(), (run_end - block) / kMinPartBlocks);
    if (parts > 1) {
      RETURN_IF_ERROR(ReadParallel(run_offset, run_bytes, buf.data(), parts));
    } else {
      RETURN_IF_ERROR(backend_->Read(run_offset, run_bytes, buf.data()));
    }
    for (uint64_t k = block; k < run_end; ++k) {
      const char* src = buf.data() + (k - block) * b;
      cache_->Insert(key_, k, src, block_len(k));
      cache_->RamInsert(key_, k, std::string_view(src, block_len(k)));
      if (k <= last) deliver(k, src);
    }
    block = run_end;
  }
  next_block_.store(last + 1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status CachedFile::ReadParallel(uint64_t offset, size_t n, char* dst, uint64_t parts) const {
  const uint64_t b = cache_->block_bytes();
  const uint64_t blocks = (n + b - 1) / b;
  // Part i: blocks [i * blocks / parts, (i + 1) * blocks / parts) of the run. The parts run on
  // threads that live for this one read, under the caller's cancellation (base/worker_pool.h): a
  // round-trip costs milliseconds, a thread start microseconds, and no pool outlives the call.
  RETURN_IF_ERROR(ParallelFor("conveyor-range", static_cast<int>(parts), parts, [&](size_t i) {
    const uint64_t from = i * blocks / parts * b;
    const uint64_t to = std::min<uint64_t>(n, (i + 1) * blocks / parts * b);
    return backend_->Read(offset + from, to - from, dst + from);
  }));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> NewCachingStorage(std::unique_ptr<Storage> backend,
                                                           std::string root,
                                                           const StorageCacheOptions& options) {
  if (options.dir.empty() || options.max_bytes == 0 || options.block_bytes == 0) {
    return absl::InvalidArgumentError(
        "storage cache: dir, max_bytes and block_bytes must all be set");
  }
  auto cache = std::make_unique<CachingStorage>(std::move(backend), std::move(root), options);
  RETURN_IF_ERROR(cache->Init());
  return cache;
}

}  // namespace conveyor
