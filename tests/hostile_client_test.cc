// A hostile or careless client against a real `conveyor serve` (issue: nothing a client sends can
// crash a server or push it past its memory budget). Every request below is malformed or
// abusive; each must get a clear status naming what is wrong, while one well-behaved consumer
// streams alongside and still receives exactly what `conveyor batches` computes. At the end the
// server is alive, its resident memory stayed under its configured budget plus a stated margin,
// and its file descriptors and threads are back at their baseline.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::Capture;
using testing::ServerProcess;
using testing::ShellQuote;
using testing::TempDir;
namespace pb = ::conveyor::v1;

const std::string kCli = CONVEYOR_CLI;

constexpr char kGoodConfig[] = R"(anchor: action
streams:
  cam0:
    delta_timestamps: [0.0]
    size: [64, 64]
  observation.state:
    delta_timestamps: [0.0]
  action:
    delta_timestamps: {start: 0.0, step: 0.02, count: 50}
pipeline:
  global_batch_size: 32
  seed: 3
  queue_bytes: 67108864
  schedule: {mode: gop}
)";

// The server's ceilings in this test: small enough that abuse hits them quickly.
constexpr int kMaxStreams = 12;
constexpr int kMaxStreamsPerPeer = 10;
constexpr uint64_t kStreamMemory = 96ull << 20;
constexpr uint64_t kQueueBytes = 32ull << 20;
// What the server may hold beyond its per-stream budgets: the dataset index, gRPC's buffers and
// thread stacks, the allocator's arenas. Measured at about 40 MB here; stated with headroom.
constexpr long kMarginBytes = 160l << 20;

using testing::ShellCommand;

std::vector<std::string> Lines(const std::string& text) { return testing::SplitLines(text); }
std::string Join(const std::vector<std::string>& args) { return ShellCommand(args); }

// Sends `req` as it is (no client-side validation) and reads up to `reads` messages.
grpc::Status RawStream(const std::string& address, const pb::StreamBatchesRequest& req,
                       int reads = 2) {
  auto stub = pb::Conveyor::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->StreamBatches(&ctx, req);
  pb::StreamBatchesResponse msg;
  int n = 0;
  while (n < reads && reader->Read(&msg)) ++n;
  if (n == reads) ctx.TryCancel();
  return reader->Finish();
}

pb::StreamBatchesRequest Request(const std::string& config_yaml = "") {
  pb::StreamBatchesRequest r;
  r.set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
  r.set_job("hostile");
  r.set_consumers(1);
  if (!config_yaml.empty()) r.set_config_yaml(config_yaml);
  return r;
}

// kGoodConfig with the `pipeline:` section replaced.
std::string WithPipeline(const std::string& pipeline) {
  std::string c = kGoodConfig;
  return c.substr(0, c.find("pipeline:")) + pipeline;
}

struct Case {
  std::string what;
  pb::StreamBatchesRequest request;
  grpc::StatusCode code;
  std::string message;  // a substring the status must carry
};

