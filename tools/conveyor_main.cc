// The `conveyor` command line: one binary, one subcommand per job, `--help` on each. Each
// subcommand registers its own flags in its own file (tools/command.h); main only dispatches.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/command.h"

namespace {

int Report(const std::string& command, const absl::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "conveyor %s: error: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  namespace tools = conveyor::tools;
  CLI::App app{"Conveyor: multimodal training data for robot-learning and video models.\n"
               "Datasets are a manifest plus shards; see docs/format.md."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("conveyor ") + CONVEYOR_VERSION);

  std::vector<std::unique_ptr<tools::Command>> commands;
  commands.push_back(tools::NewSynthCommand());
  commands.push_back(tools::NewImportCommand());
  commands.push_back(tools::NewInspectCommand());
  commands.push_back(tools::NewExtractCommand());
  commands.push_back(tools::NewSampleCommand());
  commands.push_back(tools::NewBatchesCommand());
  commands.push_back(tools::NewServeCommand(CONVEYOR_VERSION));
  commands.push_back(tools::NewFetchCommand());
  commands.push_back(tools::NewTrainCommand());
  commands.push_back(tools::NewBenchCommand());
  commands.push_back(tools::NewTopCommand());
  std::vector<CLI::App*> subcommands;
  for (auto& c : commands) subcommands.push_back(c->Register(app));

  bool known = argc < 2 || argv[1][0] == '-';
  for (const CLI::App* sub : subcommands) known = known || sub->check_name(argv[1]);
  if (!known) {
    std::fprintf(stderr, "conveyor: error: unknown command '%s' (expected synth, import, inspect, extract, sample, batches, serve, fetch, train, bench or top; see --help)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  for (size_t i = 0; i < commands.size(); ++i) {
    if (*subcommands[i]) return Report(subcommands[i]->get_name(), commands[i]->Run());
  }
  return 2;
}
