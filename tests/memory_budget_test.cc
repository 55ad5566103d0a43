// The server-wide memory budget (ServerLimits::server_memory_bytes, `--server-memory-bytes`):
// a stream is admitted only when its estimate fits beside the running streams; otherwise it is
// refused with RESOURCE_EXHAUSTED naming the budget, and admitted once a stream ends. Against a
// real `conveyor serve` with `conveyor fetch` consumers holding their streams open: the peak RSS
// stays under the budget, and every admitted stream is exact (equal to `conveyor batches
// --digest`). Without the flag the budget comes from the machine (or its cgroup).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu_slots.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::Capture;
using testing::ServerProcess;
using testing::ShellCommand;
using testing::TempDir;

const std::string kCli = CONVEYOR_CLI;
const std::string kConfig = std::string(CONVEYOR_SOURCE_DIR) + "/examples/pipeline.yaml";

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& l : testing::SplitLines(text)) {
    if (l.find(" sha256 ") != std::string::npos) out.push_back(l);
  }
  return out;
}

double Metric(const ServerProcess& server, const std::string& name) {
  int rc = 0;
  const std::string text = Capture("curl -sf http://" + server.metrics_address() + "/metrics", &rc);
  const std::regex re("\\n" + name + " ([0-9.e+]+)\\n");
  std::smatch m;
  return rc == 0 && std::regex_search(text, m, re) ? std::stod(m[1]) : -1;
}

class MemoryBudgetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_SH(kCli + " synth --out " + dir_->Join("ds") + " --episodes 2 --episode-seconds 4 --quiet");
  }
  static void TearDownTestSuite() { delete dir_; }

  std::vector<std::string> Fetch(const ServerProcess& server, std::vector<std::string> extra,
                                 int* rc) {
    std::vector<std::string> cmd = {kCli, "fetch", "--servers", server.address(), "--digest",
                                    "--prefetch", "1"};
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    const testing::CommandResult r = testing::RunCommand(ShellCommand(cmd));
    *rc = r.exit_code;
    last_output_ = r.output;
    return Lines(r.output);
  }

  static TempDir* dir_;
  std::string last_output_;
};
TempDir* MemoryBudgetTest::dir_ = nullptr;

