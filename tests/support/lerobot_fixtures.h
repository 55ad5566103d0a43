// The LeRobot v3.0 and v2.1 fixtures (tests/fixtures/lerobot/make_lerobot.sh), written once per
// build tree under `out_dir` with the npm Parquet writers installed in `npm_dir`; shared by the
// tests that read them (lerobot_import_test, dataset_check_test).
#pragma once

#include <string>

namespace conveyor::testing {

struct LeRobotFixtures {
  std::string skip;   // non-empty: the tools to write them are missing (GTEST_SKIP with it)
  std::string error;  // non-empty: writing them failed (the script's output)
};

LeRobotFixtures MakeLeRobotFixtures(const std::string& npm_dir, const std::string& out_dir);

}  // namespace conveyor::testing
