// The reference trainer end to end: a real server, two `conveyor train` processes averaging
// gradients with gloo. Aligned data must be learned far better than the mean action; the same
// run with the cameras shifted by two seconds must not get there. Ranks must end with the same
// weights (gradients averaged) and report the same losses (reduced over ranks).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using json = nlohmann::json;
const std::string kCli = CONVEYOR_CLI;

// Two cameras at their native 96x96, state and a 50-step action chunk, as LeRobot would ask.
constexpr char kConfig[] = R"(anchor: action
streams:
  cam0:
    delta_timestamps: [-0.1, 0.0]
  cam1:
    delta_timestamps: [-0.1, 0.0]
  observation.state:
    delta_timestamps: [0.0]
    normalize: mean_std
  action:
    delta_timestamps: {start: 0.0, step: 0.02, count: 50}
    normalize: min_max
pipeline:
  global_batch_size: 32
  seed: 3
)";

struct Ranks {
  json rank[2];
};

Ranks TrainTwoRanks(const std::string& address, const std::string& config, const std::string& dir,
                  const std::string& tag, int shift) {
  Ranks run;
  std::string out[2];
  int code[2] = {-1, -1};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const std::string cmd = kCli + " train --servers " + address + " --rank " + std::to_string(r) +
                              " --world-size 2 --comm gloo --comm-host 127.0.0.1 --rendezvous " +
                              dir + "/rdv-" + tag + " --config " + config + " --steps 150 --lr 0.01" +
                              " --shift-frames " + std::to_string(shift) + " --json " + dir + "/" +
                              tag + "-" + std::to_string(r) + ".json";
      const testing::CommandResult res = testing::RunCommand(cmd, 600);
      code[r] = res.exit_code;
      out[r] = res.output;
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(code[r], 0) << out[r];
    std::ifstream f(dir + "/" + tag + "-" + std::to_string(r) + ".json");
    if (f) run.rank[r] = json::parse(f);
  }
  return run;
}

TEST(TrainerTest, AlignedDataIsLearnedAndShiftedCamerasAreNot) {
  testing::TempDir dir;
  ASSERT_SH(kCli + " synth --out " + dir.Join("ds") +
            " --episodes 4 --episode-seconds 8 --cameras 2 --size 96x96 --audio-codec none --quiet");
  testing::WriteFile(dir.Join("train.yaml"), kConfig);
  testing::ServerProcess server(kCli, {dir.Join("ds"), "--config", dir.Join("train.yaml")}, dir.path());
  ASSERT_TRUE(server.ok()) << server.log();

  const Ranks aligned = TrainTwoRanks(server.address(), dir.Join("train.yaml"), dir.path(), "aligned", 0);
  const Ranks shifted = TrainTwoRanks(server.address(), dir.Join("train.yaml"), dir.path(), "shifted", 100);
  if (HasFailure()) return;
  for (const Ranks* run : {&aligned, &shifted}) {
    ASSERT_EQ(run->rank[0]["steps"].size(), 150u);
    ASSERT_EQ(run->rank[1]["steps"].size(), 150u);
    EXPECT_EQ(run->rank[0]["comm"], "gloo");
    EXPECT_EQ(run->rank[0]["weights_fnv1a"], run->rank[1]["weights_fnv1a"]) << "gradients not averaged";
    EXPECT_EQ(run->rank[0]["loss"]["final"], run->rank[1]["loss"]["final"]);
    // Every step is attributed: the parts add up to the step.
    for (const json& s : run->rank[1]["steps"]) {
      const double parts = s["wait_s"].get<double>() + s["h2d_s"].get<double>() +
                           s["compute_s"].get<double>() + s["comm_s"].get<double>();
      EXPECT_NEAR(parts, s["total_s"].get<double>(), 1e-3);
    }
  }
  const double a = aligned.rank[0]["loss"]["first_step_ratio"].get<double>();
  const double s = shifted.rank[0]["loss"]["first_step_ratio"].get<double>();
  std::printf("first-action loss / mean-action loss: aligned %.4f, cameras shifted 2 s %.4f\n", a, s);
  // Measured: 0.02 aligned, 0.13 with the cameras 2 s off (the state still explains its part).
  EXPECT_LT(a, 0.1) << "aligned frames, state and actions should be learned far below the mean";
  EXPECT_GT(s, 2.5 * a) << "shifting the cameras should cost the colour term";
  EXPECT_LT(aligned.rank[0]["loss"]["ratio"].get<double>(), 0.6);
}

}  // namespace
}  // namespace conveyor
