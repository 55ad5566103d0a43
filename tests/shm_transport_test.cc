// The same-host transport (docs/serving.md "Same-host transport"): the ring's protocol between
// the client's region (client/internal/shm_region.h) and the server's writer
// (server/shm_writer.h), hostile offers, and a real `conveyor serve` delivering exactly the
// batches of the gRPC path through shared memory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/internal/shm_region.h"
#include "server/shm_writer.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using client::ShmRegion;
using testing::ServerProcess;
using testing::TempDir;

const std::string kCli = CONVEYOR_CLI;
constexpr char kConfig[] = R"(anchor: cam0
streams:
  cam0:
    delta_timestamps: [0.0]
    size: [96, 96]
  observation.state:
    delta_timestamps: [0.0]
  action:
    delta_timestamps: {start: 0.0, step: 0.02, count: 10}
pipeline:
  global_batch_size: 16
  seed: 5
)";
auto Never = [] { return false; };

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(ShmRingTest, PayloadsArriveInPlaceWrapAndWaitForReleases) {
  auto region = ShmRegion::Create(3 * 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  auto writer = ShmWriter::Open((*region)->name(), (*region)->nonce(), (*region)->capacity(), UINT64_MAX, 8);
  ASSERT_TRUE(writer.ok()) << writer.status();
  // The server unlinks the name once it holds a descriptor: nothing is left in /dev/shm if
  // either process dies from here on.
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + (*region)->name()));

  std::map<uint64_t, std::vector<uint8_t>> sent;
  auto place = [&](size_t n, uint8_t seed, const std::function<bool()>& stop = Never) -> std::optional<uint64_t> {
    std::vector<uint8_t> data = Bytes(n, seed);
    absl::StatusOr<std::optional<uint64_t>> pos = (*writer)->Place(data.data(), n, stop);
    EXPECT_TRUE(pos.ok()) << pos.status();
    if (pos.ok() && pos->has_value()) sent[**pos] = data;
    return pos.ok() ? *pos : std::nullopt;
  };
  auto accept = [&](uint64_t pos) {
    const std::vector<uint8_t>& want = sent.at(pos);
    absl::StatusOr<const uint8_t*> at = (*region)->Accept(pos, want.size());
    ASSERT_TRUE(at.ok()) << at.status();
    EXPECT_EQ(std::memcmp(*at, want.data(), want.size()), 0);
  };
  const std::optional<uint64_t> a = place(5000, 1), b = place(5000, 2);
  ASSERT_EQ(a, 0u);
  ASSERT_EQ(b, 5000u);
  accept(*a);
  accept(*b);
  // 5000 more would wrap past 12288: it goes to the next lap, where `a` still is. A client that
  // is merely slow makes the writer wait (here until `stop` says the stream is over)...
  std::vector<uint8_t> data = Bytes(5000, 3);
  const auto t0 = std::chrono::steady_clock::now();
  auto after_50ms = [&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(50); };
  EXPECT_EQ((*writer)->Place(data.data(), data.size(), after_50ms).status().code(), absl::StatusCode::kCancelled);
  EXPECT_GT((*writer)->wait_seconds(), 0.0);
  // ...and one that says it is starved (it keeps both batches and waits for more) gets this one in
  // messages instead.
  (*region)->SetStarved(true);
  EXPECT_EQ(place(5000, 3), std::nullopt);
  EXPECT_EQ((*writer)->full_batches(), 1u);
  (*region)->SetStarved(false);
  // Releasing `b` first frees nothing (in order); then `a` frees both.
  (*region)->Release(*b);
  EXPECT_EQ((*region)->released(), 0u);
  (*region)->Release(*a);
  EXPECT_EQ((*region)->released(), 10000u);
  const std::optional<uint64_t> c = place(5000, 4);
  ASSERT_EQ(c, 12288u);  // the start of the second lap
  accept(*c);
  // Larger than the ring: always messages.
  EXPECT_EQ(place(20000, 5), std::nullopt);
}

