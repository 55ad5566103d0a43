// The node-wide tier of the decoded-frame cache (pipeline/frame_store.h): frames come back bit for
// bit with each compression; a torn, truncated, corrupted or misplaced entry is never served (it
// is removed, counted, and the frame decoded again); a writer that died leaves only a tmp/ file;
// the byte bound holds for pin and lru, and for several processes writing at once; info and clear
// see what is there.
#include "pipeline/frame_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "pipeline/frame_cache.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

RgbImage Frame(int w, int h, uint32_t seed) {
  RgbImage img;
  img.width = w;
  img.height = h;
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  std::mt19937 rng(seed);
  // Smooth with some noise: compressible, like a camera frame, but not trivially.
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>((i / 7) + (i % 8 == 0 ? rng() & 15 : 0));
  return img;
}

FrameCacheKey Key(int64_t frame, uint64_t episode = 0) { return FrameCacheKey{"ds-1234", episode, 1, frame, 42}; }

std::unique_ptr<FrameStore> OpenStore(const std::string& dir, uint64_t max_bytes,
                                      FrameStoreOptions::Policy policy = FrameStoreOptions::Policy::kPinWhatFits,
                                      FrameStoreOptions::Compression c = FrameStoreOptions::Compression::kNone) {
  FrameStoreOptions o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  o.policy = policy;
  o.compression = c;
  auto s = FrameStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<fs::path> Entries(const std::string& dir) {
  std::vector<fs::path> out;
  for (auto& e : fs::recursive_directory_iterator(fs::path(dir) / "frames2")) {
    if (e.is_regular_file() && e.path().filename() != "source") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FrameStoreTest, FramesComeBackBitForBitWithEachCompression) {
  for (auto c : {FrameStoreOptions::Compression::kNone, FrameStoreOptions::Compression::kLz4,
                 FrameStoreOptions::Compression::kZstd}) {
    TempDir dir;
    auto store = OpenStore(dir.path(), 1 << 30, FrameStoreOptions::Policy::kPinWhatFits, c);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Find(Key(0)), nullptr);
    const RgbImage f = Frame(64, 48, 1);
    store->Insert(Key(0), f);
    auto got = store->Find(Key(0));
    ASSERT_NE(got, nullptr) << FrameStoreCompressionName(c);
    EXPECT_EQ(got->width, 64);
    EXPECT_EQ(got->height, 48);
    EXPECT_EQ(got->pixels, f.pixels) << FrameStoreCompressionName(c);
    EXPECT_EQ(store->Find(FrameCacheKey{"ds-1234", 0, 1, 0, 43}), nullptr) << "other decode settings";
    EXPECT_EQ(store->Find(FrameCacheKey{"ds-other", 0, 1, 0, 42}), nullptr) << "another dataset";
    // A second process (here: a second store on the directory) sees it.
    auto other = OpenStore(dir.path(), 1 << 30);
    auto again = other->Find(Key(0));
    ASSERT_NE(again, nullptr);
    EXPECT_EQ(again->pixels, f.pixels);
    const FrameStoreStats s = store->stats();
    EXPECT_EQ(s.published, 1u);
    EXPECT_EQ(s.hits, 1u);
    EXPECT_EQ(s.misses, 3u);
    if (c != FrameStoreOptions::Compression::kNone) {
      EXPECT_LT(s.published_bytes, f.pixels.size()) << FrameStoreCompressionName(c) << " did not compress";
    }
    store->Insert(Key(0), f);
    EXPECT_EQ(store->stats().already_present, 1u);
    EXPECT_EQ(store->stats().published, 1u);
  }
}

// Every way an entry can be damaged: never served, removed, counted, and the account follows.
TEST(FrameStoreTest, ADamagedEntryIsNeverServed) {
  TempDir dir;
  auto store = OpenStore(dir.path(), 1 << 30);
  for (int64_t i = 0; i < 5; ++i) store->Insert(Key(i), Frame(32, 32, static_cast<uint32_t>(i)));
  std::vector<fs::path> files = Entries(dir.path());
  ASSERT_EQ(files.size(), 5u);
  auto path_of = [&](int64_t frame) {
    for (const fs::path& p : files) {
      if (p.filename() == "1." + std::to_string(frame)) return p;
    }
    return fs::path();
  };
  const uint64_t entry_bytes = fs::file_size(path_of(0));
  // 0: a flipped pixel byte. 1: truncated (a torn write). 2: a flipped header byte.
  // 3: another frame's entry copied over it (a misplaced file). 4: left intact.
  {
    std::fstream f(path_of(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(96 + 1000);
    f.put('\x55');
  }
  fs::resize_file(path_of(1), entry_bytes - 100);
  {
    std::fstream f(path_of(2), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  fs::copy_file(path_of(4), path_of(3), fs::copy_options::overwrite_existing);
  auto reader = OpenStore(dir.path(), 1 << 30);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(reader->Find(Key(i)), nullptr) << "damaged entry " << i << " served";
  EXPECT_EQ(reader->stats().corrupt, 4u);
  for (int64_t i = 0; i < 4; ++i) EXPECT_FALSE(fs::exists(path_of(i))) << "damaged entry " << i << " kept";
  ASSERT_NE(reader->Find(Key(4)), nullptr);
  EXPECT_EQ(reader->Find(Key(4))->pixels, Frame(32, 32, 4).pixels);
  // The account lost the removed entries (the truncated one at its size on disk).
  auto usage = FrameStore::Scan(dir.path());
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->entries, 1u);
  EXPECT_EQ(usage->accounted_bytes, usage->bytes);
  // Decoded again and published again: served.
  reader->Insert(Key(0), Frame(32, 32, 0));
  ASSERT_NE(reader->Find(Key(0)), nullptr);
  EXPECT_EQ(reader->Find(Key(0))->pixels, Frame(32, 32, 0).pixels);
}

// A writer killed mid-write leaves its tmp/ file and nothing under frames2/; clear removes it.
TEST(FrameStoreTest, AWriterKilledMidWriteLeavesNoEntry) {
  TempDir dir;
  auto store = OpenStore(dir.path(), 1 << 30);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child writes frames forever, as fast as it can, until it is killed.
    auto s = OpenStore(dir.path(), 1 << 30);
    for (int64_t i = 0;; ++i) s->Insert(Key(i % 100000, 7), Frame(256, 256, static_cast<uint32_t>(i)));
  }
  // Killed once it has published something (however slowly a loaded machine starts it), while
  // it is writing more.
  for (int i = 0; i < 1000 && Entries(dir.path()).size() < 3; ++i) ::usleep(10 * 1000);
  ::usleep(50 * 1000);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  // Whatever it published is whole and correct; nothing it was writing is visible as an entry.
  const std::vector<fs::path> files = Entries(dir.path());
  ASSERT_GT(files.size(), 0u) << "the child published nothing in 10 s";
  for (const fs::path& p : files) {
    const int64_t frame = std::stoll(p.extension().string().substr(1));
    auto got = store->Find(Key(frame, 7));
    ASSERT_NE(got, nullptr) << p;
  }
  EXPECT_EQ(store->stats().corrupt, 0u);
  auto usage = FrameStore::Scan(dir.path());
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->accounted_bytes, usage->bytes) << "the account does not match the entries";
  auto cleared = FrameStore::Clear(dir.path());
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  auto after = FrameStore::Scan(dir.path());
  EXPECT_EQ(after->entries, 0u);
  EXPECT_EQ(after->tmp_files, 0u);
  EXPECT_EQ(after->accounted_bytes, 0u);
}

TEST(FrameStoreTest, PinKeepsWhatFitsAndLruEvicts) {
  const RgbImage f = Frame(32, 32, 3);
  const uint64_t entry = 96 + f.pixels.size();
  {
    TempDir dir;
    auto pin = OpenStore(dir.path(), 3 * entry + 10);
    for (int64_t i = 0; i < 5; ++i) pin->Insert(Key(i), f);
    EXPECT_EQ(pin->stats().published, 3u);
    EXPECT_EQ(pin->stats().rejected, 2u);
    EXPECT_NE(pin->Find(Key(0)), nullptr) << "pin keeps the first frames";
    EXPECT_EQ(pin->Find(Key(4)), nullptr);
    EXPECT_LE(FrameStore::Scan(dir.path())->bytes, 3 * entry + 10);
  }
  {
    TempDir dir;
    auto lru = OpenStore(dir.path(), 3 * entry + 10, FrameStoreOptions::Policy::kLru);
    for (int64_t i = 0; i < 10; ++i) lru->Insert(Key(i), f);
    auto u = FrameStore::Scan(dir.path());
    EXPECT_LE(u->bytes, 3 * entry + 10);
    EXPECT_EQ(u->accounted_bytes, u->bytes);
    EXPECT_GT(lru->stats().evicted_bytes, 0u);
    EXPECT_NE(lru->Find(Key(9)), nullptr) << "lru keeps the last frame written";
  }
}

// Four processes fill one small store at once: the bound holds for them together and the
// account matches what is on disk.
TEST(FrameStoreTest, TheBoundHoldsForSeveralProcesses) {
  for (auto policy : {FrameStoreOptions::Policy::kPinWhatFits, FrameStoreOptions::Policy::kLru}) {
    TempDir dir;
    const RgbImage f = Frame(64, 64, 9);
    const uint64_t bound = 20 * (96 + f.pixels.size()) + 5;
    std::vector<pid_t> children;
    for (int p = 0; p < 4; ++p) {
      const pid_t child = ::fork();
      ASSERT_GE(child, 0);
      if (child == 0) {
        auto s = OpenStore(dir.path(), bound, policy);
        for (int64_t i = 0; i < 60; ++i) s->Insert(Key(i, static_cast<uint64_t>(p)), f);
        ::_exit(0);
      }
      children.push_back(child);
    }
    for (pid_t c : children) {
      int status = 0;
      ::waitpid(c, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    auto u = FrameStore::Scan(dir.path());
    ASSERT_TRUE(u.ok());
    EXPECT_LE(u->bytes, bound) << "policy " << static_cast<int>(policy);
    EXPECT_GT(u->entries, 10u);
    EXPECT_EQ(u->accounted_bytes, u->bytes) << "policy " << static_cast<int>(policy);
  }
}

TEST(FrameStoreTest, ClearOneDatasetAndInfo) {
  TempDir dir;
  auto store = OpenStore(dir.path(), 1 << 30);
  store->NameDataset("aaa-1", "/data/a");
  store->NameDataset("bbb-2", "/data/b");
  for (int64_t i = 0; i < 3; ++i) store->Insert(FrameCacheKey{"aaa-1", 0, 0, i, 1}, Frame(16, 16, 1));
  for (int64_t i = 0; i < 2; ++i) store->Insert(FrameCacheKey{"bbb-2", 0, 0, i, 1}, Frame(16, 16, 1));
  auto u = FrameStore::Scan(dir.path());
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(u->datasets.size(), 2u);
  EXPECT_EQ(u->datasets[0].name, "/data/a");
  EXPECT_EQ(u->datasets[0].entries, 3u);
  EXPECT_EQ(u->datasets[1].entries, 2u);
  EXPECT_EQ(u->pixel_bytes, 5u * 16 * 16 * 3);
  ASSERT_TRUE(FrameStore::Clear(dir.path(), "aaa").ok());
  u = FrameStore::Scan(dir.path());
  ASSERT_EQ(u->datasets.size(), 1u);
  EXPECT_EQ(u->datasets[0].key, "bbb-2");
  EXPECT_EQ(u->accounted_bytes, u->bytes);
  EXPECT_EQ(FrameStore::Scan(dir.Join("nothing")).status().code(), absl::StatusCode::kNotFound);
}

TEST(FrameStoreTest, BadOptionsAreClearErrors) {
  FrameStoreOptions o;
  EXPECT_EQ(FrameStore::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.dir = "/proc/conveyor-no";
  o.max_bytes = 100;
  auto s = FrameStore::Open(o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/proc/conveyor-no"), std::string::npos) << s.status();
  FrameCacheConfig c;
  c.dir = "/tmp/x";
  c.compression = "brotli";
  EXPECT_EQ(MakeFrameCache(c).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