std::vector<Case> Cases() {
  auto inline_config = [](std::string what, std::string yaml, grpc::StatusCode code,
                          std::string message) {
    return Case{std::move(what), Request(yaml), code, std::move(message)};
  };
  const auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  const auto kExhausted = grpc::StatusCode::RESOURCE_EXHAUSTED;
  std::vector<Case> cases = {
      // The SIGFPE of the issue: 2^32 * 2^32 wrapped to 0 and was divided by.
      inline_config("schedule product wraps to 0",
                    WithPipeline("pipeline: {global_batch_size: 32, schedule: {mode: gop, "
                                 "block_steps: 4294967296, window_blocks: 4294967296}}\n"),
                    kInvalid, "block_steps is 4294967296; it must be in [1, 1048576]"),
      inline_config("negative block_steps",
                    WithPipeline("pipeline: {schedule: {mode: gop, block_steps: -1}}\n"), kInvalid,
                    "block_steps is -1"),
      inline_config("NaN window_blocks",
                    WithPipeline("pipeline: {schedule: {mode: gop, window_blocks: .nan}}\n"),
                    kInvalid, "window_blocks must be an integer"),
      inline_config("infinite batch size", WithPipeline("pipeline: {global_batch_size: .inf}\n"),
                    kInvalid, "global_batch_size must be an integer"),
      inline_config("zero batch size", WithPipeline("pipeline: {global_batch_size: 0}\n"), kInvalid,
                    "global_batch_size is 0"),
      inline_config("batch size past any config", WithPipeline("pipeline: {global_batch_size: 1000000000000}\n"),
                    kInvalid, "global_batch_size is 1000000000000"),
      inline_config("batch size past this server's ceiling",
                    WithPipeline("pipeline: {global_batch_size: 20000}\n"), kInvalid,
                    "this server's ceiling is 16384"),
      inline_config("a million threads", WithPipeline("pipeline: {threads: 1000000}\n"), kInvalid,
                    "threads is 1000000"),
      inline_config("a petabyte queue", WithPipeline("pipeline: {queue_bytes: 1000000000000000}\n"),
                    kInvalid, "queue_bytes is 1000000000000000"),
      inline_config("a frame cache of 100000 windows",
                    WithPipeline("pipeline: {global_batch_size: 32, schedule: {mode: gop, "
                                 "block_steps: 50, window_blocks: 100000}}\n"),
                    kExhausted, "--stream-memory-bytes"),
      inline_config("string where a number goes",
                    WithPipeline("pipeline: {global_batch_size: lots}\n"), kInvalid,
                    "global_batch_size must be an integer"),
      inline_config("unknown stream", "anchor: action\nstreams:\n  cam9: {}\n", kInvalid, "cam9"),
      inline_config("unknown top-level key", std::string(kGoodConfig) + "pipelin: {}\n", kInvalid,
                    "pipelin"),
      inline_config("unknown pipeline key", WithPipeline("pipeline: {global_batch: 32}\n"),
                    kInvalid, "global_batch"),
      inline_config("malformed YAML", "streams: [unclosed\n", kInvalid, "request config:"),
      inline_config("conflicting keys", std::string(kGoodConfig) + "anchor: cam0\n", kInvalid,
                    "key 'anchor' appears twice"),
      inline_config("not a mapping", "- 1\n- 2\n", kInvalid, "streams"),
      inline_config("10,000 nested lists", "streams: " + std::string(10000, '[') + "\n", kInvalid,
                    "too deeply nested"),
      inline_config("deep block nesting", [] {
        std::string y = "streams:\n";
        for (int i = 0; i < 200; ++i) y += std::string(2 * i + 2, ' ') + "k" + std::to_string(i) + ":\n";
        return y;
      }(), kInvalid, "too deeply nested"),
      inline_config("300 frames per sample",
                    "anchor: action\nstreams:\n  cam0:\n    delta_timestamps: {start: 0.0, step: "
                    "0.01, count: 300}\n    size: [64, 64]\n  action: {}\n",
                    kInvalid, "max_frames_per_sample"),
      inline_config("a config raising its own frame limit past the server's",
                    "anchor: action\nlimits: {max_frames_per_sample: 100000}\nstreams:\n  cam0:\n"
                    "    delta_timestamps: {start: 0.0, step: 0.01, count: 300}\n    size: [64, 64]\n"
                    "  action: {}\n",
                    kInvalid, "this server's ceiling is 256"),
      inline_config("frames of 10000 x 10000 pixels",
                    "anchor: action\nlimits: {max_pixels: 1000000000000}\nstreams:\n  cam0:\n"
                    "    delta_timestamps: [0.0]\n    size: [10000, 10000]\n  action: {}\n",
                    kInvalid, "--max-pixels"),
      inline_config("a 10-hour audio window",
                    "anchor: action\nlimits: {max_audio_samples: 1000000000000, max_sample_bytes: "
                    "1000000000000}\nstreams:\n  audio:\n    delta_timestamps: [-36000.0, 0.0]\n"
                    "  action: {}\n",
                    kExhausted, "--max-sample-bytes"),
      inline_config("negative tolerance",
                    "anchor: action\nstreams:\n  action: {tolerance_s: -1}\n", kInvalid,
                    "tolerance_s"),
      inline_config("NaN in delta_timestamps",
                    "anchor: action\nstreams:\n  action: {delta_timestamps: [.nan]}\n", kInvalid,
                    "delta_timestamps"),
      inline_config("oversized config", "# " + std::string(2 << 20, 'x') + "\n", kInvalid,
                    "accepts at most"),
  };
  {
    Case c{"zero consumers", Request(), kInvalid, "consumers must be at least 1"};
    c.request.set_consumers(0);
    cases.push_back(c);
  }
  {
    Case c{"consumer index past consumers", Request(), kInvalid, "consumer index 5 is out of range"};
    c.request.set_consumer(5);
    c.request.set_consumers(2);
    cases.push_back(c);
  }
  {
    Case c{"batch not divisible by consumers", Request(), kInvalid, "not a multiple of the 7"};
    c.request.set_consumers(7);
    cases.push_back(c);
  }
  {
    Case c{"cursor past the end of the epoch", Request(), grpc::StatusCode::OUT_OF_RANGE,
           "an epoch has 12 steps (0..11)"};
    c.request.mutable_start()->set_step(9999);
    cases.push_back(c);
  }
  {
    Case c{"cursor at step 2^64 - 1", Request(), grpc::StatusCode::OUT_OF_RANGE, "past the end"};
    c.request.mutable_start()->set_step(~uint64_t{0});
    cases.push_back(c);
  }
  {
    Case c{"cursor past max_epochs",
           Request(WithPipeline("pipeline: {global_batch_size: 32, max_epochs: 1}\n")),
           grpc::StatusCode::OUT_OF_RANGE, "past the last epoch"};
    c.request.mutable_start()->set_epoch(5);
    cases.push_back(c);
  }
  {
    Case c{"no protocol version", Request(), grpc::StatusCode::FAILED_PRECONDITION, "not set"};
    c.request.set_protocol_version(0);
    cases.push_back(c);
  }
  {
    Case c{"future protocol version", Request(), grpc::StatusCode::FAILED_PRECONDITION, "protocol"};
    c.request.set_protocol_version(99);
    cases.push_back(c);
  }
  {
    Case c{"unknown dataset", Request(), grpc::StatusCode::NOT_FOUND, "unknown dataset"};
    c.request.set_dataset(std::string(100000, 'd'));
    cases.push_back(c);
  }
  {
    Case c{"unknown config name", Request(), grpc::StatusCode::NOT_FOUND, "unknown config 'nope'"};
    c.request.set_config_name("nope");
    cases.push_back(c);
  }
  {
    Case c{"job name of 200 characters", Request(), kInvalid, "job name of 200 characters"};
    c.request.set_job(std::string(200, 'j'));
    cases.push_back(c);
  }
  {
    Case c{"job name with a newline", Request(), kInvalid, "job name has character 10"};
    c.request.set_job("evil\njob");
    cases.push_back(c);
  }
  {
    // Refused by gRPC's receive cap before our code runs: nobody can make the server buffer it.
    Case c{"16 MiB job name", Request(), kExhausted, ""};
    c.request.set_job(std::string(16 << 20, 'j'));
    cases.push_back(c);
  }
  return cases;
}

class HostileClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>();
    ASSERT_SH(Join({kCli, "synth", "--out", dir_->Join("ds"), "--episodes", "4",
                    "--episode-seconds", "2", "--quiet"}));
    testing::WriteFile(dir_->Join("good.yaml"), kGoodConfig);
  }
  std::unique_ptr<TempDir> dir_;
};

TEST_F(HostileClientTest, EveryBadRequestGetsAClearStatusWhileAGoodConsumerIsServedExactly) {
  const std::string ds = dir_->Join("ds"), good = dir_->Join("good.yaml");
  ServerProcess server(kCli,
                       {ds, "--config", good, "--threads", "1", "--metrics-listen", "127.0.0.1:0",
                        "--max-streams", std::to_string(kMaxStreams), "--max-streams-per-peer",
                        std::to_string(kMaxStreamsPerPeer), "--queue-bytes",
                        std::to_string(kQueueBytes), "--stream-memory-bytes",
                        std::to_string(kStreamMemory)},
                       dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  int rc = 0;
  const std::vector<std::string> want =
      Lines(Capture(Join({kCli, "batches", ds, "--config", good, "--steps", "24", "--digest"}), &rc));
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(want.size(), 24u);
  // Warm up, then the baseline.
  Capture(Join({kCli, "fetch", "--servers", server.address(), "--steps", "2"}), &rc);
  ASSERT_EQ(rc, 0) << server.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int fds = server.CountFds(), threads = server.CountThreads();
  const long rss_base = server.RssBytes();

  // The well-behaved consumer: two epochs, slowly enough to overlap everything below.
  std::string good_out;
  std::thread consumer([&] {
    int code = 0;
    good_out = Capture(Join({kCli, "fetch", "--servers", server.address(), "--job", "good",
                             "--steps", "24", "--digest", "--prefetch", "1"}),
                       &code);
    if (code != 0) good_out += "\nexit " + std::to_string(code);
  });
  std::atomic<bool> done{false};
  std::atomic<long> rss_peak{rss_base};
  std::thread watcher([&] {
    while (!done) {
      rss_peak = std::max(rss_peak.load(), server.RssBytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });

  const std::vector<Case> cases = Cases();
  EXPECT_GE(cases.size(), 30u);
  for (const Case& c : cases) {
    const grpc::Status s = RawStream(server.address(), c.request);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos)
        << c.what << ": " << s.error_message();
    ASSERT_EQ(server.Poll(), -2) << "the server died on: " << c.what << "\n" << server.log();
  }

  // A client that is not a Conveyor client at all: bytes that are not a request.
  {
    auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::CompletionQueue cq;
    auto call = stub.PrepareCall(&ctx, "/conveyor.v1.Conveyor/StreamBatches", &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    cq.Next(&tag, &ok);
    const std::string junk = "\xff\xff\xff\xff\x0f not a protobuf";
    grpc::Slice slice(junk);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    grpc::Status st;
    call->Finish(&st, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    EXPECT_FALSE(st.ok()) << "a malformed request was accepted";
    ASSERT_EQ(server.Poll(), -2) << server.log();
  }

  // A flood: more streams at once than the server admits, from one address. Those past the
  // limits are refused with RESOURCE_EXHAUSTED; the good consumer keeps its stream.
  {
    std::vector<std::thread> flood;
    std::atomic<int> refused{0}, served{0}, other{0}, settled{0};
    const int n = 3 * kMaxStreams;
    for (int i = 0; i < n; ++i) {
      flood.emplace_back([&] {
        // Each flooder holds its stream open until every flooder knows its fate, so they overlap.
        auto stub = pb::Conveyor::NewStub(
            grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto reader = stub->StreamBatches(&ctx, Request());
        pb::StreamBatchesResponse msg;
        const bool open = reader->Read(&msg);
        ++settled;
        if (open) {
          for (int k = 0; k < 600 && settled.load() < n; ++k) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          ctx.TryCancel();
        }
        const grpc::Status s = reader->Finish();
        if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++refused;
        } else if (open) {
          ++served;
        } else {
          ++other;
        }
      });
    }
    for (auto& t : flood) t.join();
    EXPECT_GT(refused.load(), 0) << "no stream was refused past --max-streams";
    EXPECT_GT(served.load(), 0);
    EXPECT_EQ(other.load(), 0);
  }

  // Thousands of job names: metric series stay bounded.
  for (int i = 0; i < 300; ++i) {
    pb::StreamBatchesRequest r = Request();
    r.set_job("job-" + std::to_string(i));
    r.set_max_batches(1);
    grpc::Status s = RawStream(server.address(), r, 4);
    // The flood's streams may still be closing on a loaded machine: the per-peer limit refuses
    // this one until they are gone (that refusal is tested above). Try again, for up to 10 s.
    for (int tries = 0; tries < 200 && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      s = RawStream(server.address(), r, 4);
    }
    ASSERT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) << s.error_message();
  }

  consumer.join();
  done = true;
  watcher.join();
  EXPECT_EQ(Lines(good_out), want) << good_out << server.log();
  ASSERT_EQ(server.Poll(), -2) << server.log();

  // Memory: the budget is kMaxStreams streams of kStreamMemory each; what was measured stays
  // under it plus the stated margin.
  const long budget = static_cast<long>(kMaxStreams * kStreamMemory);
  EXPECT_LT(rss_peak.load() - rss_base, budget + kMarginBytes)
      << "peak RSS " << rss_peak.load() << ", baseline " << rss_base;
  std::fprintf(stderr, "hostile suite: peak RSS %.1f MB over a baseline of %.1f MB\n",
               (rss_peak.load() - rss_base) / 1e6, rss_base / 1e6);

  const std::string metrics = Capture("curl -sf http://" + server.metrics_address() + "/metrics", &rc);
  ASSERT_EQ(rc, 0);
  size_t series = 0;
  for (size_t at = 0; (at = metrics.find("conveyor_batches_total{", at)) != std::string::npos; ++at) {
    ++series;
  }
  EXPECT_LE(series, 257u) << "job label cardinality is not bounded";
  EXPECT_NE(metrics.find("job=\"_other\""), std::string::npos);

  // Back to baseline: streams closed, their threads and sockets gone.
  bool settled = false;
  for (int i = 0; i < 100 && !settled; ++i) {
    settled = server.CountFds() <= fds + 2 && server.CountThreads() <= threads + 2;
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(settled) << "fds " << server.CountFds() << " (baseline " << fds << "), threads "
                       << server.CountThreads() << " (baseline " << threads << ")";
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
}

// The client-side repros of the issue: a cursor past the end, negative or malformed is an error
// with the valid range and a non-zero exit, never "nothing to do".
TEST_F(HostileClientTest, BadCursorsFailTheCliWithTheValidRange) {
  const std::string ds = dir_->Join("ds"), good = dir_->Join("good.yaml");
  ServerProcess server(kCli, {ds, "--config", good, "--threads", "1"}, dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  struct CursorCase {
    std::string cursor, message;
  };
  const std::string bad_form = "is neither EPOCH:STEP nor EPOCH@POSITION";
  for (const CursorCase& c : std::vector<CursorCase>{{"0:9999", "an epoch has 12 steps (0..11)"},
                                                     {"0@99999", "cursor 0@99999 is past the end of the epoch"},
                                                     {"0:-1", bad_form},
                                                     {"0: 5", bad_form},
                                                     {"-1:0", bad_form},
                                                     {"0@-3", bad_form},
                                                     {"0:99999999999999999999", bad_form},
                                                     {"abc", bad_form}}) {
    for (const char* cmd : {"fetch", "batches"}) {
      std::vector<std::string> args = {kCli, cmd};
      if (std::string(cmd) == "fetch") {
        args.insert(args.end(), {"--servers", server.address()});
      } else {
        args.insert(args.end(), {ds, "--config", good});
      }
      args.insert(args.end(), {"--cursor", c.cursor, "--steps", "2"});
      int code = 0;
      const std::string out = Capture("(" + Join(args) + " 2>&1)", &code);
      EXPECT_NE(code, 0) << cmd << " --cursor " << c.cursor << ": " << out;
      EXPECT_NE(out.find(c.message), std::string::npos) << cmd << " --cursor " << c.cursor << ": " << out;
    }
  }
  // The schedule repro through the offline tool too.
  testing::WriteFile(dir_->Join("wrap.yaml"),
                     WithPipeline("pipeline: {schedule: {mode: gop, block_steps: 4294967296, "
                                  "window_blocks: 4294967296}}\n"));
  int code = 0;
  const std::string out =
      Capture("(" + Join({kCli, "batches", ds, "--config", dir_->Join("wrap.yaml"), "--steps", "1"}) +
                  " 2>&1)",
              &code);
  EXPECT_TRUE(code > 0 && code < 128) << code << ": " << out;  // an error exit, not a signal
  EXPECT_NE(out.find("block_steps is 4294967296"), std::string::npos) << out;
  EXPECT_EQ(server.Poll(), -2);
}

}  // namespace
}  // namespace conveyor
