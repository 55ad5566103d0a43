// The node caches on a node shared by several users (issue 45, item 1; base/cache_dir.h,
// docs/serving.md "Shared nodes"). A second uid (65534, nobody:nogroup, in a forked child) plays
// the neighbour: it pre-creates a cache directory, plants links and FIFOs, and forges entries with
// valid unkeyed checksums. None of that is followed, hung on or served: a private directory of
// another user is refused naming its path and owner, a private store is closed to other users
// (0700, entries 0600), and in a group-shared store an entry written without the node secret is
// counted corrupt, never a hit.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "base/cache_dir.h"
#include "pipeline/frame_cache.h"
#include "pipeline/frame_store.h"
#include "storage/memory_storage.h"
#include "storage/storage.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"
#include "xxhash.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr uid_t kOther = 65534;  // nobody
constexpr gid_t kOtherGroup = 65534;  // nogroup

// Runs `fn` in a child process as uid and gid 65534 with no supplementary groups: a neighbour who
// is a member of the shared directories' group (65534) but cannot read the node secret (root's,
// 0600). Its return value is the child's exit status.
int AsOtherUser(const std::function<int()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kOtherGroup, kOtherGroup, kOtherGroup) != 0 ||
        ::setresuid(kOther, kOther, kOther) != 0) {
      ::_exit(100);
    }
    ::_exit(fn());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

RgbImage Frame(int w, int h, uint32_t seed) {
  RgbImage img;
  img.width = w;
  img.height = h;
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  std::mt19937 rng(seed);
  for (uint8_t& p : img.pixels) p = static_cast<uint8_t>(rng());
  return img;
}

FrameCacheKey Key(int64_t frame) { return FrameCacheKey{"ds-1234", 0, 1, frame, 42}; }

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
}

// The entry files under a store (frames2/) or a byte cache (blocks2/), sorted.
std::vector<std::string> EntryFiles(const std::string& dir, const char* sub) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(fs::path(dir) / sub, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file() && it->path().filename() != "source") out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What the issue's neighbour did to a frame store entry: change the pixels and fix every unkeyed
// checksum (the payload's XXH3 at byte 48 and the header's own over its first 88 bytes), then
// put it in place of the original (unlink and create: the directory lets group members do that).
// True when the forged file is in place.
bool ForgeFrameEntry(const std::string& path) {
  std::string bytes = testing::ReadFile(path);
  if (bytes.size() < 96 + 16) return false;
  for (size_t i = 96; i < 96 + 16; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
  const uint64_t payload = XXH3_64bits(bytes.data() + 96, bytes.size() - 96);
  std::memcpy(bytes.data() + 48, &payload, 8);
  const uint64_t self = XXH3_64bits(bytes.data(), 88);
  std::memcpy(bytes.data() + 88, &self, 8);
  if (::unlink(path.c_str()) != 0) return false;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return false;
  const bool ok = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  return ok;
}

// The same for a byte cache entry: payload after a 56-byte header, its XXH3 at byte 16.
bool ForgeBlockEntry(const std::string& path) {
  std::string bytes = testing::ReadFile(path);
  if (bytes.size() < 56 + 8) return false;
  for (size_t i = 56; i < 64; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
  const uint64_t sum = XXH3_64bits(bytes.data() + 56, bytes.size() - 56);
  std::memcpy(bytes.data() + 16, &sum, 8);
  if (::unlink(path.c_str()) != 0) return false;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return false;
  const bool ok = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  return ok;
}

class SharedNodeCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as a second uid (65534) beside the cache's owner";
    // The scratch directory is reachable by the other user; node/ is world-writable and sticky,
    // as /dev/shm and /tmp are.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
    node_ = dir_.Join("node");
    ASSERT_EQ(::mkdir(node_.c_str(), 01777), 0);
    ASSERT_EQ(::chmod(node_.c_str(), 01777), 0);
    key_ = WriteKey("key", 7);
    victim_ = dir_.Join("victim");
    testing::WriteFile(victim_, "precious bytes of a root-owned 0600 file");
    ASSERT_EQ(::chmod(victim_.c_str(), 0600), 0);
  }

  // A node secret readable by root only (0600): members of the shared group do not hold it.
  std::string WriteKey(const std::string& name, uint32_t seed) {
    std::string key(32, '\0');
    std::mt19937 rng(seed);
    for (char& c : key) c = static_cast<char>(rng());
    const std::string path = dir_.Join(name);
    testing::WriteFile(path, key);
    ::chmod(path.c_str(), 0600);
    return path;
  }

  // A group directory as an administrator makes one: root-owned, group 65534, 2770.
  std::string SharedDir(const std::string& name) {
    const std::string path = node_ + "/" + name;
    EXPECT_EQ(::mkdir(path.c_str(), 02770), 0);
    EXPECT_EQ(::chown(path.c_str(), 0, kOtherGroup), 0);
    EXPECT_EQ(::chmod(path.c_str(), 02770), 0);
    return path;
  }

  absl::StatusOr<std::unique_ptr<FrameStore>> OpenStore(const std::string& dir, const std::string& key = "") {
    FrameStoreOptions o;
    o.dir = dir;
    o.max_bytes = 1 << 30;
    o.shared_key_file = key;
    return FrameStore::Open(o);
  }

  absl::StatusOr<std::unique_ptr<Storage>> OpenBytes(const std::string& dir, const std::string& key = "") {
    StorageCacheOptions o;
    o.dir = dir;
    o.max_bytes = 1 << 30;
    o.block_bytes = 4096;
    o.parallel_ranges = 1;
    o.shared_key_file = key;
    return NewCachingStorage(NewMemoryStorage(files_), "mem://test/", o);
  }

  std::string ReadAll(Storage& s, const std::string& name) {
    auto f = s.Open(name);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return "";
    std::string got((*f)->size(), '\0');
    const absl::Status st = (*f)->Read(0, got.size(), got.data());
    EXPECT_TRUE(st.ok()) << st;
    return got;
  }

  TempDir dir_;
  std::string node_, key_, victim_;
  std::map<std::string, std::string> files_{{"a.bin", std::string(3 * 4096 + 100, 'a')}};
};

