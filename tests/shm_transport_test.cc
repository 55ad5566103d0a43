// The same-host transport (docs/serving.md "Same-host transport"): the region's handoff and ring
// protocol between the server's sink (server/internal/shm_sink.h) and the client's region
// (client/internal/shm_region.h), hostile peers on both sides, and a real `conveyor serve`
// delivering exactly the batches of the gRPC path through shared memory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/fd_passing.h"
#include "base/shm_layout.h"
#include "base/worker_pool.h"
#include "client/client.h"
#include "client/internal/shm_region.h"
#include "server/internal/shm_sink.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;
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
const StopFn Never = [] { return false; };

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

// A sink and the client's region for it, handed over as a stream does.
struct Pair {
  std::unique_ptr<SharedMemorySink> sink;
  std::shared_ptr<ShmRegion> region;
};

Pair Connect(uint64_t ring, uint32_t batches_ahead, uint64_t client_max = UINT64_MAX) {
  Pair p;
  auto sink = SharedMemorySink::Create(ring, batches_ahead, 1 << 20);
  EXPECT_TRUE(sink.ok()) << sink.status();
  if (!sink.ok()) return p;
  p.sink = std::move(*sink);
  absl::Status handed;
  {
    WorkerPool server("handoff", 1, [&](int) { handed = p.sink->Handoff(absl::Seconds(5), Never); });
    auto region = ShmRegion::Receive(p.sink->socket_path(), p.sink->token(), p.sink->ring(), client_max);
    EXPECT_TRUE(region.ok()) << region.status();
    if (region.ok()) p.region = std::move(*region);
  }
  EXPECT_TRUE(handed.ok()) << handed;
  return p;
}

