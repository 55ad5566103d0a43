// No client mix can starve a server (issue 45, item 2), and the smaller findings of its item 7,
// against real `conveyor serve` processes:
// - nine clients asking for 8 stripe streams each at default settings leave Info, health and a new
//   stream working (stripes come from a pool of their own; the handler quota covers both pools);
// - health says NOT_SERVING exactly while the server cannot take a stream;
// - a client that stops taking batches is ended by --stream-progress-timeout, counted in
//   conveyor_streams_stalled_total, and its slot serves the next client;
// - --metrics-listen PORT binds loopback; --ready-file is not written through a planted link;
//   --listen unix:PATH is reported as that path; SIGHUP drains; a dataset URL's credentials are
//   not printed by serve or check nor left in serve's argv; clients trim token files as the server
//   does.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "tests/support/nginx_server.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::Capture;
using testing::ServerProcess;
using testing::ShellCommand;
using testing::TempDir;
namespace pb = ::conveyor::v1;

const std::string kCli = CONVEYOR_CLI;

constexpr char kConfig[] = R"(anchor: action
streams:
  cam0:
    delta_timestamps: [0.0]
    size: [64, 64]
  action:
    delta_timestamps: {start: 0.0, step: 0.02, count: 10}
pipeline:
  global_batch_size: 32
  seed: 3
  queue_bytes: 16777216
)";

std::chrono::system_clock::time_point In(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

// The server's gRPC health (grpc.health.v1, overall): 1 SERVING, 2 NOT_SERVING, -1 no answer.
int Health(const std::string& address) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10));
  grpc::CompletionQueue cq;
  grpc::Slice empty("", 0);
  const grpc::ByteBuffer request(&empty, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok || !status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = N}: field 1, varint.
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
}

grpc::Status Info(const std::string& address) {
  auto stub = pb::Conveyor::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(20));
  pb::InfoRequest req;
  pb::InfoResponse resp;
  return stub->Info(&ctx, req, &resp);
}

pb::StreamBatchesRequest Request(uint32_t payload_streams = 0) {
  pb::StreamBatchesRequest r;
  r.set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
  r.set_job("capacity");
  r.set_consumers(1);
  if (payload_streams > 0) r.set_payload_streams(payload_streams);
  return r;
}

// A new stream that reads `reads` messages, then cancels.
grpc::Status NewStream(const std::string& address, int reads = 3) {
  auto stub = pb::Conveyor::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(60));
  auto reader = stub->StreamBatches(&ctx, Request());
  pb::StreamBatchesResponse msg;
  int n = 0;
  while (n < reads && reader->Read(&msg)) ++n;
  if (n == reads) {
    ctx.TryCancel();
    return grpc::Status::OK;
  }
  return reader->Finish();
}

// A client that opens a stream with striped payloads, joins every stripe it is granted, and then
// reads nothing more: each of its calls holds a handler thread of the server.
struct StripedClient {
  std::unique_ptr<pb::Conveyor::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<pb::StreamBatchesResponse>> reader;
  uint32_t granted = 0;
  std::vector<std::unique_ptr<grpc::ClientContext>> stripe_ctx;
  std::vector<std::unique_ptr<grpc::ClientReader<pb::StreamBatchesResponse>>> stripes;

  // False when the stream did not start. `small_window`: no BDP probing, so the connection's
  // flow-control window stays at 64 KiB and a client that stops reading stops the server's writes
  // at once (with probing the window grows to megabytes, which a slow test server takes long to fill).
  bool Start(const std::string& address, uint32_t payload_streams, bool small_window = false) {
    grpc::ChannelArguments args;
    if (small_window) args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    stub = pb::Conveyor::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    reader = stub->StreamBatches(&ctx, Request(payload_streams));
    pb::StreamBatchesResponse first;
    if (!reader->Read(&first) || !first.has_start()) return false;
    granted = first.start().payload_streams();
    for (uint32_t i = 0; i < granted; ++i) {
      pb::StreamBatchesRequest join;
      join.set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
      join.set_stripe_token(first.start().stripe_token());
      join.set_stripe_index(i);
      stripe_ctx.push_back(std::make_unique<grpc::ClientContext>());
      stripes.push_back(stub->StreamBatches(stripe_ctx.back().get(), join));
    }
    return true;
  }
  ~StripedClient() {
    for (auto& c : stripe_ctx) c->TryCancel();
    ctx.TryCancel();
  }
};

