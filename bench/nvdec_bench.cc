// nvdec_bench: NVDEC decode throughput per GPU (media/nvdec_decoder.h) beside libavcodec on every
// CPU core of the host, in one run on the same dataset, and the pixels of both side by side.
//
//   nvdec_bench --dataset DIR [--sessions 1,2,4,7,14] [--cpu-threads N] [--seconds 4]
//               [--window 48] [--model-size 256x256] [--compare 24] [--json FILE] [--device 0]
//
// DIR is a Conveyor dataset (e.g. `conveyor synth --preset video-model`, 1280x720 H.264 or HEVC);
// its first video stream is decoded, episode after episode, in windows of --window consecutive
// frames (what a video model's clip is), each window one Decode call:
//   caps       cuvidGetDecoderCaps for h264, hevc, av1: supported, engines, sizes.
//   nvdec      S sessions (threads, one NvdecDecoder each, S from --sessions), every frame written
//              as RGB at full size into device memory; and at --model-size (resize + centre crop
//              to the model's input, float32 CHW normalised): frames/s.
//   cpu        --cpu-threads threads (default: every core), one VideoDecoder each (libavcodec, one
//              thread, RGB24 at full size through libswscale, the CPU path's output): frames/s.
//   both       the best S and the CPU threads at once: frames/s together.
//   placement  where `decode: auto` puts this stream given the two rates (media/decode_placement.h).
//   pixels     the first --compare frames of episode 0 and a few frames out of order from both
//              decoders at full size: max and mean absolute difference, share of values off by
//              more than 2, PSNR (the tolerance docs/nvdec.md states), and that out-of-order
//              requests return the frames in-order decoding does (frame selection).
// One JSON object on stdout's last line and in --json; progress on stderr.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>  // hardware_concurrency
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/worker_pool.h"
#include "base/strings.h"
#include "bench/machine_info.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "media/decode_placement.h"
#include "media/nvdec_decoder.h"
#include "media/video_decoder.h"
#include "nlohmann/json.hpp"

