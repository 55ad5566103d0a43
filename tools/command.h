// One subcommand of the `conveyor` CLI: it adds itself and its flags to the app, and runs once
// the command line is parsed, if chosen. Each subcommand lives in its own file (tools/synth.cc,
// serve.cc, ...) beside the RunX function it calls; conveyor_main.cc only dispatches.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace conveyor::tools {

class Command {
 public:
  virtual ~Command() = default;
  // Adds the subcommand and its flags (bound to this object's fields) to `app`.
  virtual CLI::App* Register(CLI::App& app) = 0;
  // After parsing, when this subcommand was chosen. The message of an error is what the user
  // sees after "conveyor NAME: error: ".
  virtual absl::Status Run() = 0;
  // The exit status when Run() succeeded: 0, unless the command's result is a verdict
  // (`conveyor check`: 1 warnings, 2 errors).
  virtual int SuccessExitCode() const { return 0; }
};

std::unique_ptr<Command> NewSynthCommand();
std::unique_ptr<Command> NewImportCommand();
std::unique_ptr<Command> NewInspectCommand();
std::unique_ptr<Command> NewExtractCommand();
std::unique_ptr<Command> NewSampleCommand();
std::unique_ptr<Command> NewBatchesCommand();
std::unique_ptr<Command> NewServeCommand(std::string version);
std::unique_ptr<Command> NewFetchCommand();
std::unique_ptr<Command> NewTrainCommand();
// Defined in bench/bench_command.cc (the harness is a library above tools/, linked into the
// `conveyor` executable).
std::unique_ptr<Command> NewBenchCommand();
std::unique_ptr<Command> NewTopCommand();
std::unique_ptr<Command> NewCacheCommand();
std::unique_ptr<Command> NewCheckCommand();
std::unique_ptr<Command> NewAuditCommand();

}  // namespace conveyor::tools
