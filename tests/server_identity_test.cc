// Who may connect to a server on a shared node, and who may speak for a job (issue 45, findings
// 3 to 6; docs/serving.md "Who may connect" and "Job identity"). A second local user (nobody,
// uid 65534, through setpriv; the tests run as root) stands in for a neighbour on the node.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "server/internal/job_identity.h"
#include "server/internal/peer_identity.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::Capture;
using testing::ServerProcess;
using testing::ShellCommand;
using testing::TempDir;
namespace pb = ::conveyor::v1;
using server_internal::JobRegistry;

const std::string kCli = CONVEYOR_CLI;

// Low-dim only: cheap streams. 400 samples an epoch, 25 global batches of 16.
constexpr char kConfig[] = R"(anchor: action
streams:
  observation.state:
    delta_timestamps: [0.0]
  action:
    delta_timestamps: {start: 0.0, step: 0.02, count: 50}
pipeline:
  global_batch_size: 16
  seed: 5
)";

// The neighbour: runs `args` as uid/gid 65534 with no supplementary groups.
std::string AsNobody(const std::vector<std::string>& args) {
  std::vector<std::string> cmd = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return "{ " + ShellCommand(cmd) + " 2>&1; }";  // its errors are what the tests check
}

class ServerIdentityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // The neighbour must reach the unix sockets made under it.
    ASSERT_EQ(chmod(dir_->path().c_str(), 0755), 0);
    ASSERT_SH(ShellCommand({kCli, "synth", "--out", ds(), "--episodes", "4", "--episode-seconds", "2", "--quiet"}));
    testing::WriteFile(config(), kConfig);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string ds() { return dir_->Join("ds"); }
  static std::string config() { return dir_->Join("lowdim.yaml"); }

  static std::unique_ptr<ServerProcess> Serve(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {ds(), "--config", config(), "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto s = std::make_unique<ServerProcess>(kCli, args, dir_->path(), 60);
    EXPECT_TRUE(s->ok()) << s->log();
    return s;
  }

  static client::ClientOptions Options(const std::string& address, const std::string& job = "default") {
    client::ClientOptions o;
    o.servers = {address};
    o.job = job;
    o.reconnect_timeout_s = 5;
    o.report_interval_s = 0;
    return o;
  }

  static TempDir* dir_;
};
TempDir* ServerIdentityTest::dir_ = nullptr;

// Finding 4: the default loopback server admitted every local user. Now its own user is served
// without ceremony and another uid is refused, naming itself and how an operator admits it.
TEST_F(ServerIdentityTest, LoopbackAdmitsItsOwnUserAndRefusesAnother) {
  auto server = Serve();
  ASSERT_TRUE(server->ok());
  client::ClientOptions o = Options(server->address());
  o.max_batches = 2;
  auto c = client::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::optional<client::Batch>> b = (*c)->Next();
  ASSERT_TRUE(b.ok() && b->has_value()) << b.status() << server->log();
  EXPECT_TRUE(client::GetInfo(o).ok());

  int code = 0;
  const std::string refused = Capture(AsNobody({kCli, "fetch", "--servers", server->address(), "--info"}), &code);
  EXPECT_NE(code, 0) << refused;
  EXPECT_NE(refused.find("local user uid 65534 (nobody) may not use this server"), std::string::npos) << refused;
  const std::string streamed =
      Capture(AsNobody({kCli, "fetch", "--servers", server->address(), "--steps", "1", "--reconnect-timeout", "3"}), &code);
  EXPECT_NE(code, 0) << streamed;
  EXPECT_NE(streamed.find("local user uid 65534 (nobody) may not use this server"), std::string::npos) << streamed;

  // The operator admits the neighbour by uid; or opens loopback to everyone, loudly.
  auto allowing = Serve({"--allow-uid", "nobody"});
  ASSERT_TRUE(allowing->ok());
  // The server's region socket is its own user's, which the neighbour cannot open: the server
  // offers none and says why (the client no longer waits for a socket it cannot open).
  const std::string admitted =
      Capture(AsNobody({kCli, "fetch", "--servers", allowing->address(), "--steps", "1", "--stats"}), &code);
  EXPECT_EQ(code, 0) << admitted << allowing->log();
  EXPECT_NE(admitted.find("shared memory refused: the client runs as local user uid 65534 (nobody)"),
            std::string::npos) << admitted;
  auto open = Serve({"--loopback-open"});
  ASSERT_TRUE(open->ok());
  EXPECT_NE(open->log().find("WARNING: --loopback-open"), std::string::npos) << open->log();
  Capture(AsNobody({kCli, "fetch", "--servers", open->address(), "--info"}), &code);
  EXPECT_EQ(code, 0);
}

