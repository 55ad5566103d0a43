// The `conveyor` subcommands as library functions, so tests and other tools can call them.
// Each returns a Status whose message is what the user sees after "error: ".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pipeline/frame_cache.h"
#include "server/server.h"

namespace CLI {
class App;
}

namespace conveyor {
class Dataset;
}  // namespace conveyor

namespace conveyor::tools {

// The decoded-frame cache's flags (conveyor batches, serve, bench; docs/pipeline.md "The
// decoded-frame cache"), mirroring FrameCacheConfig (pipeline/frame_cache.h).
struct FrameCacheFlags {
  uint64_t bytes = 0;                // --frame-cache-bytes: in memory, per process
  std::string policy = "pin";        // --frame-cache-policy
  std::string dir;                   // --frame-cache-dir (CONVEYOR_FRAME_CACHE_DIR): node-wide
  uint64_t dir_bytes = 0;            // --frame-cache-dir-bytes (CONVEYOR_FRAME_CACHE_DIR_BYTES)
  std::string shared_key;            // --frame-cache-shared-key (CONVEYOR_FRAME_CACHE_SHARED_KEY)
  std::string compression = "none";  // --frame-cache-compression
  bool prefault = false;             // --frame-cache-prefault: the memory tier's pages, before the job
};
// Registers them on a subcommand.
void AddFrameCacheFlags(CLI::App* c, FrameCacheFlags* f);
FrameCacheConfig ToConfig(const FrameCacheFlags& f);
// The same cache for a server: its frame_cache_* options (not the pre-fault, which is the caller's).
void ApplyFrameCache(const FrameCacheFlags& f, ServerOptions* so);
// One line of what the cache did (--stats).
std::string FrameCacheSummary(const FrameCacheStats& stats, const std::string& policy);

struct SynthOptions {
  std::string out;
  int episodes = 8;
  int cameras = 3;
  int width = 224;
  int height = 224;
  double fps = 30;
  int gop = 30;
  std::string video_codec = "h264";  // h264, hevc, av1, vp9
  std::string audio_codec = "aac";   // aac, opus, flac, none
  int audio_rate = 16000;
  int state_dim = 14;
  int action_dim = 14;
  double lowdim_rate = 50;
  double min_seconds = 10;
  double max_seconds = 30;
  int episodes_per_shard = 64;
  uint64_t seed = 0;
  int threads = 0;  // 0: one per core
  bool progress = true;
  // The text stream holds a video model's caption (VideoCaption) instead of the robot's
  // instruction: `--preset video-model`.
  bool captions = false;
};
absl::Status RunSynth(const SynthOptions& options);

struct ImportOptions {
  std::string from;     // one sub-folder per episode, or a LeRobot dataset root (meta/info.json)
  std::string lerobot;  // a LeRobot dataset root (v3.0 or v2.1); docs/lerobot.md
  std::string out;
  int episodes_per_shard = 64;
  std::string name;  // default: the basename of `from` / `lerobot`
  bool progress = true;
  // LeRobot: how far a row's timestamp may be from frame_index / fps, and a video frame from its
  // row's timestamp, in seconds. LeRobot's own default tolerance_s.
  double tolerance_s = 1e-4;
  // LeRobot: an episode that cannot be read (a missing or corrupt file, a lying length) is left
  // out, logged and listed at the end, instead of failing the import. Episode ids stay dense.
  bool skip_broken = false;
};
// Dispatches to RunImportLeRobot when `lerobot` is set or `from` holds meta/info.json.
absl::Status RunImport(const ImportOptions& options);
absl::Status RunImportLeRobot(const ImportOptions& options);
// Copies every episode of a dataset read in place into a Conveyor dataset at options.out
// (--skip-broken-episodes honoured): images and video packets byte for byte, lowdim bit for bit.
absl::Status ImportDataset(const Dataset& dataset, const ImportOptions& options,
                           const std::string& created_by);
// True when `dir` holds a LeRobot meta/info.json.
bool IsLeRobotRoot(const std::string& dir);

struct ExtractOptions {
  std::string dataset;  // path or URL
  int64_t episode = -1;
  std::string stream;
  std::string out;  // .mp4/.mkv/.webm (video), .wav/.flac/.m4a/.ogg/.mka/.opus (audio), .npy,
                    // .txt (text), or a directory for image streams
};
absl::Status RunExtract(const ExtractOptions& options);

struct InspectOptions {
  std::string dataset;
  bool json = false;
  bool verify = false;  // read every shard and check every checksum
};
absl::Status RunInspect(const InspectOptions& options);

struct SampleOptions {
  std::string dataset;  // path or URL, or a mixture file (docs/mixtures.md)
  std::string member;   // a mixture's dataset whose samples to write (default: its first)
  std::string config;   // YAML sample spec; empty: every stream at its own size, [0.0]
  int64_t count = 8;
  std::string out;      // one folder per sample: <stream>.npy, <stream>_is_pad.npy, meta.json
  uint64_t seed = 0;
  uint64_t epoch = 0;
  int64_t start = 0;    // first sample index
  int64_t stride = 0;   // 0: spread `count` samples evenly from `start` to the end
  std::vector<int64_t> indices;  // explicit sample indices (overrides start/stride)
  int threads = 0;      // 0: one per core; the output is the same at any count
  bool progress = true;
};

absl::Status RunSample(const SampleOptions& options);

struct BatchesOptions {
  std::string dataset;
  std::string config;        // YAML: streams (sample spec), pipeline, packing
  int64_t consumer = 0;
  int64_t consumers = 1;
  std::string cursor = "0:0";  // EPOCH:STEP to start at
  int64_t steps = 10;        // batches to produce
  int threads = -1;          // -1: the config's (default one per core)
  int64_t batch_size = 0;    // 0: the config's pipeline.global_batch_size
  int64_t seed = -1;         // -1: the config's pipeline.seed
  std::string schedule;      // "", "naive" or "gop": overrides pipeline.schedule.mode
  int64_t schedule_version = 0;  // 0: the config's
  FrameCacheFlags frame_cache;  // a decoded-frame cache shared by the run's epochs
  bool digest = false;       // SHA-256 of each batch's tensors
  bool ids = false;          // print every sample id
  bool stats = false;        // amplification, shuffle quality, fill ratio, stage times at the end
  std::string out;           // write each batch's tensors as .npy under out/EPOCH-STEP/
};

absl::Status RunBatches(const BatchesOptions& options);

struct ServeOptions {
  std::string dataset;
  std::vector<std::string> configs;
  std::string listen = "127.0.0.1:7700";
  std::string metrics_listen;
  std::string auth_token_file;
  std::string tls_cert, tls_key, tls_client_ca;
  std::vector<std::string> allow_users, allow_groups;  // names or numbers: ServerOptions::allow_*
  bool loopback_open = false;
  bool plaintext_token = false;
  double job_idle_seconds = 600;
  int threads = 2;
  int cpu_slots = -1;  // ServerOptions::cpu_slots
  uint64_t queue_bytes = 256ull << 20;
  FrameCacheFlags frame_cache;  // shared by every stream (and, with a directory, the node)
  int frame_cache_warm_threads = 0;
  uint64_t max_message_bytes = 4ull << 20;
  bool shared_memory = true;  // accept same-host clients' /dev/shm regions
  int max_streams = 64;
  double stream_progress_timeout_seconds = 300;  // ServerOptions::stream_progress_timeout_seconds
  std::string ready_file;      // written with "ADDRESS [METRICS_ADDRESS]" once serving
  double grace_seconds = 10;
  std::string version;
  ServerLimits limits;
};

// Serves until SIGTERM, SIGINT or SIGHUP, then drains (docs/serving.md).
absl::Status RunServe(const ServeOptions& options);

struct FetchOptions {
  std::string servers;       // comma-separated; default $CONVEYOR_SERVERS
  std::string job = "default";  // the Loader's, train's and audit's too
  int64_t consumer = -1;     // -1 and 0: from the launcher (client/launch_env.h), else 0 of 1
  int64_t consumers = 0;
  std::string cursor = "0:0";
  int64_t schedule_version = 0;  // 0: the config's
  int64_t steps = 10;
  bool digest = false;
  bool ids = false;
  bool stats = false;
  std::string config;        // a config file sent inline; or
  std::string config_name;   // a config the server was started with
  std::string auth_token_file;
  std::string tls_ca;        // PEM roots; giving any TLS option switches to TLS
  std::string tls_cert, tls_key;
  std::string tls_server_name;
  bool tls = false;
  int64_t prefetch = 4;
  uint64_t max_message_bytes = 0;
  bool shared_memory = true;  // offer the same-host transport (docs/serving.md)
  uint64_t shared_memory_bytes = 256ull << 20;
  uint32_t payload_streams = 1;  // striped payloads (docs/serving.md)
  double reconnect_timeout = 60;
  int64_t stall_after = -1;   // tests: stop reading after this many batches (and wait)
  double stall_seconds = 0;
  double step_seconds = 0;    // sleep after each batch: a trainer's compute (tests, demos)
  bool info = false;          // print the server's Info as JSON instead of streaming
};

absl::Status RunFetch(const FetchOptions& options);

struct TrainCliOptions {
  std::string servers;        // default $CONVEYOR_SERVERS
  std::string job = "default";  // the Loader's, fetch's and audit's too
  int64_t rank = -1;          // -1 and 0: from the launcher (client/launch_env.h), else 0 of 1
  int64_t world_size = 0;
  std::string cursor = "0:0";
  std::string config;         // sent inline
  std::string config_name;
  std::string auth_token_file;
  std::string tls_ca;           // PEM roots to verify the servers; giving it switches to TLS
  std::string tls_server_name;  // the name checked in their certificate (default: the address's host)
  int64_t steps = 200;
  double lr = 3e-3;
  int64_t shift_frames = 0;   // anchor steps
  std::string comm = "auto";
  std::string rendezvous;
  std::string comm_host;
  bool device = false;
  std::string json;
  bool quiet = false;
  double step_ms = 0;
  std::string checkpoint;
  int64_t checkpoint_every = 10;
  bool allow_data_change = false;  // resume a checkpoint on other data on purpose
};

// The reference trainer (docs/trainer.md).
absl::Status RunTrain(const TrainCliOptions& options);

}  // namespace conveyor::tools
