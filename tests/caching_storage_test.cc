// The node-local cache of byte ranges over an in-memory backend: hits are counted and served
// without the backend, a corrupted entry is detected and fetched again, the byte bound holds
// across "processes" (two caches on one directory), and every byte read equals the backend's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "storage/memory_storage.h"
#include "storage/storage.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

constexpr uint32_t kBlock = 64 * 1024;

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class CachingStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    files_["a.bin"] = RandomBytes(5 * kBlock + 123, 1);  // a ragged last block
    files_["small.json"] = RandomBytes(100, 2);           // one block, the whole file
    files_["long.bin"] = RandomBytes(20 * kBlock, 3);     // for read-ahead
  }

  // One backend request per run of missing blocks (parallel_ranges 1), so the counts below say
  // how runs and read-ahead are cut; ParallelRangesSplitALongRun covers the split.
  std::unique_ptr<Storage> Open(uint64_t max_bytes = 1 << 30) {
    StorageCacheOptions o;
    o.dir = dir_.Join("cache");
    o.max_bytes = max_bytes;
    o.block_bytes = kBlock;
    o.parallel_ranges = 1;
    auto s = NewCachingStorage(NewMemoryStorage(files_), "mem://test/", o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  void ExpectRead(Storage& s, const std::string& name, uint64_t offset, size_t n) {
    auto f = s.Open(name);
    ASSERT_TRUE(f.ok()) << f.status();
    std::string got(n, '\0');
    absl::Status st = (*f)->Read(offset, n, got.data());
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(got == files_[name].substr(offset, n)) << name << " " << offset << "+" << n;
  }

  std::vector<fs::path> Entries() {
    std::vector<fs::path> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_.Join("cache/blocks2"))) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
    return out;
  }

  uint64_t EntryBytes() {
    uint64_t total = 0;
    for (const fs::path& p : Entries()) total += fs::file_size(p);
    return total;
  }

  TempDir dir_;
  std::map<std::string, std::string> files_;
};

TEST_F(CachingStorageTest, SecondReadIsServedFromTheCache) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  ExpectRead(*first, "a.bin", 1000, 3 * kBlock);  // blocks 0..3, one backend read
  ExpectRead(*first, "small.json", 0, 100);
  StorageStats s = first->stats();
  EXPECT_EQ(s.cache_hits, 0u);
  EXPECT_EQ(s.cache_misses, 5u);
  EXPECT_EQ(s.reads, 2u) << "missing blocks in a row are one backend read";

  // Another process on the node: a fresh storage on the same directory.
  auto second = Open();
  ASSERT_NE(second, nullptr);
  ExpectRead(*second, "a.bin", 1000, 3 * kBlock);
  ExpectRead(*second, "a.bin", 2 * kBlock + 5, 10);
  ExpectRead(*second, "small.json", 0, 100);
  s = second->stats();
  EXPECT_EQ(s.reads, 0u) << "the backend was read again";
  EXPECT_EQ(s.cache_misses, 0u);
  EXPECT_EQ(s.cache_hits, 6u);
  EXPECT_EQ(s.cache_hit_bytes, 4u * kBlock + kBlock + 100);

  // The ragged end and a mix of cached and missing blocks.
  ExpectRead(*second, "a.bin", 3 * kBlock - 7, 2 * kBlock + 130);
  s = second->stats();
  EXPECT_EQ(s.cache_misses, 2u);  // blocks 4 and 5
  EXPECT_EQ(s.reads, 1u);
}

// A scan through one open file (an episode's packets in order) reads ahead: one backend request
// per 8 blocks past the first, every byte still right; reads that jump about get none.
TEST_F(CachingStorageTest, SequentialReadsReadAheadAndRandomReadsDoNot) {
  auto storage = Open();
  ASSERT_NE(storage, nullptr);
  auto f = storage->Open("long.bin");
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string& want = files_["long.bin"];
  std::string got(1000, '\0');
  for (uint64_t at = 0; at < want.size(); at += got.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(got.size(), want.size() - at));
    ASSERT_TRUE((*f)->Read(at, n, got.data()).ok());
    ASSERT_TRUE(std::string_view(got.data(), n) == std::string_view(want).substr(at, n)) << at;
  }
  StorageStats s = storage->stats();
  // Block 0 alone (no history yet), then blocks 1-9, 10-18 and 19 (the end of the file).
  EXPECT_EQ(s.reads, 4u);
  EXPECT_EQ(s.cache_misses, 20u);
  EXPECT_EQ(s.cache_fill_bytes, want.size());

  auto fresh = Open(1 << 30);  // the same cache directory: everything is cached now
  auto g = fresh->Open("long.bin");
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->Read(0, 10, got.data()).ok());
  EXPECT_EQ(fresh->stats().reads, 0u);

  // Random reads in a cache of their own: one block each, nothing ahead.
  StorageCacheOptions o;
  o.dir = dir_.Join("cache_random");
  o.max_bytes = 1 << 30;
  o.block_bytes = kBlock;
  o.parallel_ranges = 1;
  auto random = NewCachingStorage(NewMemoryStorage(files_), "mem://test/", o);
  ASSERT_TRUE(random.ok());
  auto h = (*random)->Open("long.bin");
  ASSERT_TRUE(h.ok());
  for (uint64_t block : {15, 3, 9, 1}) {
    ASSERT_TRUE((*h)->Read(block * kBlock + 17, 100, got.data()).ok());
    EXPECT_TRUE(std::string_view(got.data(), 100) == std::string_view(want).substr(block * kBlock + 17, 100));
  }
  EXPECT_EQ((*random)->stats().reads, 4u);
  EXPECT_EQ((*random)->stats().cache_fill_bytes, 4u * kBlock);
}

