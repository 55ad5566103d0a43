// pipeline_bench: end-to-end samples/s of the pipeline for the default robot spec (3 cameras,
// examples/pipeline.yaml's streams) at 1 and 2 worker threads, naive vs GOP-scheduled; decode
// amplification and shuffle quality per mode and window size; peak queue bytes and RSS against the
// configured budget. Baseline measured in the same run: the ffmpeg CLI decoding the same camera
// stream on one core, turned into the samples/s that decode speed allows at the measured
// amplification (frames decoded per sample).
//
// Usage: pipeline_bench [--quick] [--work_dir=DIR] [--json=FILE]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline.h"
#include "shuffle/quality.h"

namespace conveyor {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

// The input is looped 10 times so process start-up is a small part of the time.
double FfmpegFramesPerSecond(const std::string& file, int64_t frames) {
  double best = 1e30;
  frames *= 10;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    Sh("ffmpeg -v error -nostdin -threads 1 -stream_loop 9 -i '" + file +
       "' -pix_fmt rgb24 -f null - >/dev/null 2>&1");
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return frames / best;
}

struct RunResult {
  double samples_per_s = 0;
  double mb_per_s = 0;
  PipelineStats stats;
  PipelineOptions resolved;
};

RunResult RunPipeline(const Dataset& ds, const SampleSpec& spec, PipelineOptions o, int steps) {
  RunResult r;
  auto p = Pipeline::Create(ds, spec, o, {0, 0});
  if (!p.ok()) {
    std::cerr << "pipeline: " << p.status() << "\n";
    std::exit(1);
  }
  // Timed from the start, pre-decoding included: a GOP-scheduled run pays for its windows.
  const auto t0 = Clock::now();
  uint64_t samples = 0, bytes = 0;
  for (int i = 0; i < steps; ++i) {
    auto b = (*p)->Next();
    if (!b.ok()) {
      std::cerr << "batch: " << b.status() << "\n";
      std::exit(1);
    }
    if (!b->has_value()) break;
    samples += (*b)->ids.size();
    bytes += (*b)->bytes();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  r.samples_per_s = samples / secs;
  r.mb_per_s = bytes / 1e6 / secs;
  r.stats = (*p)->stats();
  r.resolved = (*p)->options();
  return r;
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  using namespace conveyor;
  bool quick = false;
  std::string work, json_path = "bench/out/pipeline_bench.json";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a.rfind("--work_dir=", 0) == 0) work = a.substr(11);
    else if (a.rfind("--json=", 0) == 0) json_path = a.substr(7);
    else {
      std::cerr << "usage: pipeline_bench [--quick] [--work_dir=DIR] [--json=FILE]\n";
      return 2;
    }
  }
  const bool temp = work.empty();
  if (temp) work = (std::filesystem::temp_directory_path() / "conveyor-pipeline-bench").string();
  std::filesystem::create_directories(work);
  const std::string ds_dir = work + (quick ? "/ds-quick" : "/ds");
  const std::string cli = CONVEYOR_CLI;
  if (!std::filesystem::exists(ds_dir + "/manifest.json")) {
    std::cerr << "pipeline_bench: making the dataset with conveyor synth\n";
    const std::string args = quick ? " --episodes 3 --episode-seconds 4 --size 96x96"
                                   : " --episodes 8 --episode-seconds 20";
    if (Sh(cli + " synth --quiet --out '" + ds_dir + "'" + args) != 0) return 1;
  }
  auto ds = Dataset::Open(ds_dir);
  if (!ds.ok()) {
    std::cerr << ds.status() << "\n";
    return 1;
  }
  std::ifstream f(std::string(CONVEYOR_BENCH_SOURCE_DIR) + "/examples/pipeline.yaml");
  std::stringstream yaml;
  yaml << f.rdbuf();
  std::string text = yaml.str();
  if (quick) {  // the quick dataset is 96x96: decode at its own size
    for (const char* from : {"    size: [224, 224]\n"}) {
      for (size_t pos; (pos = text.find(from)) != std::string::npos;) text.erase(pos, std::string(from).size());
    }
  }
  auto spec = SampleSpec::FromYaml(text, (*ds)->manifest(), "examples/pipeline.yaml");
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 1;
  }
  PipelineOptions base;
  if (auto st = base.MergeYaml(text, *spec, (*ds)->manifest(), "examples/pipeline.yaml"); !st.ok()) {
    std::cerr << st << "\n";
    return 1;
  }
  // Baseline: the ffmpeg CLI decoding cam0 of episode 0 (decode + RGB conversion), one core.
  const std::string mp4 = work + "/cam0.mp4";
  std::filesystem::remove(mp4);
  Sh(cli + " extract '" + ds_dir + "' --episode 0 --stream cam0 --out '" + mp4 + "' >/dev/null 2>&1");
  auto ep = (*ds)->LoadEpisode(0);
  const int64_t frames = (*ep)->streams((*ds)->manifest().StreamIndex("cam0")).packets().pts_size();
  const double ffmpeg_fps = FfmpegFramesPerSecond(mp4, frames);

  double frames_per_sample = 0;  // video frames delivered per sample
  for (const StreamSpec& s : spec->streams) {
    if (s.kind == format::v1::VIDEO) frames_per_sample += static_cast<double>(s.deltas.size());
  }
  json out = {{"machine", {{"nproc", std::thread::hardware_concurrency()}}},
              {"dataset", ds_dir}, {"ffmpeg_rgb_frames_per_s_one_core", ffmpeg_fps}};
  const int steps = quick ? 4 : 60;
  std::printf("pipeline_bench: default robot spec (3 cameras x 2 frames, state, 50 actions, 1 s audio), "
              "global batch %llu; ffmpeg -threads 1 decode+rgb24: %.0f frames/s\n\n",
              static_cast<unsigned long long>(base.global_batch_size), ffmpeg_fps);
  std::printf("%-6s %-7s %12s %10s %8s %14s %12s %8s %14s %10s\n", "mode", "threads", "samples/s",
              "MB/s", "amplif.", "decode bound", "ratio", "2T/1T", "peak queue MB", "budget MB");
  json runs = json::array();
  for (const char* mode : {"naive", "gop"}) {
    double one = 0;
    for (int threads : {1, 2}) {
      PipelineOptions o = base;
      o.threads = threads;
      if (std::string(mode) == "naive") o.order = OrderOptions{};
      const RunResult r = RunPipeline(**ds, *spec, o, steps);
      // Frames decoded per sample at this amplification: the most samples/s `threads` cores of
      // ffmpeg-speed decoding allow (everything else free).
      const double decoded_per_sample = r.stats.amplification() * frames_per_sample;
      const double bound = decoded_per_sample > 0 ? ffmpeg_fps * threads / decoded_per_sample : 0;
      if (threads == 1) one = r.samples_per_s;
      std::printf("%-6s %-7d %12.1f %10.1f %8.3f %14.1f %12.2f %8s %14.1f %10.1f\n", mode, threads,
                  r.samples_per_s, r.mb_per_s, r.stats.amplification(), bound,
                  bound > 0 ? r.samples_per_s / bound : 0,
                  threads == 2 ? absl::StrFormat("%.2fx", r.samples_per_s / one).c_str() : "",
                  r.stats.queue_bytes_peak / 1e6, o.queue_bytes / 1e6);
      runs.push_back({{"mode", mode}, {"threads", threads}, {"samples_per_s", r.samples_per_s},
                      {"mb_per_s", r.mb_per_s}, {"amplification", r.stats.amplification()},
                      {"decode_bound_samples_per_s", bound},
                      {"block_steps", r.resolved.order.block_steps},
                      {"window_blocks", r.resolved.order.window_blocks},
                      {"queue_bytes_peak", r.stats.queue_bytes_peak},
                      {"cache_bytes_peak", r.stats.prefetch_bytes_peak},
                      {"queue_bytes_budget", o.queue_bytes},
                      {"decode_s", r.stats.decode_seconds}, {"assemble_s", r.stats.assemble_seconds},
                      {"consumer_wait_s", r.stats.wait_seconds}});
    }
  }
  out["runs"] = runs;

  // Amplification and shuffle quality by window size (one thread, fewer steps).
  std::printf("\n%-22s %8s %22s %22s %14s\n", "schedule", "amplif.", "same-episode neighbours",
              "episodes per batch", "step gap");
  auto index = SampleIndex::Build(**ds, spec->anchor_stream);
  json quality = json::array();
  std::vector<OrderOptions> modes = {OrderOptions{}, OrderOptions{0, 4}, OrderOptions{0, 16},
                                     OrderOptions{0, 32}, OrderOptions{0, 64}};
  for (OrderOptions m : modes) {
    PipelineOptions o = base;
    o.threads = 2;
    o.order = m;
    o.queue_bytes = 4ull << 30;  // large enough that the window size is what is set here
    // Whole windows (two of them), so a window's pre-decode is not charged to a part of it.
    const uint64_t window_samples = (m.block_steps ? m.block_steps : 50) * std::max<uint64_t>(1, m.window_blocks);
    const int q_steps = quick ? 3
                              : static_cast<int>(std::min<uint64_t>(
                                    index->size() / o.global_batch_size,
                                    std::max<uint64_t>(20, (2 * window_samples + o.global_batch_size - 1) /
                                                               o.global_batch_size)));
    const RunResult r = RunPipeline(**ds, *spec, o, q_steps);
    const OrderOptions used = r.resolved.order;
    const EpochOrder order(index->size(), OrderKey((*ds)->manifest().fingerprint, o.seed), 0,
                           used);
    const ShuffleQuality q = MeasureShuffle(order, *index, 0, o.global_batch_size, 1u << 20);
    const std::string name = used.naive() ? "naive" : absl::StrFormat("gop %llu x %llu",
        static_cast<unsigned long long>(used.block_steps), static_cast<unsigned long long>(used.window_blocks));
    std::printf("%-22s %8.3f %10.4f (unif %.4f) %10.2f (unif %.2f) %14.1f\n", name.c_str(),
                r.stats.amplification(), q.same_episode_adjacent, q.same_episode_expected,
                q.episodes_per_batch, q.episodes_per_batch_expected, q.mean_abs_step_gap);
    quality.push_back({{"schedule", name}, {"amplification", r.stats.amplification()},
                       {"same_episode_adjacent", q.same_episode_adjacent},
                       {"same_episode_uniform", q.same_episode_expected},
                       {"episodes_per_batch", q.episodes_per_batch},
                       {"episodes_per_batch_uniform", q.episodes_per_batch_expected},
                       {"mean_abs_step_gap", q.mean_abs_step_gap},
                       {"cache_bytes_peak", r.stats.prefetch_bytes_peak}});
  }
  out["quality"] = quality;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  out["max_rss_bytes"] = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  std::printf("\npeak RSS of this process: %.1f MB (the largest budget above: 4096 MB)\n",
              ru.ru_maxrss / 1024.0);
  std::filesystem::create_directories(std::filesystem::path(json_path).parent_path());
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf("wrote %s\n", json_path.c_str());
  if (temp && quick) std::filesystem::remove_all(work);
  return 0;
}
