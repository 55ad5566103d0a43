// The `conveyor` command line: one binary, one subcommand per job, `--help` on each. Each
// subcommand registers its own flags in its own file (tools/command.h); main only dispatches.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "shuffle/order.h"
#include "tools/command.h"

namespace {

// What --version prints: the release (the top-level project(VERSION), as the Python package's
// __version__), the schedule (pipeline) versions this binary can compute and serve, 1 to
// kScheduleVersionCurrent (a checkpoint records one; docs/pipeline.md "Schedule versions"), and the
// wire protocol's version.
std::string VersionText() {
  std::string versions;
  for (uint32_t v = 1; v <= conveyor::kScheduleVersionCurrent; ++v) {
    absl::StrAppend(&versions, v == 1 ? "" : " ", v);
  }
  return absl::StrCat("conveyor ", CONVEYOR_VERSION, "\nschedule versions: ", versions,
                      " (default ", conveyor::kScheduleVersionCurrent, ")\nprotocol version: ",
                      conveyor::client::ProtocolVersion());
}

// Blanks the credentials of a URL argument in place (`https://user:secret@host/ds` ->
// `https://***********@host/ds`): argv is what every local user reads in /proc/PID/cmdline and
// `ps`. Called once the arguments are parsed (CLI11 keeps copies); the moment between exec and
// this call remains, so a secret is better given through the environment or a file.
void BlankUrlCredentials(char* arg) {
  const std::string_view s(arg);
  const size_t scheme = s.find("://");
  if (scheme == std::string_view::npos) return;
  const size_t host = scheme + 3;
  const size_t end = s.find_first_of("/?#", host);
  const size_t at = s.substr(host, end == std::string_view::npos ? s.npos : end - host).rfind('@');
  if (at == std::string_view::npos) return;
  for (size_t i = host; i < host + at; ++i) arg[i] = '*';
}

int Report(const std::string& command, const absl::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "conveyor %s: error: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  namespace tools = conveyor::tools;
  // Logs go to stderr, never into a command's output (batches' digest lines, inspect's JSON).
  spdlog::set_default_logger(spdlog::stderr_logger_mt("conveyor"));
  CLI::App app{"Conveyor: multimodal training data for robot-learning and video models.\n"
               "A DATASET is a Conveyor dataset (docs/format.md) or a LeRobot v3.0/v2.1 dataset\n"
               "(docs/lerobot.md): a directory, http(s):// URL or s3:// prefix (docs/storage.md)."};
  app.require_subcommand(1);
  // Storage settings for every subcommand, before or after its name; each sets the environment
  // variable of the same meaning (docs/storage.md), so child processes see it too.
  std::string s3_endpoint, cache_dir, cache_shared_key, cache_bytes, index_cache_dir;
  app.add_option("--s3-endpoint", s3_endpoint,
                 "S3 endpoint URL for s3:// datasets (sets AWS_ENDPOINT_URL), e.g. "
                 "http://127.0.0.1:7480 for radosgw or MinIO");
  app.add_option("--cache-dir", cache_dir,
                 "Node-local cache of remote (HTTP, S3) byte ranges, private to this user (sets CONVEYOR_CACHE_DIR)");
  app.add_option("--cache-shared-key", cache_shared_key,
                 "Share --cache-dir with a group: a node secret file (32+ random bytes, readable by that group only) "
                 "that authenticates every entry (sets CONVEYOR_CACHE_SHARED_KEY; docs/serving.md \"Shared nodes\")");
  app.add_option("--cache-bytes", cache_bytes,
                 "Bound on the cache's bytes, shared by every process using it (sets "
                 "CONVEYOR_CACHE_BYTES; default 10 GiB)")->transform(CLI::AsSizeValue(true));
  app.add_option("--index-cache-dir", index_cache_dir,
                 "Where packet indexes of LeRobot mp4s and RLDS record indexes are kept between opens (sets "
                 "CONVEYOR_INDEX_CACHE_DIR; 'none' keeps them in memory only)");
  app.set_version_flag("--version", VersionText());

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
  commands.push_back(tools::NewAuditCommand());
  commands.push_back(tools::NewCacheCommand());
  commands.push_back(tools::NewCheckCommand());
  std::vector<CLI::App*> subcommands;
  for (auto& c : commands) {
    subcommands.push_back(c->Register(app));
    subcommands.back()->fallthrough();  // the storage options above may follow the subcommand
  }

  bool known = argc < 2 || argv[1][0] == '-';
  for (const CLI::App* sub : subcommands) known = known || sub->check_name(argv[1]);
  if (!known) {
    std::fprintf(stderr, "conveyor: error: unknown command '%s' (expected synth, import, inspect, extract, sample, batches, serve, fetch, train, bench, top, cache, check or audit; see --help)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that CLI11 prints itself, exiting 0.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    // A mistake on the command line reads like every other error of the CLI, naming the
    // subcommand it was for (docs/check.md), not CLI11's own text and usage dump.
    std::string name = "conveyor";
    for (const CLI::App* at = &app; !at->get_subcommands().empty();) {
      at = at->get_subcommands().front();  // `conveyor cache warm`: as deep as it got
      name += " " + at->get_name();
    }
    std::fprintf(stderr, "%s: error: %s (see %s --help)\n", name.c_str(), e.what(), name.c_str());
    return 2;
  }
  for (int i = 1; i < argc; ++i) BlankUrlCredentials(argv[i]);
  for (const auto& [value, variable] :
       {std::pair<const std::string&, const char*>{s3_endpoint, "AWS_ENDPOINT_URL"},
        {cache_dir, "CONVEYOR_CACHE_DIR"},
        {cache_shared_key, "CONVEYOR_CACHE_SHARED_KEY"},
        {cache_bytes, "CONVEYOR_CACHE_BYTES"},
        {index_cache_dir, "CONVEYOR_INDEX_CACHE_DIR"}}) {
    if (!value.empty()) setenv(variable, value.c_str(), 1);
  }
  for (size_t i = 0; i < commands.size(); ++i) {
    if (*subcommands[i]) {
      const int code = Report(subcommands[i]->get_name(), commands[i]->Run());
      return code == 0 ? commands[i]->SuccessExitCode() : code;
    }
  }
  return 2;
}