TEST_F(MemoryBudgetTest, StreamsAreAdmittedWithinTheBudgetAndExact) {
  int rc = 0;
  const std::vector<std::string> want = Lines(Capture(
      ShellCommand({kCli, "batches", dir_->Join("ds"), "--config", kConfig, "--steps", "6",
                    "--digest"}),
      &rc));
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(want.size(), 6u);

  // One stream's estimate, from a server whose budget admits nothing: its refusal says it.
  uint64_t stream_bytes = 0;
  {
    ServerProcess tiny(kCli, {dir_->Join("ds"), "--config", kConfig, "--server-memory-bytes", "1MB"},
                       dir_->path());
    ASSERT_TRUE(tiny.ok()) << tiny.log();
    Fetch(tiny, {"--steps", "1", "--reconnect-timeout", "1"}, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(last_output_.find("RESOURCE_EXHAUSTED"), std::string::npos) << last_output_;
    EXPECT_NE(last_output_.find("memory budget of 1000000 bytes (--server-memory-bytes)"),
              std::string::npos)
        << last_output_;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(last_output_, m, std::regex("would hold about ([0-9]+) bytes")))
        << last_output_;
    stream_bytes = std::stoull(m[1]);
  }
  ASSERT_GT(stream_bytes, 1000000u);

  // Room for two such streams, not three.
  const uint64_t budget = stream_bytes * 5 / 2;
  ServerProcess server(kCli,
                       {dir_->Join("ds"), "--config", kConfig, "--server-memory-bytes",
                        std::to_string(budget), "--metrics-listen", "127.0.0.1:0"},
                       dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_EQ(Metric(server, "conveyor_memory_budget_bytes"), static_cast<double>(budget));
  // The streams below share the default CPU slots: one more than this process's CPUs.
  EXPECT_EQ(Metric(server, "conveyor_cpu_slots"), static_cast<double>(AvailableCpus() + 1));
  Fetch(server, {"--steps", "1"}, &rc);  // warm up, then the baseline
  ASSERT_EQ(rc, 0) << last_output_;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long rss_base = server.RssBytes();
  std::atomic<bool> done{false};
  std::atomic<long> rss_peak{rss_base};
  std::thread watcher([&] {
    while (!done) {
      rss_peak = std::max(rss_peak.load(), server.RssBytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  // Two consumers hold their streams (each stalls after its first batch). In messages: a
  // same-host ring would be reserved with its stream (ASharedRingIsAdmittedWithItsStream).
  std::vector<std::string> held[2];
  std::string held_out[2];
  std::vector<std::thread> holders;
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([&, i] {
      const testing::CommandResult r = testing::RunCommand(ShellCommand(
          {kCli, "fetch", "--servers", server.address(), "--job", "holder" + std::to_string(i),
           "--steps", "6", "--digest", "--prefetch", "1", "--shared-memory", "false", "--stall-after", "1",
           "--stall-seconds", "8"}));
      held_out[i] = r.output;
      held[i] = Lines(r.output);
      if (r.exit_code != 0) held_out[i] += "\nexit " + std::to_string(r.exit_code);
    });
  }
  // Both admitted: the budget holds two estimates.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Metric(server, "conveyor_memory_reserved_bytes") < 2.0 * stream_bytes &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Metric(server, "conveyor_memory_reserved_bytes"), 2.0 * stream_bytes);

  // A third is refused while they run, naming the budget and what the others hold.
  Fetch(server, {"--steps", "1", "--reconnect-timeout", "1", "--shared-memory", "false"}, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(last_output_.find("RESOURCE_EXHAUSTED"), std::string::npos) << last_output_;
  EXPECT_NE(last_output_.find("the 2 streams running hold " + std::to_string(2 * stream_bytes) +
                              " of this server's memory budget of " + std::to_string(budget)),
            std::string::npos)
      << last_output_;

  // One that waits (a longer reconnect timeout) is admitted once a holder ends, and is exact.
  const std::vector<std::string> waited =
      Fetch(server, {"--steps", "6", "--reconnect-timeout", "30", "--shared-memory", "false"}, &rc);
  EXPECT_EQ(rc, 0) << last_output_;
  EXPECT_EQ(waited, want) << last_output_;
  for (std::thread& t : holders) t.join();
  done = true;
  watcher.join();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(held[i], want) << held_out[i];
  EXPECT_EQ(Metric(server, "conveyor_memory_reserved_bytes"), 0.0);
  EXPECT_EQ(server.Poll(), -2) << server.log();

  // What was measured stays under the budget: the estimate bounds what a stream holds.
  EXPECT_LT(rss_peak.load() - rss_base, static_cast<long>(budget))
      << "peak RSS " << rss_peak.load() << ", baseline " << rss_base;
  std::fprintf(stderr, "memory budget %.1f MB (stream estimate %.1f MB): peak RSS %.1f MB over a "
               "baseline of %.1f MB\n", budget / 1e6, stream_bytes / 1e6,
               (rss_peak.load() - rss_base) / 1e6, rss_base / 1e6);
}

TEST_F(MemoryBudgetTest, ASharedRingIsAdmittedWithItsStreamOrTheStreamGoesWithout) {
  int rc = 0;
  const std::vector<std::string> want = Lines(Capture(
      ShellCommand({kCli, "batches", dir_->Join("ds"), "--config", kConfig, "--steps", "3", "--digest"}), &rc));
  ASSERT_EQ(rc, 0);
  uint64_t stream_bytes = 0;
  {
    ServerProcess tiny(kCli, {dir_->Join("ds"), "--config", kConfig, "--server-memory-bytes", "1MB"},
                       dir_->path());
    ASSERT_TRUE(tiny.ok()) << tiny.log();
    Fetch(tiny, {"--steps", "1", "--reconnect-timeout", "1"}, &rc);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(last_output_, m, std::regex("would hold about ([0-9]+) bytes")))
        << last_output_;
    stream_bytes = std::stoull(m[1]);
  }
  // Room for the stream's estimate but not for its ring beside it: served, in messages, exact,
  // and the client is told why.
  {
    ServerProcess server(kCli, {dir_->Join("ds"), "--config", kConfig, "--server-memory-bytes",
                                std::to_string(stream_bytes + stream_bytes / 100)},
                         dir_->path());
    ASSERT_TRUE(server.ok()) << server.log();
    EXPECT_EQ(Fetch(server, {"--steps", "3", "--stats"}, &rc), want) << last_output_;
    EXPECT_EQ(rc, 0) << last_output_;
    EXPECT_NE(last_output_.find("transport grpc"), std::string::npos) << last_output_;
    EXPECT_NE(last_output_.find("memory budget has no room for a shared ring"), std::string::npos) << last_output_;
  }
  // Room for both: the ring, and every batch through it.
  {
    ServerProcess server(kCli, {dir_->Join("ds"), "--config", kConfig, "--server-memory-bytes",
                                std::to_string(3 * stream_bytes)},
                         dir_->path());
    ASSERT_TRUE(server.ok()) << server.log();
    EXPECT_EQ(Fetch(server, {"--steps", "3", "--stats"}, &rc), want) << last_output_;
    EXPECT_NE(last_output_.find("transport shared_memory (3 batches through shared memory)"), std::string::npos)
        << last_output_;
  }
}

TEST_F(MemoryBudgetTest, DefaultBudgetComesFromTheMachine) {
  ServerProcess server(kCli, {dir_->Join("ds"), "--config", kConfig, "--metrics-listen", "127.0.0.1:0"},
                       dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  uint64_t mem_total_kb = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  while (meminfo >> key >> mem_total_kb >> unit && key != "MemTotal:") {
  }
  const double budget = Metric(server, "conveyor_memory_budget_bytes");
  EXPECT_GT(budget, 0);
  EXPECT_LE(budget, 0.75 * mem_total_kb * 1024 + 1);
  EXPECT_NE(server.log().find("memory budget for all streams"), std::string::npos) << server.log();
  EXPECT_NE(server.log().find("set --server-memory-bytes"), std::string::npos) << server.log();
}

}  // namespace
}  // namespace conveyor