// A batch of one `n`-byte tensor built where the sink's buffers put it, sent: its position in the
// region, or nullopt when it went in messages. `sent` keeps its bytes by position.
std::optional<uint64_t> Place(SharedMemorySink& sink, size_t n, uint8_t seed, const StopFn& stop,
                              std::map<uint64_t, std::vector<uint8_t>>* sent, absl::Status* status = nullptr) {
  absl::StatusOr<std::shared_ptr<HostBuffer>> buf = sink.buffers(stop)((n + 63) / 64 * 64);
  if (status) *status = buf.status();
  if (!buf.ok()) return std::nullopt;
  const std::vector<uint8_t> data = Bytes(n, seed);
  std::memcpy((*buf)->data(), data.data(), n);
  Batch b;
  b.tensors.push_back(TensorView{{"x", DType::kUint8, {static_cast<int64_t>(n)}, TensorRole::kData}, 0, n});
  b.buffer = std::move(*buf);
  std::optional<uint64_t> pos;
  const absl::Status st = sink.Send(b, Cursor{}, [&](const grpc::ByteBuffer& m) {
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(m.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    pb::StreamBatchesResponse msg;
    EXPECT_TRUE(msg.ParseFromString(bytes));
    if (msg.in_shared_memory()) pos = msg.shm_position();
    return true;
  });
  EXPECT_TRUE(st.ok()) << st;
  if (pos && sent) (*sent)[*pos] = data;
  return pos;
}

TEST(ShmRingTest, BatchesAreBuiltInPlaceWrapAndWaitForReleases) {
  Pair p = Connect(3 * 4096, 8);
  ASSERT_TRUE(p.region);
  // The handoff socket is gone once the region is handed over: nothing is left in /dev/shm.
  EXPECT_FALSE(std::filesystem::exists(p.sink->socket_path()));
  std::map<uint64_t, std::vector<uint8_t>> sent;
  auto accept = [&](uint64_t pos) {
    const std::vector<uint8_t>& want = sent.at(pos);
    absl::StatusOr<const uint8_t*> at = p.region->Accept(pos, want.size());
    ASSERT_TRUE(at.ok()) << at.status();
    EXPECT_EQ(std::memcmp(*at, want.data(), want.size()), 0);
  };
  const std::optional<uint64_t> a = Place(*p.sink, 5000, 1, Never, &sent);
  ASSERT_EQ(a, 0u);
  accept(*a);
  // Every batch starts on a page: 5000 bytes take two, and two more would wrap past 12288, so the
  // next goes to the second lap, where `a` still is. A client that is merely slow makes the
  // server wait (here until `stop` says the stream is over)...
  const auto t0 = std::chrono::steady_clock::now();
  auto after_50ms = [&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(50); };
  absl::Status st;
  EXPECT_EQ(Place(*p.sink, 5000, 3, after_50ms, &sent, &st), std::nullopt);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_GT(p.sink->wait_seconds(), 0.0);
  // ...and one that says it is starved (it keeps the batch and waits for more) gets this one in
  // messages instead.
  p.region->SetStarved(true);
  EXPECT_EQ(Place(*p.sink, 5000, 3, Never, &sent), std::nullopt);
  EXPECT_EQ(p.sink->full_batches(), 1u);
  p.region->SetStarved(false);
  // A small one fits in the third page; releasing it first frees nothing (in order), then `a`
  // frees both.
  const std::optional<uint64_t> b = Place(*p.sink, 100, 2, Never, &sent);
  ASSERT_EQ(b, 8192u);
  accept(*b);
  p.region->Release(*b);
  EXPECT_EQ(p.region->released(), 0u);
  p.region->Release(*a);
  EXPECT_EQ(p.region->released(), 8292u);
  const std::optional<uint64_t> c = Place(*p.sink, 5000, 4, Never, &sent);
  ASSERT_EQ(c, 12288u);  // the start of the second lap
  accept(*c);
  // Larger than the ring: always messages.
  EXPECT_EQ(Place(*p.sink, 20000, 5, Never, &sent), std::nullopt);
  EXPECT_EQ(p.sink->region_batches(), 3u);
}

TEST(ShmRingTest, TheServerRunsAtMostBatchesAheadAndWithinTheRingItWasGiven) {
  // The server's ring is 5 pages (its budget, not the client's 16), and the client holds at most
  // 2 unreleased batches.
  Pair p = Connect(5 * 4096 + 100, 2, 16 * 4096);
  ASSERT_TRUE(p.region);
  EXPECT_EQ(p.sink->ring(), 5u * 4096);
  EXPECT_EQ(p.region->ring(), 5u * 4096);
  std::map<uint64_t, std::vector<uint8_t>> sent;
  auto a = Place(*p.sink, 1000, 1, Never, &sent), b = Place(*p.sink, 1000, 2, Never, &sent);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(p.region->Accept(*a, 1000).ok());
  ASSERT_TRUE(p.region->Accept(*b, 1000).ok());
  // A third waits, though the ring has room: two are unreleased.
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st;
  Place(*p.sink, 1000, 3, [&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(30); },
        &sent, &st);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  p.region->Release(*a);
  auto c = Place(*p.sink, 1000, 4, Never, &sent);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, 2u * 4096);
  // Positions wrap at the server's ring, and the client checks them against it.
  EXPECT_EQ(p.region->Accept(*c, 1000).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(p.region->Accept(5 * 4096 - 4096, 8000).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ShmRingTest, ACorruptPositionFromTheServerIsDataLossNotAWildRead) {
  Pair p = Connect(4096, 4);
  ASSERT_TRUE(p.region);
  ShmRegion& r = *p.region;
  EXPECT_EQ(r.Accept(100, 100).status().code(), absl::StatusCode::kDataLoss);        // not on a page
  EXPECT_EQ(r.Accept(0, 8192).status().code(), absl::StatusCode::kDataLoss);        // too big
  EXPECT_EQ(r.Accept(1u << 30, 10).status().code(), absl::StatusCode::kDataLoss);    // ahead
  EXPECT_EQ(r.Accept(UINT64_MAX - 4095, 10).status().code(), absl::StatusCode::kDataLoss);  // overflow
  ASSERT_TRUE(r.Accept(0, 100).ok());
  EXPECT_EQ(r.Accept(0, 100).status().code(), absl::StatusCode::kDataLoss);  // reused
}

TEST(ShmRingTest, TheRegionIsSealedAgainstAClientThatWouldShrinkIt) {
  auto sink = SharedMemorySink::Create(4 * 4096, 4, 1 << 20);
  ASSERT_TRUE(sink.ok()) << sink.status();
  absl::Status handed;
  WorkerPool server("handoff", 1, [&](int) { handed = (*sink)->Handoff(absl::Seconds(5), Never); });
  // A client of its own: connects, presents the token, takes the descriptor.
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, (*sink)->socket_path().c_str());
  ASSERT_EQ(connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(send(sock, (*sink)->token().data(), 16, 0), 16);
  const int fd = ReceiveFd(sock);
  ASSERT_GE(fd, 0);
  // The kernel refuses to shrink or grow it, or to lift the seals: the server's writes can never
  // fault.
  EXPECT_NE(ftruncate(fd, 10), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(fd, 1 << 30), 0);
  EXPECT_NE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), shm::kHeaderBytes + 4 * 4096);
  const char yes = 1;
  ASSERT_EQ(send(sock, &yes, 1, 0), 1);
  close(fd);
  close(sock);
  server.Join();
  EXPECT_TRUE(handed.ok()) << handed;
  EXPECT_TRUE((*sink)->handed_over());
}

