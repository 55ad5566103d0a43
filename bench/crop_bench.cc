// crop_bench: the CPU path of a video model's clips (issue 40 item 6) against the ffmpeg CLI doing
// the same decode, crop and scale, measured in the same run.
//
// Inputs: `conveyor synth --preset video-model` clips (1280x720 H.264, 24 fps, GOP 24), one
// dataset, each episode's camera also extracted to .mp4 with `conveyor extract` for the CLI. Each
// clip gets one random resized crop (64-100 % of the area, aspect 3:4 to 4:3, the example
// config's; drawn with Conveyor's SampleRng from a fixed seed), used for all its frames: one clip
// per video, as a video model samples. Every frame of every clip is decoded, cropped and resized to
// 256x256 RGB24, --passes times over, on --threads threads (clips dealt round robin). Rows:
//
//   conveyor, crop in decoder  VideoDecoder with VideoOutput::crop (pipeline version 4): one
//                              libswscale pass from the crop rectangle of the decoded planes to
//                              256x256 RGB (bilinear, the spec's default resize)
//   conveyor, crop from RGB    the full 1280x720 frame in RGB, then the crop resized by
//                              ResizeRgb (versions 1 to 3)
//   ffmpeg CLI                 per thread, one process per clip, one after the other:
//                                ffmpeg -threads 1 -filter_threads 1 -stream_loop P-1 -i CLIP
//                                  -vf crop=W:H:X:Y,scale=256:256:flags=bilinear -pix_fmt rgb24
//                                  -f null -
//   ffmpeg CLI, decode only    the same without -vf and -pix_fmt: what decoding alone costs
//
// Each figure is frames/s per core (all threads' frames / wall clock / threads), the best of --reps
// runs; the runs alternate. The ratio is Conveyor's crop-in-decoder rate over the CLI's. Prints a
// table and one JSON line, and writes the JSON to --json.
//
// Usage: crop_bench [--clips=8] [--seconds=4] [--passes=3] [--threads=2] [--reps=3]
//                   [--work_dir=DIR] [--json=FILE] [--conveyor=PATH]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "base/strings.h"
#include "bench/machine_info.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "media/video_decoder.h"
#include "sample/augment.h"
#include <nlohmann/json.hpp>