TEST(ShmRingTest, TheServerRunsAtMostBatchesAheadAndWithinItsBudget) {
  auto region = ShmRegion::Create(16 * 4096);
  ASSERT_TRUE(region.ok());
  // The server's budget is 5 pages, and the client holds at most 2 unreleased batches.
  auto writer = ShmWriter::Open((*region)->name(), (*region)->nonce(), (*region)->capacity(), 5 * 4096 + 100, 2);
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->ring(), 5u * 4096);
  ASSERT_TRUE((*region)->SetRing((*writer)->ring()).ok());
  std::vector<uint8_t> data = Bytes(1000, 1);
  auto place = [&](const std::function<bool()>& stop) { return (*writer)->Place(data.data(), data.size(), stop); };
  auto a = place(Never), b = place(Never);
  ASSERT_TRUE(a.ok() && b.ok() && a->has_value() && b->has_value());
  ASSERT_TRUE((*region)->Accept(**a, 1000).ok());
  ASSERT_TRUE((*region)->Accept(**b, 1000).ok());
  // A third waits, though the ring has room: two are unreleased.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(place([&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(30); })
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  (*region)->Release(**a);
  auto c = place(Never);
  ASSERT_TRUE(c.ok() && c->has_value());
  EXPECT_EQ(**c, 2000u);
  // Positions wrap at the server's ring, and the client checks them against it.
  EXPECT_EQ((*region)->Accept(**c, 1000).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ((*region)->Accept(5 * 4096 - 10, 1000).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ShmRingTest, ACorruptPositionFromTheServerIsDataLossNotAWildRead) {
  auto region = ShmRegion::Create(4096);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ((*region)->Accept(100, 4096).status().code(), absl::StatusCode::kDataLoss);  // wraps
  EXPECT_EQ((*region)->Accept(0, 8192).status().code(), absl::StatusCode::kDataLoss);    // too big
  EXPECT_EQ((*region)->Accept(1u << 30, 10).status().code(), absl::StatusCode::kDataLoss);  // ahead
  ASSERT_TRUE((*region)->Accept(0, 100).ok());
  EXPECT_EQ((*region)->Accept(0, 100).status().code(), absl::StatusCode::kDataLoss);  // reused
}

TEST(ShmRingTest, HostileOffersAreRefusedWithAReason) {
  auto region = ShmRegion::Create(4096);
  ASSERT_TRUE(region.ok());
  const std::string name = (*region)->name(), nonce = (*region)->nonce();
  struct Offer {
    std::string name, nonce;
    uint64_t capacity;
    std::string message;
  };
  const std::vector<Offer> offers = {
      {"../../etc/passwd", nonce, 4096, "not one Conveyor makes"},
      {"conveyor-0123456789abcdef0123456789abcdef", nonce, 4096, "cannot open"},
      {name, std::string(16, 'x'), 4096, "does not hold the offered region"},
      {name, nonce, 8192, "is not a region of 8192 bytes"},
      {name, "short", 4096, "bad nonce"},
  };
  for (const Offer& o : offers) {
    auto w = ShmWriter::Open(o.name, o.nonce, o.capacity, UINT64_MAX, 4);
    ASSERT_FALSE(w.ok()) << o.name;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(w.status().message().find(o.message), std::string::npos) << w.status();
  }
}

TEST(ShmRingTest, AClientThatTruncatesItsRegionFailsItsOwnStreamOnly) {
  auto region = ShmRegion::Create(4 * 4096);
  ASSERT_TRUE(region.ok());
  const int fd = shm_open(("/" + (*region)->name()).c_str(), O_RDWR, 0);  // the client's own
  ASSERT_GE(fd, 0);
  auto writer = ShmWriter::Open((*region)->name(), (*region)->nonce(), (*region)->capacity(), UINT64_MAX, 4);
  ASSERT_TRUE(writer.ok());
  ASSERT_EQ(ftruncate(fd, 10), 0);  // the header's release counter is gone
  close(fd);
  std::vector<uint8_t> data = Bytes(1000, 9);
  absl::StatusOr<std::optional<uint64_t>> pos = (*writer)->Place(data.data(), data.size(), Never);
  ASSERT_FALSE(pos.ok());  // the server process is still here: it read, it did not map
  EXPECT_EQ(pos.status().code(), absl::StatusCode::kDataLoss);
}

class ShmServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>();
    ASSERT_SH(testing::ShellCommand({kCli, "synth", "--out", dir_->Join("ds"), "--episodes", "3",
                                     "--episode-seconds", "2", "--quiet"}));
    testing::WriteFile(dir_->Join("c.yaml"), kConfig);
  }
  std::vector<std::string> Serve(std::vector<std::string> more = {}) {
    std::vector<std::string> args = {dir_->Join("ds"), "--config", dir_->Join("c.yaml"), "--threads", "2"};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
  // Every batch's tensors, by name, as bytes.
  static std::vector<std::map<std::string, std::string>> Fetch(const std::string& address, bool shm,
                                                               uint64_t shm_bytes, size_t steps,
                                                               client::ClientStats* stats,
                                                               bool keep_all = false) {
    client::ClientOptions o;
    o.servers = {address};
    o.max_batches = steps;
    o.shared_memory = shm;
    o.shared_memory_bytes = shm_bytes;
    auto c = client::Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    std::vector<std::map<std::string, std::string>> out;
    std::vector<client::Batch> kept;
    for (;;) {
      auto b = (*c)->Next();
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok() || !b->has_value()) break;
      auto& m = out.emplace_back();
      for (const client::TensorView& t : (*b)->tensors) m[t.name] = std::string(reinterpret_cast<const char*>(t.data), t.bytes);
      if (keep_all) kept.push_back(std::move(**b));
    }
    *stats = (*c)->stats();
    return out;
  }
  std::unique_ptr<TempDir> dir_;
};