// The metrics text of a server.
std::string Metrics(const ServerProcess& server) {
  int code = 0;
  return Capture("curl -sf http://" + server.metrics_address() + "/metrics", &code);
}

class ServerCapacityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_SH(ShellCommand({kCli, "synth", "--out", dir_.Join("ds"), "--episodes", "4", "--episode-seconds", "2",
                            "--quiet"}));
    testing::WriteFile(dir_.Join("c.yaml"), kConfig);
  }
  std::vector<std::string> Args(std::vector<std::string> more = {}) {
    std::vector<std::string> a = {dir_.Join("ds"), "--config", dir_.Join("c.yaml"), "--threads", "1"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
  TempDir dir_;
};

TEST_F(ServerCapacityTest, NineStripedClientsAtDefaultsLeaveInfoHealthAndANewStreamWorking) {
  ServerProcess server(kCli, Args(), dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  // The issue's mix: 9 streams asking for 8 stripes each (81 calls; the old quota was 80).
  std::vector<std::unique_ptr<StripedClient>> clients;
  uint32_t stripes = 0;
  for (int i = 0; i < 9; ++i) {
    clients.push_back(std::make_unique<StripedClient>());
    ASSERT_TRUE(clients.back()->Start(server.address(), 8)) << "client " << i << "\n" << server.log();
    stripes += clients.back()->granted;
  }
  // The stripe pool is --max-streams (64) calls: 8 streams got 8, the ninth none.
  EXPECT_EQ(stripes, 64u);
  EXPECT_EQ(clients[8]->granted, 0u);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // every stripe joined and blocked on its client
  const grpc::Status info = Info(server.address());
  EXPECT_TRUE(info.ok()) << info.error_code() << " " << info.error_message();
  EXPECT_EQ(Health(server.address()), 1);
  const grpc::Status fresh = NewStream(server.address());
  EXPECT_TRUE(fresh.ok()) << fresh.error_code() << " " << fresh.error_message() << "\n" << server.log();
  // One more striped client still gets its stream (its payloads on the stream itself).
  StripedClient tenth;
  EXPECT_TRUE(tenth.Start(server.address(), 8));
  EXPECT_EQ(tenth.granted, 0u);
  clients.clear();
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
}

TEST_F(ServerCapacityTest, HealthIsNotServingExactlyWhileTheServerCannotTakeAStream) {
  ServerProcess server(kCli, Args({"--max-streams", "2"}), dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_EQ(Health(server.address()), 1);
  auto a = std::make_unique<StripedClient>();
  ASSERT_TRUE(a->Start(server.address(), 0));
  EXPECT_EQ(Health(server.address()), 1);
  auto b = std::make_unique<StripedClient>();
  ASSERT_TRUE(b->Start(server.address(), 0));
  EXPECT_EQ(Health(server.address()), 2) << "full, yet SERVING";
  const grpc::Status refused = NewStream(server.address());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_TRUE(Info(server.address()).ok());
  b.reset();  // a stream ends: SERVING again
  bool serving = false;
  for (int i = 0; i < 200 && !serving; ++i) {
    serving = Health(server.address()) == 1;
    if (!serving) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(serving);
}

TEST_F(ServerCapacityTest, AClientThatStopsTakingBatchesIsEndedCountedAndItsSlotServesTheNext) {
  // A plain stream on a server of one stream slot, then a striped one on a server whose stripe
  // pool holds exactly its 4 stripes: after the stalled client is ended, the next client gets the
  // slot (and the 4 stripes) again.
  for (uint32_t stripes : {0u, 4u}) {
    SCOPED_TRACE(stripes == 0 ? "plain stream" : "striped stream");
    ServerProcess server(kCli,
                         Args({"--max-streams", stripes == 0 ? "1" : "4", "--stream-progress-timeout", "1",
                               "--metrics-listen", "127.0.0.1:0"}),
                         dir_.path());
    ASSERT_TRUE(server.ok()) << server.log();
    {
      // Reads the stream start, then nothing: the server's writes fill the connection and block.
      StripedClient stalled;
      ASSERT_TRUE(stalled.Start(server.address(), stripes, /*small_window=*/true)) << server.log();
      ASSERT_EQ(stalled.granted, stripes);
      // The server ends it after the timeout; reading then drains what was buffered and ends.
      std::this_thread::sleep_for(std::chrono::seconds(4));
      pb::StreamBatchesResponse msg;
      const auto t0 = std::chrono::steady_clock::now();
      while (stalled.reader->Read(&msg)) {
        ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30))
            << "the stream was not ended\n" << server.log() << Metrics(server);
      }
      EXPECT_FALSE(stalled.reader->Finish().ok());
    }
    // Its slot serves the next client (the slot is freed a moment after the stream ends).
    uint32_t granted = 0;
    bool started = false;
    for (int i = 0; i < 100 && !(started && granted == stripes); ++i) {
      StripedClient next;
      started = next.Start(server.address(), stripes);
      granted = next.granted;
      if (!(started && granted == stripes)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(started) << server.log();
    EXPECT_EQ(granted, stripes);
    const std::string metrics = Metrics(server);
    const size_t at = metrics.find("\nconveyor_streams_stalled_total ");
    ASSERT_NE(at, std::string::npos) << metrics;
    EXPECT_GE(std::stod(metrics.substr(at + 32)), 1.0) << metrics.substr(at, 60);
    if (stripes == 0) EXPECT_NE(metrics.find("conveyor_streams_total{outcome=\"stalled\"}"), std::string::npos);
  }
}

// A trainer that stops taking batches for longer than the progress timeout (a checkpoint, an
// evaluation) is ended by the server, and its client reconnects when it asks again: the batches
// are exactly those of a client that never paused.
TEST_F(ServerCapacityTest, AClientThatPausesPastTheProgressTimeoutContinuesExactly) {
  ServerProcess server(kCli, Args({"--stream-progress-timeout", "1", "--metrics-listen", "127.0.0.1:0"}),
                       dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  auto read = [&](const std::string& job, bool pause, uint64_t* reconnects) {
    client::ClientOptions o;
    o.servers = {server.address()};
    o.job = job;
    o.max_batches = 12;
    o.reconnect_timeout_s = 2;  // shorter than the pause: the pause must not count against it
    o.shared_memory = false;     // payloads in messages, so the server's writes block
    // Batches of 6 MB: the client's queue and the connection's windows fill within the pause.
    o.config_yaml = std::string(kConfig).replace(std::string(kConfig).find("[64, 64]"), 8, "[256, 256]");
    o.prefetch_batches = 1;
    auto c = client::Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    std::vector<std::string> got;
    for (;;) {
      absl::StatusOr<std::optional<client::Batch>> next = (*c)->Next();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) break;
      std::string line = (**next).cursor.ToString();
      for (const client::TensorView& t : (**next).tensors) {
        line += " " + std::to_string(std::hash<std::string_view>()(
                          std::string_view(reinterpret_cast<const char*>(t.data), t.bytes)));
      }
      got.push_back(line);
      if (pause && got.size() == 2) std::this_thread::sleep_for(std::chrono::seconds(8));
    }
    *reconnects = (*c)->stats().reconnects;
    return got;
  };
  uint64_t paused_reconnects = 0, straight_reconnects = 0;
  const std::vector<std::string> paused = read("paused", true, &paused_reconnects);
  const std::vector<std::string> straight = read("straight", false, &straight_reconnects);
  ASSERT_EQ(straight.size(), 12u);
  EXPECT_EQ(paused, straight);
  EXPECT_GE(paused_reconnects, 1u) << "the server did not end the paused stream";
  EXPECT_EQ(straight_reconnects, 0u);
  const std::string metrics = Metrics(server);
  const size_t at = metrics.find("\nconveyor_streams_stalled_total ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(std::stod(metrics.substr(at + 32)), 1.0);
}

// /proc/net/tcp's listening sockets on `port`: their local addresses (hex, e.g. 0100007F).
std::vector<std::string> ListeningAddresses(int port) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);
    while (std::getline(f, line)) {
      std::istringstream s(line);
      std::string slot, local, remote, state;
      s >> slot >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state == "0A" && std::stoi(local.substr(colon + 1), nullptr, 16) == port) out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

TEST_F(ServerCapacityTest, AMetricsPortAloneBindsLoopback) {
  ServerProcess server(kCli, Args({"--metrics-listen", "0"}), dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  ASSERT_EQ(server.metrics_address().rfind("127.0.0.1:", 0), 0u) << server.metrics_address();
  const int port = std::stoi(server.metrics_address().substr(10));
  const std::vector<std::string> bound = ListeningAddresses(port);
  ASSERT_FALSE(bound.empty());
  for (const std::string& a : bound) EXPECT_EQ(a, "0100007F") << "metrics listen on " << a << ", not 127.0.0.1";
  EXPECT_FALSE(Metrics(server).empty());
}

TEST_F(ServerCapacityTest, TheReadyFileIsNotWrittenThroughAPlantedLink) {
  // The old server wrote READY through READY.tmp, opened with O_TRUNC, following a link another
  // user planted there.
  const std::string victim = dir_.Join("victim"), ready = dir_.Join("ready");
  testing::WriteFile(victim, "precious");
  ASSERT_EQ(::symlink(victim.c_str(), (ready + ".tmp").c_str()), 0);
  std::vector<std::string> argv = {kCli, "serve"};
  for (const std::string& a : Args({"--listen", "127.0.0.1:0", "--ready-file", ready})) argv.push_back(a);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(kCli.c_str(), cargv.data());
    ::_exit(127);
  }
  struct stat st {};
  bool up = false;
  for (int i = 0; i < 600 && !up; ++i) {
    up = ::lstat(ready.c_str(), &st) == 0;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(up) << "the server did not write its ready file";
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(testing::ReadFile(victim), "precious");
  EXPECT_EQ(testing::ReadFile(ready).rfind("127.0.0.1:", 0), 0u);
}

TEST_F(ServerCapacityTest, AUnixSocketIsReportedByItsPathAndSighupDrains) {
  const std::string socket = "unix:" + dir_.Join("conveyor.sock");
  ServerProcess server(kCli, Args({"--listen", socket}), dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_EQ(server.address(), socket);
  EXPECT_TRUE(Info(server.address()).ok());
  EXPECT_EQ(server.Stop(SIGHUP), 0) << server.log();
  EXPECT_NE(server.log().find("SIGHUP: draining"), std::string::npos) << server.log();
}

TEST_F(ServerCapacityTest, ADatasetUrlsCredentialsAreNotPrinted) {
  auto nginx = testing::NginxServer::Start(dir_.path());
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  const std::string url = "http://conveyor:s3cr3t-pass@127.0.0.1:" + std::to_string((*nginx)->port()) + "/ds";
  ServerProcess server(kCli, {url, "--config", dir_.Join("c.yaml"), "--threads", "1"}, dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_NE(server.log().find("serving http://***@127.0.0.1"), std::string::npos) << server.log();
  EXPECT_EQ(server.log().find("s3cr3t"), std::string::npos) << server.log();
  // Nor left in its argv, which every local user reads.
  const std::string cmdline = testing::ReadFile("/proc/" + std::to_string(server.pid()) + "/cmdline");
  EXPECT_NE(cmdline.find("127.0.0.1"), std::string::npos);
  EXPECT_EQ(cmdline.find("s3cr3t"), std::string::npos) << cmdline;
  int code = 0;
  const std::string check = Capture(ShellCommand({kCli, "check", url, "--json"}) + " 2>&1", &code);
  EXPECT_NE(check.find("***@127.0.0.1"), std::string::npos) << check;
  EXPECT_EQ(check.find("s3cr3t"), std::string::npos) << check;
  const std::string summary = Capture(ShellCommand({kCli, "check", url}) + " 2>&1", &code);
  EXPECT_NE(summary.find("check: http://***@127.0.0.1"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("s3cr3t"), std::string::npos) << summary;
}

TEST_F(ServerCapacityTest, ClientsTrimTokenFilesAsTheServerDoes) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  testing::WriteFile(dir_.Join("server-token"), token + "\n");
  // The same token as an editor or a secret store may leave it: leading blanks and CRLF.
  testing::WriteFile(dir_.Join("client-token"), "  " + token + "\r\n");
  ServerProcess server(kCli, Args({"--auth-token-file", dir_.Join("server-token")}), dir_.path());
  ASSERT_TRUE(server.ok()) << server.log();
  int code = 0;
  const std::string info = Capture(ShellCommand({kCli, "fetch", "--servers", server.address(), "--info",
                                                 "--auth-token-file", dir_.Join("client-token")}) +
                                       " 2>&1",
                                   &code);
  EXPECT_EQ(code, 0) << info;
}

}  // namespace
}  // namespace conveyor