TEST_F(SharedNodeCacheTest, ADirectoryPreCreatedByAnotherUserIsRefusedNamingItsOwner) {
  const std::string frames = node_ + "/conveyor-frames", bytes = node_ + "/conveyor-bytes";
  ASSERT_EQ(AsOtherUser([&] { return ::mkdir(frames.c_str(), 0777) == 0 && ::mkdir(bytes.c_str(), 0777) == 0 ? 0 : 1; }), 0);
  auto store = OpenStore(frames);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(store.status().message().find(frames), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("owned by uid 65534"), std::string::npos) << store.status();
  auto cache = OpenBytes(bytes);
  ASSERT_FALSE(cache.ok());
  EXPECT_NE(cache.status().message().find(bytes), std::string::npos) << cache.status();
  EXPECT_NE(cache.status().message().find("owned by uid 65534"), std::string::npos) << cache.status();
  // Nothing was written into them.
  EXPECT_TRUE(fs::is_empty(frames));
  EXPECT_TRUE(fs::is_empty(bytes));

  // One of our own that others may write is refused too; one others may only read is tightened.
  const std::string wide = node_ + "/wide", readable = node_ + "/readable";
  ASSERT_EQ(::mkdir(wide.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(wide.c_str(), 0777), 0);
  auto w = OpenStore(wide);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("world-writable (mode 0777)"), std::string::npos) << w.status();
  ASSERT_EQ(::mkdir(readable.c_str(), 0755), 0);
  ASSERT_TRUE(OpenStore(readable).ok());
  EXPECT_EQ(ModeOf(readable), 0700u);
}

TEST_F(SharedNodeCacheTest, APrivateStoreIsClosedToOtherUsers) {
  const std::string frames = node_ + "/frames", bytes = node_ + "/bytes";
  auto store = OpenStore(frames);
  ASSERT_TRUE(store.ok()) << store.status();
  (*store)->Insert(Key(0), Frame(16, 16, 0));
  ASSERT_NE((*store)->Find(Key(0)), nullptr);
  auto cache = OpenBytes(bytes);
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_EQ(ReadAll(**cache, "a.bin"), files_["a.bin"]);

  EXPECT_EQ(ModeOf(frames), 0700u);
  EXPECT_EQ(ModeOf(bytes), 0700u);
  const std::vector<std::string> entries = EntryFiles(frames, "frames2"), blocks = EntryFiles(bytes, "blocks2");
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_EQ(blocks.size(), 4u);
  for (const std::string& f : entries) EXPECT_EQ(ModeOf(f), 0600u) << f;
  for (const std::string& f : blocks) EXPECT_EQ(ModeOf(f), 0600u) << f;
  for (const std::string& f : {frames + "/lock", frames + "/usage", bytes + "/lock", bytes + "/usage"}) {
    EXPECT_EQ(ModeOf(f), 0600u) << f;
  }
  // The neighbour can neither list nor read them, even knowing the names.
  EXPECT_EQ(AsOtherUser([&] {
              for (const std::string& d : {frames, bytes}) {
                if (::open(d.c_str(), O_RDONLY | O_DIRECTORY) >= 0 || errno != EACCES) return 1;
              }
              for (const std::string& f : {entries[0], blocks[0]}) {
                if (::open(f.c_str(), O_RDONLY) >= 0 || errno != EACCES) return 2;
              }
              return 0;
            }),
            0);
}

