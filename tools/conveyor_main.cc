// The `conveyor` command line: one binary, one subcommand per job, `--help` on each.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "base/strings.h"
#include "tools/commands.h"

namespace {

using conveyor::StrCat;

// Parses "WxH".
bool ParseSize(const std::string& text, int* w, int* h) {
  char x = 0;
  char extra = 0;
  return std::sscanf(text.c_str(), "%d%c%d%c", w, &x, h, &extra) == 3 && (x == 'x' || x == 'X');
}

// Parses "S" or "MIN:MAX" seconds.
bool ParseRange(const std::string& text, double* lo, double* hi) {
  char extra = 0;
  if (std::sscanf(text.c_str(), "%lf:%lf%c", lo, hi, &extra) == 2) return true;
  if (std::sscanf(text.c_str(), "%lf%c", lo, &extra) == 1) {
    *hi = *lo;
    return true;
  }
  return false;
}

int Report(const std::string& command, const absl::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "conveyor %s: error: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Conveyor: multimodal training data for robot-learning and video models.\n"
               "Datasets are a manifest plus shards; see docs/format.md."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("conveyor ") + CONVEYOR_VERSION);

  // synth
  conveyor::tools::SynthOptions synth;
  std::string size = "224x224", seconds = "10:30";
  bool synth_quiet = false;
  CLI::App* s = app.add_subcommand("synth", "Generate realistic synthetic robot episodes");
  s->add_option("--out", synth.out, "Output dataset directory (must not exist or be empty)")->required();
  s->add_option("--episodes", synth.episodes, "Number of episodes")->capture_default_str();
  s->add_option("--cameras", synth.cameras, "Cameras per episode")->capture_default_str();
  s->add_option("--size", size, "Frame size WxH")->capture_default_str();
  s->add_option("--fps", synth.fps, "Camera frame rate")->capture_default_str();
  s->add_option("--gop", synth.gop, "Keyframe interval in frames")->capture_default_str();
  s->add_option("--video-codec", synth.video_codec, "h264, hevc, av1 or vp9")->capture_default_str();
  s->add_option("--audio-codec", synth.audio_codec, "aac, opus, flac or none")->capture_default_str();
  s->add_option("--audio-rate", synth.audio_rate, "Audio sample rate (Hz)")->capture_default_str();
  s->add_option("--state-dim", synth.state_dim, "Proprioceptive state dimensions")->capture_default_str();
  s->add_option("--action-dim", synth.action_dim, "Action dimensions")->capture_default_str();
  s->add_option("--lowdim-rate", synth.lowdim_rate, "State/action rate (Hz)")->capture_default_str();
  s->add_option("--episode-seconds", seconds, "Episode length: S or MIN:MAX seconds")->capture_default_str();
  s->add_option("--episodes-per-shard", synth.episodes_per_shard, "Episodes per shard file")->capture_default_str();
  s->add_option("--seed", synth.seed, "Random seed (same seed, same dataset, bit for bit)")->capture_default_str();
  s->add_option("--threads", synth.threads, "Encoding threads (0: one per core)")->capture_default_str();
  s->add_flag("--quiet", synth_quiet, "No progress output");

  // import
  conveyor::tools::ImportOptions import;
  bool import_quiet = false;
  CLI::App* im = app.add_subcommand("import", "Build a dataset from existing files (one folder per episode; see docs/import.md)");
  im->add_option("--from", import.from, "Folder holding one sub-folder per episode")->required();
  im->add_option("--out", import.out, "Output dataset directory")->required();
  im->add_option("--name", import.name, "Dataset name (default: the input folder's name)");
  im->add_option("--episodes-per-shard", import.episodes_per_shard, "Episodes per shard file")->capture_default_str();
  im->add_flag("--quiet", import_quiet, "No progress output");

  // inspect
  conveyor::tools::InspectOptions inspect;
  CLI::App* in = app.add_subcommand("inspect", "Describe a dataset: episodes, streams, shards, statistics");
  in->add_option("dataset", inspect.dataset, "Dataset path or URL (http://host:port/prefix/)")->required();
  in->add_flag("--json", inspect.json, "Print one JSON object");
  in->add_flag("--verify", inspect.verify, "Read every shard and check every checksum");