// Finding 4: a unix: listen socket followed the umask (under umask 002 group members connected).
TEST_F(ServerIdentityTest, UnixSocketIsPrivateWhateverTheUmask) {
  const mode_t before = umask(002);
  const std::string path = dir_->Join("conveyor.sock");
  auto server = Serve({"--listen", "unix:" + path});
  umask(before);
  ASSERT_TRUE(server->ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  int code = 0;
  const std::string out = Capture(AsNobody({kCli, "fetch", "--servers", "unix:" + path, "--info"}), &code);
  EXPECT_NE(code, 0) << out;
  server.reset();

  // An explicit group: 0660 and that group, whose members connect.
  umask(002);
  const std::string grouped = dir_->Join("grouped.sock");
  auto shared = Serve({"--listen", "unix:" + grouped, "--allow-group", "65534"});
  umask(before);
  ASSERT_TRUE(shared->ok());
  ASSERT_EQ(stat(grouped.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, 65534u);
  const std::string info = Capture(AsNobody({kCli, "fetch", "--servers", "unix:" + grouped, "--info"}), &code);
  EXPECT_EQ(code, 0) << info << shared->log();
}

// The local-user flags where they would choose nothing are refused, not ignored.
TEST_F(ServerIdentityTest, LocalUserFlagsAreRefusedWhereTheyChooseNothing) {
  const std::string token = dir_->Join("flags-token");
  testing::WriteFile(token, "0123456789abcdef0123456789abcdef\n");
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--auth-token-file", token, "--allow-uid", "65534"},
        std::vector<std::string>{"--listen", "0.0.0.0:0", "--auth-token-file", token, "--insecure-plaintext-token",
                                 "--loopback-open"}}) {
    std::vector<std::string> args = {ds(), "--config", config()};
    args.insert(args.end(), extra.begin(), extra.end());
    ServerProcess s(kCli, args, dir_->path(), 30);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.Stop(SIGKILL), 2);  // INVALID_ARGUMENT: a usage error
    EXPECT_NE(s.log().find("choose the local users of a loopback listener"), std::string::npos) << s.log();
  }
}

// Finding 3: a bearer token alone opened a non-loopback listener and travelled in cleartext.
TEST_F(ServerIdentityTest, TokenBeyondLoopbackNeedsTlsOrALoudOptOut) {
  const std::string token = dir_->Join("token");
  testing::WriteFile(token, "0123456789abcdef0123456789abcdef\n");
  ServerProcess plaintext(kCli, {ds(), "--config", config(), "--listen", "0.0.0.0:0", "--auth-token-file", token},
                          dir_->path(), 30);
  EXPECT_FALSE(plaintext.ok());
  EXPECT_EQ(plaintext.Stop(SIGKILL), 1);
  EXPECT_NE(plaintext.log().find("with a bearer token but without TLS"), std::string::npos) << plaintext.log();

  auto opted_out = Serve({"--listen", "0.0.0.0:0", "--auth-token-file", token, "--insecure-plaintext-token"});
  ASSERT_TRUE(opted_out->ok());
  EXPECT_NE(opted_out->log().find("WARNING: --insecure-plaintext-token"), std::string::npos) << opted_out->log();
  EXPECT_NE(opted_out->log().find("bearer token WITHOUT TLS"), std::string::npos) << opted_out->log();

  const std::string d = dir_->Join("pki");
  ASSERT_SH("mkdir -p " + d + " && cd " + d + R"( &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout server.key -out server.pem -days 2 -subj /CN=localhost \
      -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null)");
  auto tls = Serve({"--listen", "0.0.0.0:0", "--auth-token-file", token, "--tls-cert", d + "/server.pem", "--tls-key",
                    d + "/server.key"});
  ASSERT_TRUE(tls->ok());
  client::ClientOptions o = Options("127.0.0.1:" + tls->address().substr(tls->address().rfind(':') + 1));
  o.tls = true;
  o.tls_ca_pem = testing::ReadFile(d + "/server.pem");
  o.auth_token = "0123456789abcdef0123456789abcdef";
  EXPECT_TRUE(client::GetInfo(o).ok()) << tls->log();
}

// Sends `req` as it is and reads up to `reads` messages; the call's status.
grpc::Status RawStream(const std::string& address, const pb::StreamBatchesRequest& req, int reads = 1) {
  auto stub = pb::Conveyor::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub->StreamBatches(&ctx, req);
  pb::StreamBatchesResponse msg;
  int n = 0;
  while (n < reads && reader->Read(&msg)) ++n;
  if (n == reads) ctx.TryCancel();
  return reader->Finish();
}