namespace conveyor {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct Flags {
  int clips = 8;
  int seconds = 4;
  int passes = 3;
  int threads = 2;
  int reps = 3;
  std::string work_dir;
  std::string json_path;
  std::string conveyor = CONVEYOR_CLI;
};

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "crop_bench: " << what << "\n";
  std::exit(1);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    auto num = [&](absl::string_view prefix, int* out) {
      if (!absl::ConsumePrefix(&a, prefix)) return false;
      if (!absl::SimpleAtoi(a, out) || *out < 1) Die(StrCat(prefix, " needs a positive integer"));
      return true;
    };
    if (num("--clips=", &f.clips) || num("--seconds=", &f.seconds) ||
        num("--passes=", &f.passes) || num("--threads=", &f.threads) || num("--reps=", &f.reps)) {
      continue;
    }
    if (absl::ConsumePrefix(&a, "--work_dir=")) {
      f.work_dir = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--json=")) {
      f.json_path = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--conveyor=")) {
      f.conveyor = std::string(a);
    } else {
      Die(StrCat("unknown argument '", a,
                 "'; usage: crop_bench [--clips=8] [--seconds=4] [--passes=3] [--threads=2] "
                 "[--reps=3] [--work_dir=DIR] [--json=FILE] [--conveyor=PATH]"));
    }
  }
  return f;
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void Shell(const std::string& command) {
  if (std::system(command.c_str()) != 0) Die(StrCat("failed: ", command));
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Clip {
  uint64_t episode = 0;
  std::string mp4;
  std::shared_ptr<const format::v1::EpisodeIndex> index;
  FrameTable table;
  VideoCrop crop;
};

// Runs `work(thread, clip)` for the clips dealt to each of `threads` threads, `passes` times over;
// returns the wall clock.
template <typename Work>
double OnThreads(int threads, int passes, size_t clips, Work work) {
  const double start = Now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int p = 0; p < passes; ++p) {
        for (size_t c = static_cast<size_t>(t); c < clips; c += static_cast<size_t>(threads)) {
          work(t, c, p);
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return Now() - start;
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::string work = flags.work_dir;
  const bool temp = work.empty();
  if (temp) work = (fs::temp_directory_path() / StrCat("crop_bench_", getpid())).string();
  fs::create_directories(work);
  const std::string ds_dir = work + "/ds";
  const std::string synth =
      StrCat(Quote(flags.conveyor), " synth --quiet --out ", Quote(ds_dir),
             " --preset video-model --episodes ", flags.clips, " --episode-seconds ",
             flags.seconds, " --seed 1");
  if (!fs::exists(ds_dir + "/manifest.json")) {
    std::cerr << "crop_bench: $ " << synth << "\n";
    Shell(synth);
  }
  auto ds = Dataset::Open(ds_dir);
  if (!ds.ok()) Die(StrCat(ds_dir, ": ", ds.status().ToString()));
  const int stream = (*ds)->manifest().StreamIndex("cam0");
  if (stream < 0) Die(StrCat(ds_dir, " has no cam0"));

  // The example config's crop (examples/video_model.yaml), one draw per clip.
  ImageAugment aug;
  aug.crop = RandomResizedCrop{0.64, 1.0, 0.75, 4.0 / 3.0};
  std::vector<Clip> clips;
  int64_t frames_per_pass = 0;
  for (uint64_t e = 0; e < static_cast<uint64_t>(flags.clips); ++e) {
    Clip c;
    c.episode = e;
    c.mp4 = StrCat(work, "/clip_", e, ".mp4");
    if (!fs::exists(c.mp4)) {
      Shell(StrCat(Quote(flags.conveyor), " extract ", Quote(ds_dir), " --episode ", e,
                   " --stream cam0 --out ", Quote(c.mp4), " >/dev/null"));
    }
    auto index = (*ds)->LoadEpisode(e);
    if (!index.ok()) Die(index.status().ToString());
    c.index = *index;
    auto table = FrameTable::Build(c.index->streams(stream));
    if (!table.ok()) Die(table.status().ToString());
    c.table = std::move(*table);
    const DisplayedSize shown = DisplayedSizeOf(c.index->streams(stream), true);
    SampleRng rng(0, 0, e, static_cast<uint64_t>(stream));
    const ImageDraw d = DrawImageAugment(aug, shown.width, shown.height, &rng);
    c.crop = VideoCrop{d.x, d.y, d.w, d.h};
    frames_per_pass += static_cast<int64_t>(c.table.size());
    clips.push_back(std::move(c));
  }
  const int64_t frames = frames_per_pass * flags.passes;
  const auto& codec = clips[0].index->streams(stream).codec();

  // Conveyor: one VideoDecoder per thread; every frame of a clip in one call.
  auto conveyor = [&](bool in_decoder) {
    std::vector<std::unique_ptr<VideoDecoder>> decoders;
    for (int t = 0; t < flags.threads; ++t) decoders.push_back(std::make_unique<VideoDecoder>());
    std::vector<int> failed(static_cast<size_t>(flags.threads), 0);
    const double s = OnThreads(flags.threads, flags.passes, clips.size(), [&](int t, size_t ci, int) {
      const Clip& c = clips[ci];
      std::vector<int64_t> all(c.table.size());
      for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int64_t>(k);
      auto read = [&](size_t p, std::string* bytes) {
        return (*ds)->ReadPacket(*c.index, stream, p, bytes);
      };
      VideoOutput out;
      if (in_decoder) {
        out.crop = c.crop;
        out.width = out.height = 256;
      }
      DecodeLimits limits;
      limits.max_frames_per_sample = static_cast<int64_t>(all.size());
      std::vector<RgbImage> images;
      absl::Status st = decoders[static_cast<size_t>(t)]->Decode(
          c.episode, c.index->streams(stream), c.table, read, all, out, limits, &images);
      if (!st.ok()) {
        std::cerr << "crop_bench: clip " << c.episode << ": " << st << "\n";
        failed[static_cast<size_t>(t)] = 1;
        return;
      }
      if (!in_decoder) {
        for (RgbImage& im : images) {
          RgbImage r;
          ResizeRgb(im, c.crop.x, c.crop.y, c.crop.width, c.crop.height, false, 256, 256, &r);
          im = std::move(r);
        }
      }
    });
    for (int f : failed) {
      if (f) Die("Conveyor's decode failed");
    }
    return s;
  };
  // The CLI: per thread, one ffmpeg process per clip, looping it `passes` times.
  auto cli = [&](bool crop) {
    return OnThreads(flags.threads, 1, clips.size(), [&](int, size_t ci, int) {
      const Clip& c = clips[ci];
      std::string cmd = StrCat("ffmpeg -nostdin -v error -threads 1 -filter_threads 1 -stream_loop ",
                               flags.passes - 1, " -i ", Quote(c.mp4));
      if (crop) {
        cmd += StrCat(" -vf crop=", c.crop.width, ":", c.crop.height, ":", c.crop.x, ":",
                      c.crop.y, ",scale=256:256:flags=bilinear -pix_fmt rgb24");
      }
      Shell(cmd + " -f null -");
    });
  };

  struct Figure {
    std::string name;
    std::string command;
    std::vector<double> runs_s;
    double best_s = 0;
  };
  std::vector<Figure> figs = {
      {"conveyor, crop in decoder (version 4)", "VideoDecoder, VideoOutput::crop, 256x256 bilinear", {}, 0},
      {"ffmpeg CLI, decode + crop + scale", "ffmpeg -threads 1 -filter_threads 1 -i CLIP -vf crop=W:H:X:Y,scale=256:256:flags=bilinear -pix_fmt rgb24 -f null -", {}, 0},
      {"conveyor, crop from RGB (versions 1-3)", "VideoDecoder full-size RGB, then ResizeRgb to 256x256", {}, 0},
      {"ffmpeg CLI, decode only", "ffmpeg -threads 1 -i CLIP -f null -", {}, 0},
  };
  const std::string load_before = bench::LoadAverage();
  for (int r = 0; r < flags.reps; ++r) {
    figs[0].runs_s.push_back(conveyor(true));
    figs[1].runs_s.push_back(cli(true));
    figs[2].runs_s.push_back(conveyor(false));
    figs[3].runs_s.push_back(cli(false));
  }
  json rows = json::array();
  std::printf("%d clips of %dx%d %s (%lld frames), %d passes, %d threads; frames/s per core, best "
              "of %d\n",
              flags.clips, codec.width(), codec.height(), codec.codec().c_str(),
              static_cast<long long>(frames_per_pass), flags.passes, flags.threads, flags.reps);
  for (Figure& f : figs) {
    f.best_s = *std::min_element(f.runs_s.begin(), f.runs_s.end());
  }
  auto per_core = [&](const Figure& f) { return frames / f.best_s / flags.threads; };
  for (const Figure& f : figs) {
    std::printf("  %-42s %8.1f\n", f.name.c_str(), per_core(f));
    rows.push_back({{"name", f.name}, {"command", f.command}, {"runs_s", f.runs_s},
                    {"frames_per_s_per_core", per_core(f)}});
  }
  // The machine is shared: each rep's own pair (Conveyor's run and the CLI's right after it) is
  // the steadier comparison when the load moves between reps.
  std::vector<double> paired;
  for (int r = 0; r < flags.reps; ++r) paired.push_back(figs[1].runs_s[r] / figs[0].runs_s[r]);
  std::printf("  crop in decoder / CLI per rep:");
  for (double p : paired) std::printf(" %.2f", p);
  std::printf("\n");
  const double ratio = per_core(figs[0]) / per_core(figs[1]);
  const double ratio_rgb = per_core(figs[2]) / per_core(figs[1]);
  const double decode_share = per_core(figs[1]) / per_core(figs[3]);
  std::printf("  crop in decoder / CLI: %.2f   crop from RGB / CLI: %.2f   CLI crop+scale / CLI "
              "decode only: %.2f\n",
              ratio, ratio_rgb, decode_share);
  json doc = {{"bench", "crop_bench"},
              {"clips", flags.clips},
              {"clip_seconds", flags.seconds},
              {"frames_per_pass", frames_per_pass},
              {"passes", flags.passes},
              {"threads", flags.threads},
              {"reps", flags.reps},
              {"size", StrCat(codec.width(), "x", codec.height())},
              {"codec", codec.codec()},
              {"synth", synth},
              {"rows", rows},
              {"ratio_crop_in_decoder_to_cli", ratio},
              {"ratio_crop_in_decoder_to_cli_per_rep", paired},
              {"ratio_crop_from_rgb_to_cli", ratio_rgb},
              {"cli_crop_scale_over_decode_only", decode_share},
              {"cpu", bench::CpuModel()},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"load_before", load_before},
              {"load_after", bench::LoadAverage()}};
  std::printf("%s\n", doc.dump().c_str());
  if (!flags.json_path.empty()) std::ofstream(flags.json_path) << doc.dump(2) << "\n";
  if (temp) fs::remove_all(work);
  return 0;
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) { return conveyor::Main(argc, argv); }