  // extract
  conveyor::tools::ExtractOptions extract;
  CLI::App* ex = app.add_subcommand("extract", "Write one stream of one episode as a standard file");
  ex->add_option("dataset", extract.dataset, "Dataset path or URL")->required();
  ex->add_option("--episode", extract.episode, "Episode number (0-based)")->required();
  ex->add_option("--stream", extract.stream, "Stream name (see `conveyor inspect`)")->required();
  ex->add_option("--out", extract.out,
                 "Output file: .mp4/.mkv/.webm (video), .wav/.flac/.m4a/.mka/.ogg (audio), .npy (lowdim), .txt (text), a directory (images)")
      ->required();

  // sample
  conveyor::tools::SampleOptions sample;
  bool sample_quiet = false;
  CLI::App* sa = app.add_subcommand(
      "sample", "Assemble samples as training sees them and write each as .npy files + meta.json");
  sa->add_option("dataset", sample.dataset, "Dataset path or URL")->required();
  sa->add_option("--config", sample.config,
                 "Sample spec (YAML, see docs/sampling.md); default: every stream at t=0");
  sa->add_option("--count", sample.count, "Number of samples")->check(CLI::PositiveNumber);
  sa->add_option("--out", sample.out, "Output directory (one sub-folder per sample)")->required();
  sa->add_option("--seed", sample.seed, "Augmentation seed");
  sa->add_option("--epoch", sample.epoch, "Epoch (augmentation draws depend on it)");
  sa->add_option("--start", sample.start, "First sample index")->check(CLI::NonNegativeNumber);
  sa->add_option("--stride", sample.stride, "Step between sample indices (default: spread evenly)")
      ->check(CLI::NonNegativeNumber);
  sa->add_option("--indices", sample.indices, "Explicit sample indices (comma-separated)")
      ->delimiter(',');
  sa->add_option("--threads", sample.threads, "Worker threads (0 = one per core)")
      ->check(CLI::NonNegativeNumber);
  sa->add_flag("--quiet", sample_quiet, "No progress output");

  // batches
  conveyor::tools::BatchesOptions batches;
  CLI::App* ba = app.add_subcommand(
      "batches", "Run the pipeline offline: one line per batch (cursor, sample ids, SHA-256)");
  ba->add_option("dataset", batches.dataset, "Dataset path or URL")->required();
  ba->add_option("--config", batches.config, "Config (YAML): streams, pipeline, packing")->required();
  ba->add_option("--consumer", batches.consumer, "This consumer's index (rank)")->check(CLI::NonNegativeNumber);
  ba->add_option("--consumers", batches.consumers, "Number of consumers (ranks)")->check(CLI::PositiveNumber);
  ba->add_option("--cursor", batches.cursor, "Start at EPOCH:STEP");
  ba->add_option("--steps", batches.steps, "Batches to produce")->check(CLI::PositiveNumber);
  ba->add_option("--threads", batches.threads, "Worker threads (0 = one per core)")->check(CLI::NonNegativeNumber);
  ba->add_option("--batch-size", batches.batch_size, "Global batch size (overrides the config)")->check(CLI::PositiveNumber);
  ba->add_option("--seed", batches.seed, "Seed (overrides the config)")->check(CLI::NonNegativeNumber);
  ba->add_option("--schedule", batches.schedule, "naive or gop (overrides the config)");
  ba->add_flag("--digest", batches.digest, "Print the SHA-256 of each batch's tensors");
  ba->add_flag("--ids", batches.ids, "Print every sample id (episode/step)");
  ba->add_flag("--stats", batches.stats, "Print amplification, shuffle quality, fill ratio and stage times");
  ba->add_option("--out", batches.out, "Write each batch's tensors as .npy under DIR/EPOCH-STEP/");

