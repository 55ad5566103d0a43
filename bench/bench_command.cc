// `conveyor bench`: its flags (tools/command.h); the harness is bench.h. Linked into the
// `conveyor` executable from here, so the CLI keeps the subcommand while tools/ does not depend on
// the harness above it.
#include <CLI/CLI.hpp>

#include <memory>

#include "bench/bench.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {

// `conveyor bench`: its flags and its run (tools/command.h).
class BenchCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("bench", "Throughput per modality on this dataset, each figure beside its limit (docs/bench.md)");
    c->add_option("dataset", o_.dataset, "Dataset path or URL")->required();
    c->add_option("--config", o_.config, "Config (YAML); default: every stream with its defaults");
    c->add_option("--modality", o_.modality, "video, image, audio, lowdim or all")->capture_default_str();
    c->add_option("--threads", o_.threads, "Thread counts, e.g. 1,2")->delimiter(',')->capture_default_str();
    c->add_option("--seconds", o_.seconds, "Seconds per figure")->capture_default_str();
    c->add_flag("--no-serve", no_serve_, "Skip the end-to-end run through a server");
    c->add_option("--json", o_.json, "Write every figure as JSON");
    c->add_option("--plot", o_.plot, "Write a PNG plot (needs python3-matplotlib)");
    c->add_option("--markdown", o_.markdown, "Write one Markdown table per modality");
    c->add_option("--plan", o_.plan, "Capacity plan: the job's target samples/s; measures the whole config through a server per thread count and prints the server cores needed, per GPU");
    c->add_option("--gpus", o_.gpus, "--plan: GPUs of the job")->capture_default_str();
    c->add_option("--consumers", o_.consumers,
                  "Served rows and --plan: the job's consumers (data-parallel ranks) streaming at "
                  "once, consumer i of N; each stream decodes what its samples need, so a job of "
                  "more ranks costs the server more per sample")
        ->capture_default_str();
    c->add_option("--payload-streams", o_.payload_streams,
                  "gRPC serve rows: each stream's payloads over this many more streams, each on its "
                  "own connection (1 to 8; docs/serving.md \"Striped payloads\")")
        ->capture_default_str()->check(CLI::Range(1, 8));
    c->add_option("--cpu-slots", o_.cpu_slots,
                  "Serve rows: the server's bound on decode workers computing at once over all streams "
                  "(as `conveyor serve --cpu-slots`; default: one more than the CPUs this process may use; 0: none)")
        ->check(CLI::Range(0, 1024));
    c->add_option("--server-cores", o_.server_cores, "--plan: cores of one server node")->capture_default_str();
    // With a frame cache: rows for the video gop pipeline with it, epoch 1 and epochs 2+, and
    // the serve rows with a warm cache (the other rows never use it).
    AddFrameCacheFlags(c, &o_.frame_cache);
    return c;
  }
  absl::Status Run() override {
    o_.serve = !no_serve_;
    return RunBench(o_);
  }

 private:
  BenchOptions o_;
  bool no_serve_ = false;
};

std::unique_ptr<Command> NewBenchCommand() {
  return std::make_unique<BenchCommand>();
}

}  // namespace conveyor::tools
