// `conveyor bench` on a tiny dataset: every modality gets its rows with positive figures and the
// limits it promises (a smoke test of the command, never a timing assertion), and bad flags are
// refused with a message.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace conveyor
