// The node-local cache of byte ranges over an in-memory backend: hits are counted and served
// without the backend, a corrupted entry is detected and fetched again, the byte bound holds
// across "processes" (two caches on one directory), and every byte read equals the backend's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "readers/memory_storage.h"
#include "readers/storage.h"
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
  }

  std::unique_ptr<Storage> Open(uint64_t max_bytes = 1 << 30) {
    StorageCacheOptions o;
    o.dir = dir_.Join("cache");
    o.max_bytes = max_bytes;
    o.block_bytes = kBlock;
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
    for (const auto& e : fs::recursive_directory_iterator(dir_.Join("cache/blocks"))) {
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

TEST_F(CachingStorageTest, ACorruptedEntryIsDetectedAndFetchedAgain) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  ExpectRead(*first, "a.bin", 0, kBlock);
  std::vector<fs::path> entries = Entries();
  ASSERT_EQ(entries.size(), 1u);
  {
    // Flip one payload byte: a bad disk, or a torn write on a filesystem that reorders.
    std::fstream f(entries[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24 + 777);
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

  // A truncated entry (a torn publish) is never served either.
  fs::resize_file(Entries()[0], 24 + 10);
  ExpectRead(*second, "a.bin", 0, kBlock);
  EXPECT_EQ(second->stats().cache_corrupt, 2u);
}

TEST_F(CachingStorageTest, TheByteBoundHoldsAcrossProcesses) {
  const uint64_t bound = 3 * (kBlock + 24) + 1000;  // three blocks and a bit
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