// A backend whose every read takes 200 ms (a slow remote round-trip) and that records how many reads
// were in flight at once.
class SlowStorage final : public Storage {
 public:
  explicit SlowStorage(std::unique_ptr<Storage> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) override {
    auto f = inner_->Open(relpath);
    if (!f.ok()) return f.status();
    return std::unique_ptr<RandomAccessFile>(new File(std::move(*f), this));
  }
  std::string Describe(std::string_view relpath) const override { return inner_->Describe(relpath); }
  StorageStats stats() const override { return inner_->stats(); }
  int max_in_flight() const { return max_in_flight_.load(); }
  std::vector<std::pair<uint64_t, size_t>> ranges() const {
    absl::MutexLock l(&mu_);
    return ranges_;
  }

 private:
  class File final : public RandomAccessFile {
   public:
    File(std::unique_ptr<RandomAccessFile> inner, SlowStorage* owner) : inner_(std::move(inner)), owner_(owner) {}
    absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
      const int now = ++owner_->in_flight_;
      for (int seen = owner_->max_in_flight_.load(); seen < now && !owner_->max_in_flight_.compare_exchange_weak(seen, now);) {
      }
      {
        absl::MutexLock l(&owner_->mu_);
        owner_->ranges_.emplace_back(offset, n);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      absl::Status s = inner_->Read(offset, n, dst);
      --owner_->in_flight_;
      return s;
    }
    uint64_t size() const override { return inner_->size(); }
    const std::string& name() const override { return inner_->name(); }

   private:
    std::unique_ptr<RandomAccessFile> inner_;
    SlowStorage* owner_;
  };
  std::unique_ptr<Storage> inner_;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
  mutable absl::Mutex mu_;
  std::vector<std::pair<uint64_t, size_t>> ranges_;
};

// A scan's run of missing blocks is fetched as parallel range requests of whole blocks that tile
// it exactly (no byte twice, none missing), and every byte delivered is the backend's.
TEST_F(CachingStorageTest, ParallelRangesSplitALongRun) {
  auto slow = std::make_unique<SlowStorage>(NewMemoryStorage(files_));
  SlowStorage* backend = slow.get();
  StorageCacheOptions o;
  o.dir = dir_.Join("cache_parallel");
  o.max_bytes = 1 << 30;
  o.block_bytes = kBlock;
  o.parallel_ranges = 4;
  auto storage = NewCachingStorage(std::move(slow), "mem://test/", o);
  ASSERT_TRUE(storage.ok()) << storage.status();
  auto f = (*storage)->Open("long.bin");
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string& want = files_["long.bin"];
  std::string got(want.size(), '\0');
  // One read of blocks 0-15: a run of 16 blocks, 4 requests of 4 blocks at once.
  ASSERT_TRUE((*f)->Read(0, 16 * kBlock, got.data()).ok());
  EXPECT_TRUE(std::string_view(got.data(), 16 * kBlock) == std::string_view(want).substr(0, 16 * kBlock));
  std::vector<std::pair<uint64_t, size_t>> ranges = backend->ranges();
  std::sort(ranges.begin(), ranges.end());
  ASSERT_EQ(ranges.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ranges[i], (std::pair<uint64_t, size_t>{i * 4 * kBlock, 4 * kBlock}));
  EXPECT_EQ(backend->max_in_flight(), 4) << "the ranges were not requested at once";
  // A sequential read after it takes its read-ahead (blocks 16-19, the end) in parallel too, and
  // a run of 3 blocks is too short to split.
  ASSERT_TRUE((*f)->Read(16 * kBlock, 100, got.data()).ok());
  EXPECT_EQ(backend->ranges().size(), 6u);  // blocks 16-17 and 18-19
  EXPECT_EQ((*storage)->stats().cache_fill_bytes, want.size());
  auto g = (*storage)->Open("a.bin");
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->Read(kBlock + 1, 2 * kBlock, got.data()).ok());  // blocks 1-3
  EXPECT_TRUE(std::string_view(got.data(), 2 * kBlock) == std::string_view(files_["a.bin"]).substr(kBlock + 1, 2 * kBlock));
  EXPECT_EQ(backend->ranges().size(), 7u);
}