TEST(ShmRingTest, HostilePeersAreTurnedAwayWithAReason) {
  auto sink = SharedMemorySink::Create(4096, 4, 1 << 20);
  ASSERT_TRUE(sink.ok());
  {
    absl::Status handed;
    WorkerPool server("handoff", 1, [&](int) { handed = (*sink)->Handoff(absl::Seconds(2), Never); });
    // The wrong token gets nothing, and the server keeps waiting for the right one until its
    // deadline.
    auto wrong = ShmRegion::Receive((*sink)->socket_path(), std::string(16, 'x'), 4096, UINT64_MAX);
    ASSERT_FALSE(wrong.ok());
    EXPECT_NE(wrong.status().message().find("no descriptor"), std::string::npos) << wrong.status();
    server.Join();
    EXPECT_EQ(handed.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(handed.message().find("1 peers turned away"), std::string::npos) << handed;
  }
  // A socket path the server did not make, a bad token or ring, and a ring beyond what the client
  // offered are refused before connecting.
  struct Case {
    std::string socket, token;
    uint64_t ring, max;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"/etc/passwd", std::string(16, 't'), 4096, UINT64_MAX, "not a socket Conveyor makes"},
      {"/dev/shm/conveyor-../../etc/x.sock", std::string(16, 't'), 4096, UINT64_MAX, "not a socket"},
      {"/dev/shm/conveyor-00.sock", "short", 4096, UINT64_MAX, "a token of 5 bytes"},
      {"/dev/shm/conveyor-00.sock", std::string(16, 't'), 100, UINT64_MAX, "a ring of 100"},
      {"/dev/shm/conveyor-00.sock", std::string(16, 't'), 1 << 20, 4096, "accepts 4096"},
      {"/dev/shm/conveyor-0123456789abcdef0123456789abcdef.sock", std::string(16, 't'), 4096, UINT64_MAX, "connect"},
  };
  for (const Case& c : cases) {
    auto r = ShmRegion::Receive(c.socket, c.token, c.ring, c.max);
    ASSERT_FALSE(r.ok()) << c.socket;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status();
  }
}

TEST(ShmRingTest, AClientRefusesARegionTheServerCouldStillShrink) {
  // A server of its own that hands over an unsealed memfd.
  const std::string path = "/dev/shm/conveyor-" + std::string(32, 'e') + ".sock";
  unlink(path.c_str());
  const int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(lfd, 1), 0);
  const int mfd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(mfd, 2 * 4096), 0);
  char answer = 'x';
  {
    WorkerPool server("fake", 1, [&](int) {
      const int c = accept(lfd, nullptr, nullptr);
      char token[16];
      if (recv(c, token, 16, MSG_WAITALL) != 16) return;
      SendFd(c, mfd);
      recv(c, &answer, 1, 0);
      close(c);
    });
    auto r = ShmRegion::Receive(path, std::string(16, 't'), 4096, UINT64_MAX);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("not sealed"), std::string::npos) << r.status();
  }
  EXPECT_EQ(answer, 0);  // the client told the server it did not take it
  close(mfd);
  close(lfd);
  unlink(path.c_str());
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
