// `conveyor bench`'s harness (docs/bench.md): throughput per modality on the user's own dataset,
// each figure beside its limit measured in the same run. A library above tools/ (it runs the
// CLI's own extract and serve paths); the subcommand's flags are bench_command.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/commands.h"

namespace conveyor::tools {

struct BenchOptions {
  std::string dataset;
  std::string config;          // empty: every stream with its defaults
  std::string modality = "all";  // video, image, audio, lowdim or all
  std::vector<int> threads = {1, 2};
  double seconds = 3;          // per figure
  bool serve = true;           // end to end through a server and a client
  std::string json;
  std::string plot;            // PNG (matplotlib)
  std::string markdown;        // one table per modality
  // --plan: the job's target samples/s. Measures only the whole config through a server to a
  // client at each thread count, and prints the server cores the target needs, per GPU.
  double plan = 0;
  int gpus = 1;                // GPUs of the job the target is for
  uint32_t payload_streams = 1;  // gRPC serve rows: striped payloads (docs/serving.md)
  int consumers = 1;           // served rows and --plan: consumers streaming at once (i of N)
  int cpu_slots = -1;          // the server's (ServerOptions::cpu_slots)
  int server_cores = 32;       // cores of one server node, for the server count
  // A decoded-frame cache (--frame-cache-bytes, --frame-cache-dir, ...): adds rows for the video
  // GOP pipeline with it, epoch 1 (cold) and epochs 2+ (warm), and the serve rows with a warm
  // cache in the server beside a warm offline pipeline; the other rows never use it.
  FrameCacheFlags frame_cache;
};

// Throughput per modality beside the limits measured in the same run (docs/bench.md).
absl::Status RunBench(const BenchOptions& options);

}  // namespace conveyor::tools