TEST_F(CachingStorageTest, ACorruptedEntryIsDetectedAndFetchedAgain) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  ExpectRead(*first, "a.bin", 0, kBlock);
  std::vector<fs::path> entries = Entries();
  ASSERT_EQ(entries.size(), 1u);
  {
    // Flip one payload byte: a bad disk, or a torn write on a filesystem that reorders.
    std::fstream f(entries[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(56 + 777);
    f.put('\x5a' ^ files_["a.bin"][777]);
  }
  auto second = Open();
  ASSERT_NE(second, nullptr);
  ExpectRead(*second, "a.bin", 0, kBlock);  // the right bytes, from the backend
  StorageStats s = second->stats();
  EXPECT_EQ(s.cache_corrupt, 1u);
  EXPECT_EQ(s.cache_hits, 0u);
  EXPECT_EQ(s.reads, 1u);
  // Re-published whole: the next read is a hit.
  ExpectRead(*second, "a.bin", 0, kBlock);
  EXPECT_EQ(second->stats().cache_hits, 1u);

  // A truncated entry (a torn publish) is never served either: another process finds it torn
  // (this one keeps serving the copy it checked, from memory).
  fs::resize_file(Entries()[0], 56 + 10);
  ExpectRead(*second, "a.bin", 0, kBlock);
  EXPECT_EQ(second->stats().cache_corrupt, 1u);
  auto third = Open();
  ASSERT_NE(third, nullptr);
  ExpectRead(*third, "a.bin", 0, kBlock);
  EXPECT_EQ(third->stats().cache_corrupt, 1u);
  EXPECT_EQ(third->stats().reads, 1u);
}

// Real processes on one cache directory: three forked readers read random ranges of one file
// through caches bounded at a few blocks, a fourth is SIGKILLed mid-read (its half-written
// entries stay in tmp/), and afterwards every byte a fresh reader gets is still the file's, and
// the bound holds on disk.
TEST_F(CachingStorageTest, ForkedProcessesShareTheCacheAndItsBound) {
  const uint64_t bound = 6 * (kBlock + 56) + 1000;
  const std::string& want = files_["long.bin"];
  auto reader = [&](uint64_t seed, int reads) -> int {
    auto storage = Open(bound);
    if (!storage) return 2;
    auto f = storage->Open("long.bin");
    if (!f.ok()) return 3;
    std::mt19937_64 rng(seed);
    std::string got(3 * kBlock, '\0');
    for (int i = 0; i < reads; ++i) {
      const uint64_t n = 1 + rng() % (3 * kBlock);
      const uint64_t at = rng() % (want.size() - n);
      if (!(*f)->Read(at, n, got.data()).ok()) return 4;
      if (std::string_view(got.data(), n) != std::string_view(want).substr(at, n)) return 5;
    }
    return 0;
  };
  std::vector<pid_t> children;
  for (uint64_t c = 0; c < 4; ++c) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(reader(100 + c, c == 3 ? 1000000 : 300));
    children.push_back(pid);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(children[3], SIGKILL);
  for (size_t c = 0; c < children.size(); ++c) {
    int status = 0;
    ASSERT_EQ(waitpid(children[c], &status, 0), children[c]);
    if (c < 3) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader " << c << " status " << status;
    } else {
      EXPECT_TRUE(WIFSIGNALED(status)) << "the reader to kill ended by itself: " << status;
    }
  }
  EXPECT_LE(EntryBytes(), bound) << "the bound does not hold across processes";
  EXPECT_EQ(reader(7, 300), 0) << "a reader after the kill got a wrong byte";
  EXPECT_LE(EntryBytes(), bound);
}

TEST_F(CachingStorageTest, TheByteBoundHoldsAcrossProcesses) {
  const uint64_t bound = 3 * (kBlock + 56) + 1000;  // three blocks and a bit
  auto a = Open(bound);
  auto b = Open(bound);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int round = 0; round < 3; ++round) {
    for (uint64_t block = 0; block < 5; ++block) {
      ExpectRead(*a, "a.bin", block * kBlock, 10);
      EXPECT_LE(EntryBytes(), bound);
      ExpectRead(*b, "a.bin", (4 - block) * kBlock, 10);
      EXPECT_LE(EntryBytes(), bound);
    }
  }
  EXPECT_GT(a->stats().cache_evicted_bytes + b->stats().cache_evicted_bytes, 0u);
  EXPECT_GT(Entries().size(), 0u);
}

}  // namespace
}  // namespace conveyor