TEST_F(ShmServeTest, SharedMemoryDeliversExactlyTheGrpcBatches) {
  ServerProcess server(kCli, Serve(), dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  client::ClientStats shm_stats, grpc_stats;
  const auto via_shm = Fetch(server.address(), true, 256ull << 20, 12, &shm_stats);
  const auto via_grpc = Fetch(server.address(), false, 0, 12, &grpc_stats);
  ASSERT_EQ(via_shm.size(), 12u);
  EXPECT_TRUE(via_shm == via_grpc);
  EXPECT_EQ(shm_stats.transport, "shared_memory");
  EXPECT_EQ(shm_stats.shared_memory_batches, 12u);
  EXPECT_EQ(shm_stats.messages, 12u);  // headers only
  EXPECT_EQ(grpc_stats.transport, "grpc");
  EXPECT_EQ(grpc_stats.shared_memory_batches, 0u);
}

TEST_F(ShmServeTest, AClientKeepingEveryBatchGetsTheRestInMessages) {
  ServerProcess server(kCli, Serve(), dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  client::ClientStats kept_stats, grpc_stats;
  const auto via_grpc = Fetch(server.address(), false, 0, 10, &grpc_stats);
  ASSERT_FALSE(via_grpc.empty());
  uint64_t batch_bytes = 0;
  for (const auto& [name, bytes] : via_grpc[0]) batch_bytes += (bytes.size() + 63) / 64 * 64;
  // A region of about three batches, none released until the end: the stream must not stall.
  const auto kept = Fetch(server.address(), true, 3 * batch_bytes + 4096, 10, &kept_stats, /*keep_all=*/true);
  ASSERT_EQ(kept.size(), 10u);
  EXPECT_TRUE(kept == via_grpc);
  EXPECT_GT(kept_stats.shared_memory_batches, 0u);
  EXPECT_LT(kept_stats.shared_memory_batches, 10u);
}

TEST_F(ShmServeTest, AServerWithoutSharedMemorySaysWhy) {
  ServerProcess server(kCli, Serve({"--shared-memory", "false"}), dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  client::ClientStats stats;
  ASSERT_EQ(Fetch(server.address(), true, 64ull << 20, 3, &stats).size(), 3u);
  EXPECT_EQ(stats.transport, "grpc");
  EXPECT_NE(stats.shared_memory_refused.find("--shared-memory=false"), std::string::npos)
      << stats.shared_memory_refused;
}

}  // namespace
}  // namespace conveyor