namespace conveyor {
namespace {
namespace pb = ::conveyor::format::v1;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

struct Flags {
  std::string dataset;
  std::vector<int> sessions = {1, 2, 4, 7, 14};
  int cpu_threads = 0;
  double seconds = 4;
  int window = 48;
  int model_w = 256, model_h = 256;
  int compare = 24;
  int device = 0;
  std::string json;
  std::string only;  // comma list of caps,nvdec,cpu,both,pixels; empty: all
};

struct Episode {
  std::shared_ptr<const pb::EpisodeIndex> index;
  int stream = -1;
  FrameTable table;
};

struct Data {
  std::unique_ptr<Dataset> ds;
  std::vector<Episode> episodes;
  std::string codec;
  std::string pix_fmt;
  int width = 0, height = 0;
};

absl::StatusOr<Data> Load(const std::string& dir) {
  Data d;
  ASSIGN_OR_RETURN(d.ds, Dataset::Open(dir));
  for (size_t e = 0; e < d.ds->num_episodes(); ++e) {
    Episode ep;
    ASSIGN_OR_RETURN(ep.index, d.ds->LoadEpisode(e));
    for (int s = 0; s < ep.index->streams_size(); ++s) {
      if (ep.index->streams(s).kind() == pb::VIDEO) {
        ep.stream = s;
        break;
      }
    }
    if (ep.stream < 0) return absl::NotFoundError(StrCat(dir, ": episode ", e, " has no video"));
    const pb::StreamIndex& st = ep.index->streams(ep.stream);
    ASSIGN_OR_RETURN(ep.table, FrameTable::Build(st));
    d.codec = st.codec().codec();
    d.pix_fmt = st.codec().pix_fmt();
    d.width = st.codec().width();
    d.height = st.codec().height();
    d.episodes.push_back(std::move(ep));
  }
  if (d.episodes.empty()) return absl::NotFoundError(StrCat(dir, " has no episodes"));
  return d;
}

// Window w of the sequence of windows over all episodes: (episode, first frame, count).
struct Window {
  size_t episode;
  int64_t first;
  int64_t count;
};

std::vector<Window> Windows(const Data& d, int window) {
  std::vector<Window> out;
  for (size_t e = 0; e < d.episodes.size(); ++e) {
    const int64_t n = static_cast<int64_t>(d.episodes[e].table.size());
    for (int64_t f = 0; f < n; f += window) out.push_back({e, f, std::min<int64_t>(window, n - f)});
  }
  return out;
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs `threads` workers for `seconds`, each calling step(thread, iteration) -> frames, until the
// deadline; returns frames/s over the wall time of all of them.
template <typename Step>
absl::StatusOr<double> RunFor(int threads, double seconds, Step step) {
  std::atomic<uint64_t> frames{0};
  std::vector<absl::Status> errors(static_cast<size_t>(threads));
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  {
    WorkerPool pool("nvdec-bench", threads, [&](int t) {
      for (uint64_t i = 0; Clock::now() < deadline; ++i) {
        absl::StatusOr<int64_t> n = step(t, i);
        if (!n.ok()) {
          errors[static_cast<size_t>(t)] = n.status();
          return;
        }
        frames += static_cast<uint64_t>(*n);
      }
    });
    pool.Join();
  }
  const double secs = Since(start);
  for (const auto& e : errors) RETURN_IF_ERROR(e);
  return static_cast<double>(frames.load()) / secs;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() {
    if (p != nullptr) cudaFree(p);
  }
};

// `threads` workers decoding `windows` for `seconds`, each window one call of
// decode(worker, episode, its frames, its packet reader); thread t starts at window t * stride so
// the workers decode different episodes. frames/s.
template <typename DecodeWindow>
absl::StatusOr<double> RunWindows(const Data& d, const std::vector<Window>& windows, int threads,
                                  double seconds, DecodeWindow decode) {
  const size_t stride = std::max<size_t>(1, windows.size() / static_cast<size_t>(threads));
  return RunFor(threads, seconds, [&](int t, uint64_t i) -> absl::StatusOr<int64_t> {
    const Window& w = windows[(static_cast<size_t>(t) * stride + i) % windows.size()];
    const Episode& ep = d.episodes[w.episode];
    std::vector<int64_t> frames(static_cast<size_t>(w.count));
    for (int64_t k = 0; k < w.count; ++k) frames[static_cast<size_t>(k)] = w.first + k;
    auto read = [&](size_t packet, std::string* bytes) {
      return d.ds->ReadPacket(*ep.index, ep.stream, packet, bytes);
    };
    RETURN_IF_ERROR(decode(static_cast<size_t>(t), w.episode, ep, frames, read));
    return w.count;
  });
}

// S NVDEC sessions, output as given. frames/s.
absl::StatusOr<double> NvdecRate(const Data& d, const std::vector<Window>& windows, int sessions,
                                 double seconds, const GpuFrameOutput& out, int device,
                                 int max_window) {
  std::vector<std::unique_ptr<NvdecDecoder>> decoders;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  const size_t frame = NvdecDecoder::FrameBytes(out, d.width, d.height);
  for (int s = 0; s < sessions; ++s) {
    ASSIGN_OR_RETURN(auto dec, NvdecDecoder::Create(device));
    decoders.push_back(std::move(dec));
    buffers.push_back(std::make_unique<DeviceBuffer>(frame * static_cast<size_t>(max_window)));
    if (buffers.back()->p == nullptr) return absl::ResourceExhaustedError("cudaMalloc");
  }
  const DecodeLimits limits;
  return RunWindows(d, windows, sessions, seconds,
                    [&](size_t t, size_t episode, const Episode& ep,
                        const std::vector<int64_t>& frames, PacketReader read) {
                      return decoders[t]->DecodeToDevice(episode + 1,
                                                         ep.index->streams(ep.stream), ep.table,
                                                         read, frames, out, limits,
                                                         buffers[t]->p, frame);
                    });
}

// `threads` libavcodec decoders (VideoDecoder), RGB24 at full size. frames/s.
absl::StatusOr<double> CpuRate(const Data& d, const std::vector<Window>& windows, int threads,
                               double seconds) {
  std::vector<std::unique_ptr<VideoDecoder>> decoders;
  std::vector<std::vector<RgbImage>> images(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) decoders.push_back(std::make_unique<VideoDecoder>());
  const DecodeLimits limits;
  const VideoOutput output;  // full size RGB24
  return RunWindows(d, windows, threads, seconds,
                    [&](size_t t, size_t episode, const Episode& ep,
                        const std::vector<int64_t>& frames, PacketReader read) {
                      return decoders[t]->Decode(episode + 1, ep.index->streams(ep.stream),
                                                 ep.table, read, frames, output, limits,
                                                 &images[t]);
                    });
}

// Frames `frames` of episode 0 from both decoders at full size; the differences.
absl::StatusOr<Json> Pixels(const Data& d, std::vector<int64_t> frames, int device) {
  const Episode& ep = d.episodes[0];
  auto read = [&](size_t packet, std::string* bytes) {
    return d.ds->ReadPacket(*ep.index, ep.stream, packet, bytes);
  };
  const pb::StreamIndex& st = ep.index->streams(ep.stream);
  const DecodeLimits limits;
  std::vector<RgbImage> cpu;
  VideoDecoder vd;
  RETURN_IF_ERROR(vd.Decode(1, st, ep.table, read, frames, VideoOutput{}, limits, &cpu));
  ASSIGN_OR_RETURN(auto nv, NvdecDecoder::Create(device));
  const GpuFrameOutput out;
  const size_t bytes = NvdecDecoder::FrameBytes(out, d.width, d.height);
  DeviceBuffer buf(bytes * frames.size());
  if (buf.p == nullptr) return absl::ResourceExhaustedError("cudaMalloc");
  RETURN_IF_ERROR(nv->DecodeToDevice(1, st, ep.table, read, frames, out, limits, buf.p, bytes));
  std::vector<uint8_t> host(bytes * frames.size());
  if (cudaMemcpy(host.data(), buf.p, host.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return absl::InternalError("cudaMemcpy back");
  }
  int max_diff = 0;
  double sum = 0, sq = 0;
  uint64_t over2 = 0, n = 0;
  double worst_frame_psnr = 1e9;
  for (size_t i = 0; i < frames.size(); ++i) {
    const RgbImage& c = cpu[i];
    if (c.pixels.size() != bytes) return absl::InternalError("frame sizes differ");
    double fsq = 0;
    for (size_t j = 0; j < bytes; ++j) {
      const int diff = std::abs(static_cast<int>(host[i * bytes + j]) - c.pixels[j]);
      max_diff = std::max(max_diff, diff);
      sum += diff;
      sq += static_cast<double>(diff) * diff;
      fsq += static_cast<double>(diff) * diff;
      over2 += diff > 2;
    }
    n += bytes;
    const double fmse = fsq / static_cast<double>(bytes);
    worst_frame_psnr = std::min(worst_frame_psnr, fmse > 0 ? 10 * std::log10(255.0 * 255.0 / fmse) : 99.0);
  }
  const double mse = sq / static_cast<double>(n);
  return Json{{"frames", frames.size()},
              {"max_abs_diff", max_diff},
              {"mean_abs_diff", sum / static_cast<double>(n)},
              {"share_over_2", static_cast<double>(over2) / static_cast<double>(n)},
              {"psnr_db", mse > 0 ? 10 * std::log10(255.0 * 255.0 / mse) : 99.0},
              {"worst_frame_psnr_db", worst_frame_psnr}};
}

bool Wanted(const Flags& f, const std::string& what) {
  if (f.only.empty()) return true;
  for (absl::string_view s : absl::StrSplit(f.only, ',')) {
    if (s == what) return true;
  }
  return false;
}

absl::Status Run(const Flags& f) {
  Json j;
  j["device_index"] = f.device;
  j["cpu"] = bench::CpuModel();
  j["cores"] = std::thread::hardware_concurrency();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, f.device) == cudaSuccess) j["gpu"] = prop.name;
  if (const std::string& why = NvdecUnavailable(f.device); !why.empty()) {
    return absl::FailedPreconditionError(StrCat("NVDEC unavailable: ", why));
  }
  ASSIGN_OR_RETURN(const Data d, Load(f.dataset));
  j["dataset"] = f.dataset;
  j["codec"] = d.codec;
  j["size"] = StrCat(d.width, "x", d.height);
  j["episodes"] = d.episodes.size();
  const std::vector<Window> windows = Windows(d, f.window);
  j["window"] = f.window;
  std::cerr << "nvdec_bench: " << d.episodes.size() << " episodes of " << d.codec << " " << d.width
            << "x" << d.height << ", " << windows.size() << " windows of " << f.window << "\n";
  if (Wanted(f, "caps")) {
    for (const char* codec : {"h264", "hevc", "av1"}) {
      ASSIGN_OR_RETURN(const NvdecCaps c, QueryNvdecCaps(codec, f.device));
      j["caps"][codec] = {{"supported", c.supported}, {"engines", c.engines},
                          {"max", StrCat(c.max_width, "x", c.max_height)},
                          {"min", StrCat(c.min_width, "x", c.min_height)}};
    }
    std::cerr << "caps: " << j["caps"].dump() << "\n";
  }
  if (Wanted(f, "pixels")) {
    std::vector<int64_t> seq;
    const int64_t n = static_cast<int64_t>(d.episodes[0].table.size());
    for (int64_t k = 0; k < std::min<int64_t>(f.compare, n); ++k) seq.push_back(k);
    ASSIGN_OR_RETURN(j["pixels"]["in_order"], Pixels(d, seq, f.device));
    // Out of order, with a repeat and frames from the middle and the end (frame selection).
    std::vector<int64_t> scattered = {n - 1, n / 2, 3, n / 2, n / 3 + 1};
    ASSIGN_OR_RETURN(j["pixels"]["scattered"], Pixels(d, scattered, f.device));
    std::cerr << "pixels: " << j["pixels"].dump() << "\n";
  }
  const int cpu_threads = f.cpu_threads > 0 ? f.cpu_threads
                                            : static_cast<int>(std::thread::hardware_concurrency());
  double best_nvdec = 0;
  int best_sessions = f.sessions.empty() ? 1 : f.sessions.front();
  if (Wanted(f, "nvdec")) {
    GpuFrameOutput full;
    GpuFrameOutput model;
    const int side = std::min(d.width, d.height);
    // Resize the short side to the model's, keep the aspect, centre crop.
    model.resize_width = d.width * f.model_h / side;
    model.resize_height = d.height * f.model_h / side;
    model.width = std::min(f.model_w, model.resize_width);
    model.height = std::min(f.model_h, model.resize_height);
    model.crop_x = (model.resize_width - model.width) / 2;
    model.crop_y = (model.resize_height - model.height) / 2;
    model.layout = GpuFrameOutput::Layout::kChwF32;
    model.mean = {0.485f, 0.456f, 0.406f};
    model.std = {0.229f, 0.224f, 0.225f};
    for (int s : f.sessions) {
      ASSIGN_OR_RETURN(const double rate, NvdecRate(d, windows, s, f.seconds, full, f.device, f.window));
      ASSIGN_OR_RETURN(const double mrate,
                       NvdecRate(d, windows, s, f.seconds / 2, model, f.device, f.window));
      j["nvdec"].push_back({{"sessions", s}, {"frames_per_s", rate},
                            {"model_frames_per_s", mrate},
                            {"model_output", StrCat(model.width, "x", model.height, " f32 CHW")}});
      std::cerr << "nvdec: " << s << " sessions: " << static_cast<int>(rate)
                << " frames/s full size RGB, " << static_cast<int>(mrate) << " at "
                << model.width << "x" << model.height << " f32\n";
      if (rate > best_nvdec) {
        best_nvdec = rate;
        best_sessions = s;
      }
    }
    j["nvdec_best"] = {{"sessions", best_sessions}, {"frames_per_s", best_nvdec}};
  }
  double cpu_rate = 0;
  if (Wanted(f, "cpu")) {
    ASSIGN_OR_RETURN(cpu_rate, CpuRate(d, windows, cpu_threads, f.seconds));
    j["cpu_decode"] = {{"threads", cpu_threads}, {"frames_per_s", cpu_rate}};
    std::cerr << "cpu: " << cpu_threads << " threads: " << static_cast<int>(cpu_rate)
              << " frames/s\n";
    if (best_nvdec > 0) j["nvdec_over_cpu"] = best_nvdec / cpu_rate;
  }
  if (best_nvdec > 0 && cpu_rate > 0) {
    // What `decode: auto` places this stream on, given the rates just measured
    // (media/decode_placement.h).
    NvdecHost host = ProbeNvdecHost(f.device);
    host.cpu_frames_per_s = cpu_rate;
    host.nvdec_frames_per_s = best_nvdec;
    const VideoStreamInfo info{d.codec, d.pix_fmt, d.width, d.height};
    const Placement p = PlaceVideoStream(info, DecodeBackend::kAuto, host);
    j["placement"] = {{"where", DecodeBackendName(p.where)}, {"reason", p.reason}};
    std::cerr << "placement: " << DecodeBackendName(p.where) << ": " << p.reason << "\n";
  }
  if (Wanted(f, "both") && best_nvdec > 0) {
    std::atomic<double> nv{0}, cpu{0};
    absl::Status nv_status, cpu_status;
    const GpuFrameOutput full;
    WorkerPool both("nvdec-both", 2, [&](int which) {
      if (which == 0) {
        auto r = NvdecRate(d, windows, best_sessions, f.seconds, full, f.device, f.window);
        if (r.ok()) nv = *r; else nv_status = r.status();
      } else {
        auto r = CpuRate(d, windows, cpu_threads, f.seconds);
        if (r.ok()) cpu = *r; else cpu_status = r.status();
      }
    });
    both.Join();
    RETURN_IF_ERROR(nv_status);
    RETURN_IF_ERROR(cpu_status);
    j["both"] = {{"sessions", best_sessions}, {"cpu_threads", cpu_threads},
                 {"nvdec_frames_per_s", nv.load()}, {"cpu_frames_per_s", cpu.load()},
                 {"frames_per_s", nv.load() + cpu.load()}};
    std::cerr << "both: " << static_cast<int>(nv.load() + cpu.load()) << " frames/s\n";
  }
  const std::string text = j.dump();
  std::cout << text << "\n";
  if (!f.json.empty()) std::ofstream(f.json) << j.dump(1) << "\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  conveyor::Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "nvdec_bench: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const std::string& v) {
      double x;
      if (!absl::SimpleAtod(v, &x)) {
        std::cerr << "nvdec_bench: " << a << ": '" << v << "' is not a number\n";
        std::exit(2);
      }
      return x;
    };
    if (a == "--dataset") f.dataset = value();
    else if (a == "--sessions") {
      f.sessions.clear();
      for (absl::string_view s : absl::StrSplit(value(), ',')) {
        f.sessions.push_back(static_cast<int>(number(std::string(s))));
      }
    } else if (a == "--cpu-threads") f.cpu_threads = static_cast<int>(number(value()));
    else if (a == "--seconds") f.seconds = number(value());
    else if (a == "--window") f.window = static_cast<int>(number(value()));
    else if (a == "--compare") f.compare = static_cast<int>(number(value()));
    else if (a == "--device") f.device = static_cast<int>(number(value()));
    else if (a == "--json") f.json = value();
    else if (a == "--only") f.only = value();
    else if (a == "--model-size") {
      const std::string v = value();
      if (std::sscanf(v.c_str(), "%dx%d", &f.model_w, &f.model_h) != 2 || f.model_w <= 0 ||
          f.model_h <= 0) {
        std::cerr << "nvdec_bench: --model-size: '" << v << "' is not WxH\n";
        return 2;
      }
    } else {
      std::cerr << "nvdec_bench: unknown flag " << a << " (see the comment at the top of "
                << "bench/nvdec_bench.cc)\n";
      return 2;
    }
  }
  if (f.dataset.empty() || f.window <= 0 || f.seconds <= 0 || f.sessions.empty()) {
    std::cerr << "usage: nvdec_bench --dataset DIR [--sessions 1,2,4,7,14] [--cpu-threads N] "
                 "[--seconds 4] [--window 48] [--model-size 256x256] [--compare 24] [--json F]\n";
    return 2;
  }
  for (int s : f.sessions) {
    if (s <= 0 || s > 64) {
      std::cerr << "nvdec_bench: --sessions: " << s << " is not in 1..64\n";
      return 2;
    }
  }
  absl::Status s = conveyor::Run(f);
  if (!s.ok()) {
    std::cerr << "nvdec_bench: " << s << "\n";
    return 1;
  }
  return 0;
}