TEST_F(SharedNodeCacheTest, AnEntryForgedInASharedStoreIsNeverAHit) {
  const std::string shared = SharedDir("shared");
  {
    auto writer = OpenStore(shared, key_);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (int64_t i = 0; i < 3; ++i) (*writer)->Insert(Key(i), Frame(32, 32, static_cast<uint32_t>(i)));
    ASSERT_EQ((*writer)->stats().published, 3u);
  }
  const std::vector<std::string> entries = EntryFiles(shared, "frames2");
  ASSERT_EQ(entries.size(), 3u);
  for (const std::string& f : entries) {
    EXPECT_EQ(ModeOf(f), 0640u) << f;
    struct stat st {};
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    EXPECT_EQ(st.st_gid, kOtherGroup) << f << " is not in the store's group";
  }
  // A member of the group without the secret forges frames 0 and 1 with valid unkeyed checksums.
  ASSERT_EQ(AsOtherUser([&] {
              if (::open(key_.c_str(), O_RDONLY) >= 0) return 1;  // the secret is not theirs
              return ForgeFrameEntry(entries[0]) && ForgeFrameEntry(entries[1]) ? 0 : 3;
            }),
            0);

  auto reader = OpenStore(shared, key_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::map<int64_t, bool> served;
  for (int64_t i = 0; i < 3; ++i) {
    std::shared_ptr<const RgbImage> got = (*reader)->Find(Key(i));
    served[i] = got != nullptr;
    if (got) {
      EXPECT_EQ(got->pixels, Frame(32, 32, static_cast<uint32_t>(i)).pixels) << "frame " << i;
    }
  }
  const int forged_served = static_cast<int>(served[0]) + static_cast<int>(served[1]);
  EXPECT_EQ(forged_served, 0) << "a forged entry was served as a hit";
  EXPECT_TRUE(served[2]) << "the genuine entry was not served";
  EXPECT_EQ((*reader)->stats().corrupt, 2u);
  EXPECT_EQ((*reader)->stats().hits, 1u);

  // A job with another secret (a foreign entry) gets a miss, not a hit.
  auto foreign = OpenStore(shared, WriteKey("other-key", 99));
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  EXPECT_EQ((*foreign)->Find(Key(2)), nullptr);
  EXPECT_EQ((*foreign)->stats().corrupt, 1u);

  // Control: the forgery is a valid entry for the unkeyed checks, so only the MAC stops it. A
  // private store (whose directory no one else can write) serves it.
  const std::string mine = node_ + "/mine";
  {
    auto s = OpenStore(mine);
    ASSERT_TRUE(s.ok()) << s.status();
    (*s)->Insert(Key(0), Frame(32, 32, 0));
  }
  ASSERT_TRUE(ForgeFrameEntry(EntryFiles(mine, "frames2").at(0)));
  auto s = OpenStore(mine);
  ASSERT_TRUE(s.ok());
  std::shared_ptr<const RgbImage> got = (*s)->Find(Key(0));
  ASSERT_NE(got, nullptr) << "the control forgery is not a valid unkeyed entry: the test proves nothing";
  EXPECT_NE(got->pixels, Frame(32, 32, 0).pixels);
}

// The issue's repro end to end: a group's store warmed by `conveyor cache warm`, every entry then
// forged by a member without the secret; a server given the store serves batches whose digests
// equal the offline ones (`conveyor batches`, no cache), and counts the forged entries corrupt.
TEST_F(SharedNodeCacheTest, AServerGivenAForgedSharedStoreServesTheOfflineBatches) {
  const std::string cli = CONVEYOR_CLI, ds = dir_.Join("ds"), config = dir_.Join("c.yaml");
  ASSERT_SH(testing::ShellCommand({cli, "synth", "--out", ds, "--episodes", "2", "--episode-seconds", "1", "--quiet"}));
  testing::WriteFile(config, R"(anchor: cam0
streams:
  cam0:
    delta_timestamps: [0.0, 0.1]
    size: [32, 32]
pipeline:
  global_batch_size: 8
  seed: 5
  schedule: {mode: gop}
)");
  const std::string store = SharedDir("frames");
  int code = 0;
  const std::string warm = testing::Capture(
      testing::ShellCommand({cli, "cache", "warm", ds, "--config", config, "--frame-cache-dir", store,
                             "--frame-cache-shared-key", key_, "--threads", "1"}) + " 2>&1", &code);
  ASSERT_EQ(code, 0) << warm;
  const std::vector<std::string> entries = EntryFiles(store, "frames2");
  ASSERT_GT(entries.size(), 10u) << warm;
  ASSERT_EQ(AsOtherUser([&] {
              for (const std::string& f : entries) {
                if (!ForgeFrameEntry(f)) return 1;
              }
              return 0;
            }),
            0);
  const std::string offline = testing::Capture(
      testing::ShellCommand({cli, "batches", ds, "--config", config, "--steps", "5", "--digest"}), &code);
  ASSERT_EQ(code, 0) << offline;
  testing::ServerProcess server(cli,
                                {ds, "--config", config, "--threads", "1", "--frame-cache-dir", store,
                                 "--frame-cache-shared-key", key_, "--metrics-listen", "127.0.0.1:0"},
                                dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  const std::string served = testing::Capture(
      testing::ShellCommand({cli, "fetch", "--servers", server.address(), "--steps", "5", "--digest"}), &code);
  ASSERT_EQ(code, 0) << served << server.log();
  EXPECT_EQ(testing::SplitLines(served), testing::SplitLines(offline));
  ASSERT_EQ(testing::SplitLines(offline).size(), 5u);
  const std::string metrics = testing::Capture("curl -sf http://" + server.metrics_address() + "/metrics", &code);
  const size_t at = metrics.find("\nconveyor_frame_store_corrupt_total ");
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_GT(std::stod(metrics.substr(at + 36)), 0.0) << metrics.substr(at, 60);
}

TEST_F(SharedNodeCacheTest, AByteCacheEntryForgedInASharedCacheIsNeverServed) {
  const std::string shared = SharedDir("bytes");
  {
    auto cache = OpenBytes(shared, key_);
    ASSERT_TRUE(cache.ok()) << cache.status();
    ASSERT_EQ(ReadAll(**cache, "a.bin"), files_["a.bin"]);
  }
  const std::vector<std::string> blocks = EntryFiles(shared, "blocks2");
  ASSERT_EQ(blocks.size(), 4u);
  for (const std::string& f : blocks) EXPECT_EQ(ModeOf(f), 0640u) << f;
  ASSERT_EQ(AsOtherUser([&] {
              for (const std::string& f : blocks) {
                if (!ForgeBlockEntry(f)) return 1;
              }
              return 0;
            }),
            0);
  auto cache = OpenBytes(shared, key_);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(ReadAll(**cache, "a.bin"), files_["a.bin"]) << "forged bytes were served";
  const StorageStats st = (*cache)->stats();
  EXPECT_EQ(st.cache_corrupt, 4u);
  EXPECT_EQ(st.cache_hits, 0u);
}

TEST_F(SharedNodeCacheTest, PlantedLinksAndFifosAreRefusedNotFollowedNorHungOn) {
  const std::string victim_before = testing::ReadFile(victim_);
  // `usage` as a link to a root-owned file: the issue's store overwrote its first 8 bytes.
  const std::string linked = SharedDir("linked");
  ASSERT_EQ(AsOtherUser([&] { return ::symlink(victim_.c_str(), (linked + "/usage").c_str()); }), 0);
  auto a = OpenStore(linked, key_);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("usage"), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("symbolic link"), std::string::npos) << a.status();
  // `usage` as a FIFO: the issue's pipeline hung on it.
  const std::string fifo = SharedDir("fifo");
  ASSERT_EQ(AsOtherUser([&] { return ::mkfifo((fifo + "/usage").c_str(), 0666); }), 0);
  auto b = OpenStore(fifo, key_);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not a regular file"), std::string::npos) << b.status();
  // The byte cache: a `lock` FIFO refuses the cache; a `usage` link is not written through.
  const std::string bytes_fifo = SharedDir("bytes-fifo"), bytes_link = SharedDir("bytes-link");
  ASSERT_EQ(AsOtherUser([&] { return ::mkfifo((bytes_fifo + "/lock").c_str(), 0666); }), 0);
  auto c = OpenBytes(bytes_fifo, key_);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not a regular file"), std::string::npos) << c.status();
  ASSERT_EQ(AsOtherUser([&] { return ::symlink(victim_.c_str(), (bytes_link + "/usage").c_str()); }), 0);
  auto d = OpenBytes(bytes_link, key_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(ReadAll(**d, "a.bin"), files_["a.bin"]);

  // Entries: one replaced by a FIFO, one planted as a link to the victim. Misses, counted, and
  // `conveyor cache info` (Scan) does not hang on them either.
  const std::string store_dir = SharedDir("entries");
  {
    auto s = OpenStore(store_dir, key_);
    ASSERT_TRUE(s.ok()) << s.status();
    (*s)->Insert(Key(0), Frame(16, 16, 0));
  }
  const std::string entry0 = EntryFiles(store_dir, "frames2").at(0);
  const std::string entry1 = fs::path(entry0).parent_path().string() + "/1.1";
  ASSERT_EQ(AsOtherUser([&] {
              if (::unlink(entry0.c_str()) != 0 || ::mkfifo(entry0.c_str(), 0666) != 0) return 1;
              return ::symlink(victim_.c_str(), entry1.c_str()) == 0 ? 0 : 2;
            }),
            0);
  EXPECT_TRUE(FrameStore::Scan(store_dir).ok());
  auto s = OpenStore(store_dir, key_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->Find(Key(0)), nullptr);
  EXPECT_EQ((*s)->Find(Key(1)), nullptr);
  EXPECT_EQ((*s)->stats().corrupt, 2u);
  EXPECT_EQ(testing::ReadFile(victim_), victim_before) << "a planted link was written through";
}

TEST_F(SharedNodeCacheTest, TheNodeSecretMustBeAPrivateFileOfEnoughBytes) {
  const std::string shared = SharedDir("keys");
  const std::string open_key = WriteKey("open-key", 3);
  ASSERT_EQ(::chmod(open_key.c_str(), 0644), 0);
  auto a = OpenStore(shared, open_key);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("readable by every user"), std::string::npos) << a.status();
  const std::string short_key = dir_.Join("short-key");
  testing::WriteFile(short_key, "0123456789");
  ::chmod(short_key.c_str(), 0600);
  auto b = OpenStore(shared, short_key);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("has 10 bytes"), std::string::npos) << b.status();
  const std::string link = dir_.Join("key-link");
  ASSERT_EQ(::symlink(key_.c_str(), link.c_str()), 0);
  auto c = OpenStore(shared, link);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("symbolic link"), std::string::npos) << c.status();
  // A world-writable directory is not a group's: refused even with a key.
  const std::string open_dir = node_ + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  auto d = OpenStore(open_dir, key_);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("world-writable"), std::string::npos) << d.status();
}

// Entry formats are versioned: a store of the previous release (frames1/, 64-byte headers, no MAC)
// is read as empty, misses and no errors, and `conveyor cache clear` removes it.
TEST_F(SharedNodeCacheTest, AnOlderReleasesStoreIsEmptyToThisOneAndCleared) {
  const std::string store = node_ + "/old";
  ASSERT_EQ(::mkdir(store.c_str(), 0700), 0);
  fs::create_directories(store + "/frames1/ds-1234/000000000000002a/0");
  testing::WriteFile(store + "/frames1/ds-1234/000000000000002a/0/1.0", std::string(64 + 16 * 16 * 3, 'x'));
  auto s = OpenStore(store);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->Find(Key(0)), nullptr);
  EXPECT_EQ((*s)->stats().corrupt, 0u);
  EXPECT_EQ((*s)->stats().misses, 1u);
  auto cleared = FrameStore::Clear(store);
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  EXPECT_FALSE(fs::exists(store + "/frames1"));
}

}  // namespace
}  // namespace conveyor