  // serve
  conveyor::tools::ServeOptions serve;
  serve.version = CONVEYOR_VERSION;
  CLI::App* sv = app.add_subcommand("serve", "Serve batches over gRPC to training workers (docs/serving.md)");
  sv->add_option("dataset", serve.dataset, "Dataset path or URL")->required();
  sv->add_option("--config", serve.configs, "Config (YAML); repeat for several, named by file stem; the first is the default")->required();
  sv->add_option("--listen", serve.listen, "Address to listen on (port 0: pick a free one); beyond loopback needs --auth-token-file or TLS with --tls-client-ca")->capture_default_str();
  sv->add_option("--metrics-listen", serve.metrics_listen, "Serve Prometheus metrics on http://ADDR/metrics");
  sv->add_option("--auth-token-file", serve.auth_token_file, "File holding the bearer token clients must send");
  sv->add_option("--tls-cert", serve.tls_cert, "TLS certificate chain (PEM)");
  sv->add_option("--tls-key", serve.tls_key, "TLS private key (PEM)");
  sv->add_option("--tls-client-ca", serve.tls_client_ca, "Require client certificates signed by this CA (PEM)");
  sv->add_option("--threads", serve.threads, "Decode workers per stream")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--queue-bytes", serve.queue_bytes, "Byte budget of samples in flight per stream")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-message-bytes", serve.max_message_bytes, "Largest message; batches are split")->capture_default_str();
  sv->add_option("--max-streams", serve.max_streams, "Concurrent streams")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--ready-file", serve.ready_file, "Write the bound address here once serving");
  sv->add_option("--grace-seconds", serve.grace_seconds, "Drain time on SIGTERM")->capture_default_str()->check(CLI::NonNegativeNumber);
  // Ceilings no request can raise (docs/serving.md "Ceilings").
  sv->add_option("--stream-memory-bytes", serve.limits.stream_memory_bytes, "Per stream: pre-decoded frames + samples in flight + batch buffers, estimated before a stream starts")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-global-batch-size", serve.limits.max_global_batch_size, "Largest global batch a request may ask for")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-pixels", serve.limits.max_pixels, "Largest decoded frame or output image, in pixels")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-frames-per-sample", serve.limits.max_frames_per_sample, "Most frames per stream and sample")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-audio-samples", serve.limits.max_audio_samples, "Longest audio window, in samples per channel")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-sample-bytes", serve.limits.max_sample_bytes, "Largest sample (all its tensors)")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-batch-bytes", serve.limits.max_batch_bytes, "Largest consumer batch")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--max-streams-per-peer", serve.limits.max_streams_per_peer, "Concurrent streams per client address")->capture_default_str()->check(CLI::PositiveNumber);

  // fetch
  conveyor::tools::FetchOptions fetch;
  CLI::App* fe = app.add_subcommand("fetch", "Stream batches from data servers (smoke tests, audits; --digest equals `conveyor batches --digest`)");
  fe->add_option("--servers", fetch.servers, "HOST:PORT[,HOST:PORT...] (default: $CONVEYOR_SERVERS); fails over in turn");
  fe->add_option("--job", fetch.job, "Job name (metrics, logs)")->capture_default_str();
  fe->add_option("--consumer", fetch.consumer, "This consumer's index (rank)")->check(CLI::NonNegativeNumber);
  fe->add_option("--consumers", fetch.consumers, "Number of consumers (ranks)")->check(CLI::PositiveNumber);
  fe->add_option("--cursor", fetch.cursor, "Start at EPOCH:STEP")->capture_default_str();
  fe->add_option("--steps", fetch.steps, "Batches to stream (0: to the end of the stream)")->capture_default_str()->check(CLI::NonNegativeNumber);
  fe->add_flag("--digest", fetch.digest, "Print the SHA-256 of each batch's tensors");
  fe->add_flag("--ids", fetch.ids, "Print every sample id (episode/step)");
  fe->add_flag("--stats", fetch.stats, "Print throughput, reconnects and waiting time at the end");
  auto* fe_config = fe->add_option("--config", fetch.config, "Send this config (YAML) instead of using one of the server's");
  fe->add_option("--config-name", fetch.config_name, "Use the server's config of this name (default: its first)")->excludes(fe_config);
  fe->add_option("--auth-token-file", fetch.auth_token_file, "File holding the bearer token");
  fe->add_flag("--tls", fetch.tls, "Use TLS with the system's roots");
  fe->add_option("--tls-ca", fetch.tls_ca, "Verify the server with these roots (PEM); implies --tls");
  fe->add_option("--tls-cert", fetch.tls_cert, "Client certificate (PEM); implies --tls");
  fe->add_option("--tls-key", fetch.tls_key, "Client key (PEM)");
  fe->add_option("--tls-server-name", fetch.tls_server_name, "Name to check in the server's certificate");
  fe->add_option("--prefetch", fetch.prefetch, "Batches received ahead")->capture_default_str()->check(CLI::PositiveNumber);
  fe->add_option("--max-message-bytes", fetch.max_message_bytes, "Ask for messages of at most this size (0: the server's)");
  fe->add_option("--reconnect-timeout", fetch.reconnect_timeout, "Give up after this many seconds without a batch")->capture_default_str();
  fe->add_option("--stall-after", fetch.stall_after, "Testing: stop reading after this many batches...");
  fe->add_option("--stall-seconds", fetch.stall_seconds, "...for this long");
  fe->add_flag("--info", fetch.info, "Print the server's dataset and configs (JSON) and exit");

  // train
  conveyor::tools::TrainCliOptions train;
  CLI::App* tr = app.add_subcommand("train", "The reference trainer: one rank of a data-parallel run, with step-time attribution (docs/trainer.md)");
  tr->add_option("--servers", train.servers, "HOST:PORT[,...] (default: $CONVEYOR_SERVERS)");
  tr->add_option("--job", train.job, "Job name")->capture_default_str();
  tr->add_option("--rank", train.rank, "This rank (default: $RANK, else 0)");
  tr->add_option("--world-size", train.world_size, "Ranks (default: $WORLD_SIZE, else 1)");
  tr->add_option("--cursor", train.cursor, "Start at EPOCH:STEP")->capture_default_str();
  auto* tr_config = tr->add_option("--config", train.config, "Config (YAML) to send");
  tr->add_option("--config-name", train.config_name, "The server's config of this name")->excludes(tr_config);
  tr->add_option("--auth-token-file", train.auth_token_file, "Bearer token file");
  tr->add_option("--steps", train.steps, "Training steps")->capture_default_str()->check(CLI::PositiveNumber);
  tr->add_option("--lr", train.lr, "Adam learning rate")->capture_default_str();
  tr->add_option("--shift-frames", train.shift_frames, "Deliberately shift the cameras by this many anchor steps (misalignment check)");
  tr->add_option("--comm", train.comm, "auto, gloo, nccl or none")->capture_default_str();
  tr->add_option("--rendezvous", train.rendezvous, "Directory every rank sees (gloo, nccl)");
  tr->add_option("--comm-host", train.comm_host, "gloo: address to listen on (default: the hostname)");
  tr->add_flag("--device", train.device, "Deliver batches to the GPU (CUDA builds)");
  tr->add_option("--json", train.json, "Write per-step times and the summary as JSON");
  tr->add_flag("--quiet", train.quiet, "No progress output");

  // bench
  conveyor::tools::BenchOptions bench;
  bool bench_no_serve = false;
  CLI::App* be = app.add_subcommand("bench", "Throughput per modality on this dataset, each figure beside its limit (docs/bench.md)");
  be->add_option("dataset", bench.dataset, "Dataset path or URL")->required();
  be->add_option("--config", bench.config, "Config (YAML); default: every stream with its defaults");
  be->add_option("--modality", bench.modality, "video, image, audio, lowdim or all")->capture_default_str();
  be->add_option("--threads", bench.threads, "Thread counts, e.g. 1,2")->delimiter(',')->capture_default_str();
  be->add_option("--seconds", bench.seconds, "Seconds per figure")->capture_default_str();
  be->add_flag("--no-serve", bench_no_serve, "Skip the end-to-end run through a server");
  be->add_option("--json", bench.json, "Write every figure as JSON");
  be->add_option("--plot", bench.plot, "Write a PNG plot (needs python3-matplotlib)");
  be->add_option("--markdown", bench.markdown, "Write one Markdown table per modality");

  bool known = argc < 2 || argv[1][0] == '-';
  for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->check_name(argv[1]);
  if (!known) {
    std::fprintf(stderr, "conveyor: error: unknown command '%s' (expected synth, import, inspect, extract, sample, batches, serve, fetch, train or bench; see --help)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  if (*s) {
    if (!ParseSize(size, &synth.width, &synth.height)) {
      return Report("synth", absl::InvalidArgumentError(StrCat("--size '", size, "' is not WxH (e.g. 224x224)")));
    }
    if (!ParseRange(seconds, &synth.min_seconds, &synth.max_seconds)) {
      return Report("synth", absl::InvalidArgumentError(
                                 StrCat("--episode-seconds '", seconds, "' is not S or MIN:MAX")));
    }
    synth.progress = !synth_quiet;
    return Report("synth", conveyor::tools::RunSynth(synth));
  }
  if (*im) {
    import.progress = !import_quiet;
    return Report("import", conveyor::tools::RunImport(import));
  }
  if (*in) return Report("inspect", conveyor::tools::RunInspect(inspect));
  if (*ex) return Report("extract", conveyor::tools::RunExtract(extract));
  if (*ba) return Report("batches", conveyor::tools::RunBatches(batches));
  if (*sv) return Report("serve", conveyor::tools::RunServe(serve));
  if (*fe) return Report("fetch", conveyor::tools::RunFetch(fetch));
  if (*tr) return Report("train", conveyor::tools::RunTrain(train));
  if (*be) {
    bench.serve = !bench_no_serve;
    return Report("bench", conveyor::tools::RunBench(bench));
  }
  if (*sa) {
    sample.progress = !sample_quiet;
    return Report("sample", conveyor::tools::RunSample(sample));
  }
  return 2;
}
