// `conveyor bench` on a tiny dataset: every modality gets its rows with positive figures and the
// limits it promises (a smoke test of the command, never a timing assertion), and bad flags are
// refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using json = nlohmann::json;

TEST(BenchCliTest, EveryModalityHasItsFiguresAndLimits) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --threads 1 --seconds 0.2 --json " +
            dir.Join("bench.json") + " > " + dir.Join("out.txt") + " 2>&1");
  std::ifstream f(dir.Join("bench.json"));
  ASSERT_TRUE(f.good()) << testing::ReadFile(dir.Join("out.txt"));
  const json doc = json::parse(f);
  std::map<std::string, int> seen;
  for (const json& r : doc["rows"]) {
    const std::string key = r["modality"].get<std::string>() + "/" + r["stage"].get<std::string>();
    ++seen[key];
    EXPECT_GT(r["value"].get<double>(), 0) << key;
    if (key == "video/decode" || key == "audio/decode" || key == "video/read" || key == "all/serve") {
      EXPECT_GT(r["limit"].get<double>(), 0) << key << " has no limit";
    }
  }
  for (const char* key : {"video/read", "video/decode", "video/assemble", "audio/read", "audio/decode",
                          "audio/assemble", "lowdim/decode", "lowdim/assemble", "all/serve"}) {
    EXPECT_TRUE(seen.count(key)) << key << " missing:\n" << testing::ReadFile(dir.Join("out.txt"));
  }
  EXPECT_EQ(seen["video/assemble"], 3);  // in order, shuffled naive, shuffled gop
  // Start-up is a row of its own, beside the offline pipeline's, not part of the served rate.
  bool first_batch = false;
  for (const json& r : doc["rows"]) {
    if (r["order"] != "time to first batch (served)") continue;
    first_batch = true;
    EXPECT_EQ(r["unit"], "s");
    EXPECT_GT(r["limit"].get<double>(), 0) << "no offline time to first batch beside it";
  }
  EXPECT_TRUE(first_batch);
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  EXPECT_NE(out.find("where the time goes"), std::string::npos) << out;

  const testing::CommandResult bad = testing::RunCommand(cli + " bench " + dir.Join("ds") + " --modality smell");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--modality 'smell'"), std::string::npos) << bad.output;
}

// --plan: the cores a target needs, from the serve rows measured in the same run. The arithmetic is
// checked against the figures the command printed, never against a time.
TEST(BenchCliTest, PlanDerivesCoresPerGpuFromTheMeasuredPerCoreRate) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --threads 1,2 --seconds 0.3 --plan 5000 --gpus 4 " +
            "--server-cores 2 --json " + dir.Join("plan.json") + " > " + dir.Join("out.txt") + " 2>&1");
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  std::ifstream f(dir.Join("plan.json"));
  ASSERT_TRUE(f.good()) << out;
  const json plan = json::parse(f)["plan"];
  ASSERT_EQ(plan["measured"].size(), 2u) << plan.dump(2);  // threads 1 and 2, nothing else measured
  double lowest = 0;
  for (const json& m : plan["measured"]) {
    const double per_core = m["samples_per_s"].get<double>() / m["threads"].get<int>();
    EXPECT_GT(per_core, 0);
    EXPECT_DOUBLE_EQ(m["per_core"].get<double>(), per_core);
    if (lowest == 0 || per_core < lowest) lowest = per_core;
  }
  EXPECT_DOUBLE_EQ(plan["per_core_samples_per_s"].get<double>(), lowest);
  const double cores = 5000 / lowest;
  EXPECT_NEAR(plan["cores"].get<double>(), cores, 1e-9 * cores);
  EXPECT_NEAR(plan["cores_per_gpu"].get<double>(), cores / 4, 1e-9 * cores);
  EXPECT_EQ(plan["cores_for_the_job"].get<int64_t>(), static_cast<int64_t>(std::ceil(cores - 1e-9)));
  EXPECT_EQ(plan["servers"].get<int64_t>(), static_cast<int64_t>(std::ceil(cores / 2 - 1e-9)));
  EXPECT_EQ(plan["servers_with_spare"].get<int64_t>(), plan["servers"].get<int64_t>() + 1);
  // What it printed: the measurement it rests on and the answer.
  char line[160];
  std::snprintf(line, sizeof line, "per-core rate used: %.1f samples/s", lowest);
  EXPECT_NE(out.find(line), std::string::npos) << out;
  std::snprintf(line, sizeof line, "%.2f per GPU", cores / 4);
  EXPECT_NE(out.find(line), std::string::npos) << out;
  EXPECT_EQ(out.find("video decode"), std::string::npos) << "--plan measured more than it needs:\n" << out;

  for (const std::string bad : {" --plan -5", " --plan 100 --no-serve", " --plan 100 --gpus 0",
                                " --plan 100 --consumers 0"}) {
    const testing::CommandResult r = testing::RunCommand(cli + " bench " + dir.Join("ds") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.output.find("error"), std::string::npos) << bad << ": " << r.output;
  }
}

}  // namespace

// --plan --consumers N: the job's N ranks stream at once (consumer i of N), and the plan rests on
// what the server delivers to all of them together.
TEST(BenchCliTest, PlanForSeveralConsumersMeasuresThemStreamingAtOnce) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --threads 1 --seconds 0.5 --plan 1000 --gpus 2 " +
            "--consumers 2 --json " + dir.Join("plan.json") + " > " + dir.Join("out.txt") + " 2>&1");
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  std::ifstream f(dir.Join("plan.json"));
  ASSERT_TRUE(f.good()) << out;
  const json doc = json::parse(f);
  EXPECT_EQ(doc["plan"]["consumers"].get<int>(), 2) << doc.dump(2);
  ASSERT_EQ(doc["plan"]["measured"].size(), 1u) << doc.dump(2);
  EXPECT_GT(doc["plan"]["measured"][0]["samples_per_s"].get<double>(), 0);
  EXPECT_NE(out.find("gRPC to 2 consumers"), std::string::npos) << out;
  EXPECT_NE(out.find("through a server to 2 consumers at once"), std::string::npos) << out;
}
}  // namespace conveyor