// Finding 6: every same-host client shared one per-peer limit, keyed by 127.0.0.1. Now it is
// keyed by the local user: a neighbour's streams do not take this user's slots, nor the reverse.
TEST_F(ServerIdentityTest, PerPeerLimitCountsEachLocalUser) {
  auto server = Serve({"--max-streams-per-peer", "1", "--allow-uid", "65534"});
  ASSERT_TRUE(server->ok());
  client::ClientOptions o = Options(server->address());
  auto held = client::Client::Create(o);  // root's one stream, held open
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE((*held)->Next().ok()) << server->log();

  int code = 0;
  const std::string nobody = Capture(AsNobody({kCli, "fetch", "--servers", server->address(), "--steps", "2",
                                               "--reconnect-timeout", "5", "--shared-memory", "false"}),
                                     &code);
  EXPECT_EQ(code, 0) << nobody << server->log();

  pb::StreamBatchesRequest req;
  req.set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
  req.set_consumers(1);
  const grpc::Status second = RawStream(server->address(), req);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();
  EXPECT_NE(second.error_message().find("client local user uid 0 (root) already has 1 streams open"),
            std::string::npos)
      << second.error_message();
}

// Finding 5: another client streaming a job's missing rank under its name turned `conveyor
// audit` from NOT EXACT to EXACT. With a job secret, the stranger is refused and counted, and
// the audit stays NOT EXACT until the job's own rank streams.
TEST_F(ServerIdentityTest, AStrangerWithoutTheJobSecretCannotCompleteItsLedger) {
  auto server = Serve({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(server->ok());
  absl::StatusOr<pb::InfoResponse> info = client::GetInfo(Options(server->address()));
  ASSERT_TRUE(info.ok());
  const uint64_t steps = info->configs(0).steps_per_epoch();
  ASSERT_GT(steps, 0u);
  auto rank = [&](uint32_t consumer, const std::string& secret) {
    client::ClientOptions o = Options(server->address(), "trainer");
    o.consumer = consumer;
    o.consumers = 2;
    o.max_batches = steps;
    o.job_secret = secret;
    auto c = client::Client::Create(o);
    if (!c.ok()) return c.status();
    for (;;) {
      absl::StatusOr<std::optional<client::Batch>> b = (*c)->Next();
      if (!b.ok()) return b.status();
      if (!b->has_value()) return absl::OkStatus();
    }
  };
  auto audit = [&](int* code) {
    return Capture(ShellCommand({kCli, "audit", ds(), "--config", config(), "--servers", server->address(), "--job",
                                 "trainer", "--epoch", "0"}),
                   code);
  };
  const std::string secret = "job-secret-0123456789";
  ASSERT_TRUE(rank(0, secret).ok()) << server->log();
  int code = 0;
  std::string report = audit(&code);
  EXPECT_NE(code, 0) << report;
  EXPECT_NE(report.find("NOT EXACT"), std::string::npos) << report;

  for (const std::string& wrong : {std::string(), std::string("guessed-secret-0000")}) {
    const absl::Status s = rank(1, wrong);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find("job 'trainer' is held on this server by clients with another job secret"),
              std::string::npos)
        << s;
  }
  report = audit(&code);
  EXPECT_NE(code, 0) << report;
  EXPECT_NE(report.find("NOT EXACT"), std::string::npos) << "a stranger completed the job's ledger: " << report;
  const std::string metrics = Capture("curl -sf http://" + server->metrics_address() + "/metrics", &code);
  EXPECT_NE(metrics.find("conveyor_requests_rejected_total{code=\"PERMISSION_DENIED\",reason=\"job_secret\"} 2"),
            std::string::npos)
      << metrics;

  // The job's own rank, with the secret from its launcher's environment.
  setenv("CONVEYOR_JOB_SECRET", secret.c_str(), 1);
  const absl::Status own = rank(1, "");
  unsetenv("CONVEYOR_JOB_SECRET");
  ASSERT_TRUE(own.ok()) << own;
  report = audit(&code);
  EXPECT_EQ(code, 0) << report;
  EXPECT_NE(report.find("EXACT, 400 samples delivered, 400 expected"), std::string::npos) << report;
}

// Reports of `jobs` names, one each: the cheapest call that takes a job slot.
void Report(const std::string& address, const std::vector<std::string>& jobs) {
  auto stub = pb::Conveyor::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  for (const std::string& job : jobs) {
    grpc::ClientContext ctx;
    pb::ReportRequest req;
    req.set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
    req.set_job(job);
    req.set_steps(1);
    req.set_step_seconds(0.1);
    req.set_consumers(1);
    pb::ReportResponse resp;
    const grpc::Status s = stub->Report(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << job << ": " << s.error_message();
  }
}

// Finding 5: filling the 256 job-name slots sent a real job's metrics into "_other" until the
// server restarted. Slots of jobs idle for --job-idle-seconds now go to new jobs.
TEST_F(ServerIdentityTest, IdleJobSlotsAreReclaimed) {
  std::vector<std::string> fillers;
  for (int i = 0; i < 256; ++i) fillers.push_back("filler-" + std::to_string(i));
  int code = 0;
  {
    auto server = Serve({"--metrics-listen", "127.0.0.1:0"});  // idle: 600 s
    ASSERT_TRUE(server->ok());
    Report(server->address(), fillers);
    Report(server->address(), {"real"});
    const std::string metrics = Capture("curl -sf http://" + server->metrics_address() + "/metrics", &code);
    EXPECT_EQ(metrics.find("job=\"real\""), std::string::npos) << "slots not full?";
    EXPECT_NE(metrics.find("conveyor_client_steps_total{job=\"_other\"} 1"), std::string::npos) << metrics;
  }
  auto server = Serve({"--metrics-listen", "127.0.0.1:0", "--job-idle-seconds", "1"});
  ASSERT_TRUE(server->ok());
  Report(server->address(), fillers);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  Report(server->address(), {"real"});
  const std::string metrics = Capture("curl -sf http://" + server->metrics_address() + "/metrics", &code);
  EXPECT_NE(metrics.find("conveyor_client_steps_total{job=\"real\"} 1"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("job=\"_other\""), std::string::npos) << metrics;
  // The slot idle longest was filler-0's: its series are gone, the others' stay.
  EXPECT_EQ(metrics.find("job=\"filler-0\""), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("conveyor_client_steps_total{job=\"filler-1\"} 1"), std::string::npos) << metrics;
}

// The registry alone, on a clock of its own.
TEST(JobRegistryTest, SecretsSlotsAndReclaim) {
  using Clock = JobRegistry::Clock;
  const Clock::time_point t0{};
  JobRegistry jobs(2, std::chrono::seconds(10));
  ASSERT_EQ(jobs.Enter("a", "s1", /*stream=*/true, t0)->label, "a");
  EXPECT_EQ(jobs.Enter("a", "s1", false, t0)->label, "a");
  absl::StatusOr<JobRegistry::Claim> wrong = jobs.Enter("a", "s2", false, t0);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(jobs.Enter("a", "", false, t0).status().code(), absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(jobs.Enter("b", "", false, t0)->label, "b");
  EXPECT_EQ(jobs.Enter("b", "s", false, t0).status().code(), absl::StatusCode::kPermissionDenied)
      << "a job started without a secret cannot be taken over with one";
  // Full: a new name shares "_other" while no slot is idle.
  EXPECT_EQ(jobs.Enter("c", "", false, t0 + std::chrono::seconds(5))->label, JobRegistry::kOverflowLabel);
  // b idles for 10 s; a still has its stream open, so only b's slot can go.
  absl::StatusOr<JobRegistry::Claim> c = jobs.Enter("c", "", false, t0 + std::chrono::seconds(11));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->label, "c");
  EXPECT_EQ(c->reclaimed, "b");
  EXPECT_EQ(jobs.Enter("d", "", false, t0 + std::chrono::seconds(15))->label, JobRegistry::kOverflowLabel);
  jobs.Release("a", t0 + std::chrono::seconds(30));
  absl::StatusOr<JobRegistry::Claim> d = jobs.Enter("d", "", false, t0 + std::chrono::seconds(41));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->reclaimed, "c") << "c was idle longest (since 11 s), a only since 30 s";
  // A reclaimed job comes back as a new job: its old secret went with its slot.
  EXPECT_EQ(jobs.Enter("b", "s", false, t0 + std::chrono::seconds(60))->reclaimed, "a");
  // A job that ended frees its name for a new job of another secret, which starts afresh; one
  // still running (or quiet for less than `idle`) does not.
  EXPECT_EQ(jobs.Enter("b", "t", true, t0 + std::chrono::seconds(65)).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<JobRegistry::Claim> again = jobs.Enter("b", "t", true, t0 + std::chrono::seconds(70));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->label, "b");
  EXPECT_EQ(again->reclaimed, "b");
  EXPECT_EQ(jobs.Enter("b", "s", false, t0 + std::chrono::seconds(200)).status().code(),
            absl::StatusCode::kPermissionDenied)
      << "b's new job has a stream open";
}

// The socket table lookup itself: this process's own connection, over IPv4 and IPv6, with the
// server's address given and as a wildcard; a peer that is not a connection here is not found.
TEST(LocalPeerUidTest, FindsTheUidOfASameHostConnection) {
  for (const int family : {AF_INET, AF_INET6}) {
    const int listener = socket(family, SOCK_STREAM, 0);
    ASSERT_GE(listener, 0);
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(sockaddr_in);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      len = sizeof(sockaddr_in6);
    }
    ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0) << family;
    ASSERT_EQ(listen(listener, 1), 0);
    ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const int client = socket(family, SOCK_STREAM, 0);
    ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), len), 0);
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    ASSERT_EQ(getsockname(client, reinterpret_cast<sockaddr*>(&local), &local_len), 0);
    uint16_t server_port = 0, client_port = 0;
    std::string peer, host, wildcard;
    if (family == AF_INET) {
      server_port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
      client_port = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
      peer = "ipv4:127.0.0.1:" + std::to_string(client_port);
      host = "127.0.0.1";
      wildcard = "0.0.0.0";
    } else {
      server_port = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
      client_port = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
      peer = "ipv6:%5B::1%5D:" + std::to_string(client_port);
      host = "[::1]";
      wildcard = "[::]";
    }
    EXPECT_EQ(server_internal::LocalPeerUid(peer, host, server_port), std::optional<uid_t>(geteuid())) << peer;
    EXPECT_EQ(server_internal::LocalPeerUid(peer, wildcard, server_port), std::optional<uid_t>(geteuid())) << peer;
    EXPECT_EQ(server_internal::LocalPeerUid(peer, host, static_cast<uint16_t>(server_port + 1)), std::nullopt);
    EXPECT_EQ(server_internal::LocalPeerUid("unix:/tmp/x", host, server_port), std::nullopt);
    // The /proc/net fallback (kernels without TCP's sock_diag) finds the same socket.
    EXPECT_EQ(server_internal::LocalPeerUidFromProc(peer, host, server_port), std::optional<uid_t>(geteuid())) << peer;
    EXPECT_EQ(server_internal::LocalPeerUidFromProc(peer, wildcard, server_port), std::optional<uid_t>(geteuid())) << peer;
    EXPECT_EQ(server_internal::LocalPeerUidFromProc(peer, host, static_cast<uint16_t>(server_port + 1)), std::nullopt);
    if (family == AF_INET) {
      // gRPC's clients connect to an IPv4 address from a dual-stack IPv6 socket: the kernel
      // answers about it as ::ffff:127.0.0.1, the server sees ipv4:127.0.0.1.
      const int dual = socket(AF_INET6, SOCK_STREAM, 0);
      sockaddr_in6 mapped{};
      mapped.sin6_family = AF_INET6;
      mapped.sin6_port = htons(server_port);
      ASSERT_EQ(inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped.sin6_addr), 1);
      ASSERT_EQ(connect(dual, reinterpret_cast<sockaddr*>(&mapped), sizeof(mapped)), 0);
      sockaddr_in6 dual_local{};
      socklen_t dual_len = sizeof(dual_local);
      ASSERT_EQ(getsockname(dual, reinterpret_cast<sockaddr*>(&dual_local), &dual_len), 0);
      const std::string dual_peer = "ipv4:127.0.0.1:" + std::to_string(ntohs(dual_local.sin6_port));
      EXPECT_EQ(server_internal::LocalPeerUid(dual_peer, host, server_port), std::optional<uid_t>(geteuid()));
      EXPECT_EQ(server_internal::LocalPeerUidFromProc(dual_peer, host, server_port), std::optional<uid_t>(geteuid()));
      close(dual);
    }
    close(client);
    close(listener);
  }
  EXPECT_TRUE(server_internal::LocalUserAllowed(geteuid(), {}));
  EXPECT_FALSE(server_internal::LocalUserAllowed(65534, {}));
  EXPECT_TRUE(server_internal::LocalUserAllowed(65534, {.uids = {65534}, .gids = {}}));
  EXPECT_TRUE(server_internal::LocalUserAllowed(65534, {.uids = {}, .gids = {65534}})) << "nobody's primary group";
}

}  // namespace
}  // namespace conveyor
