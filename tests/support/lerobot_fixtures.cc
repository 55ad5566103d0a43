#include "tests/support/lerobot_fixtures.h"

#include "tests/support/test_env.h"

namespace conveyor::testing {

LeRobotFixtures MakeLeRobotFixtures(const std::string& npm_dir, const std::string& out_dir) {
  LeRobotFixtures out;
  if (RunCommand("command -v node && command -v npm && command -v ffprobe", 10).exit_code != 0) {
    out.skip = "node, npm or ffprobe not installed: the fixtures are written with them";
    return out;
  }
  const std::string script =
      std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/lerobot/make_lerobot.sh";
  const auto made = RunCommand(
      "bash " + ShellQuote(script) + " " + ShellQuote(npm_dir) + " " + ShellQuote(out_dir), 600);
  if (made.exit_code != 0) out.error = "make_lerobot.sh failed:\n" + made.output;
  return out;
}

}  // namespace conveyor::testing
