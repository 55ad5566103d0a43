// `conveyor bench`: throughput per modality on the user's own dataset, each figure beside its
// limit measured in the same run (docs/bench.md).
//
//   read      packets of the modality's first stream from storage      vs `cat` of the shards
//   decode    video frames / audio seconds / images / low-dim steps     vs the ffmpeg CLI (one
//             process per thread) on the same stream extracted to a file; low-dim has no limit
//   assemble  samples of a spec holding only this modality's streams, in index order and
//             shuffled (naive and GOP-scheduled)                        vs the decode bound
//   serve     the whole config through an in-process server to a client vs the offline pipeline,
//             and its bytes/s                                            vs iperf3 over loopback;
//             with the frame cache flags, again with a warm cache        vs the offline pipeline
//             in the server                                                 with a warm cache
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_format.h"
#include "base/cpu_slots.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/worker_pool.h"
#include "client/client.h"
#include "conveyor/format/v1/shard.pb.h"
#include "conveyor/v1/service.pb.h"
#include "media/audio_decoder.h"
#include "media/image_decoder.h"
#include "sample/sample_assembler.h"
#include "media/video_decoder.h"
#include "nlohmann/json.hpp"
#include "datasets/dataset.h"
#include "format/format.h"
#include "storage/storage.h"
#include "server/server.h"
#include "pipeline/frame_cache.h"
#include "pipeline/pipeline.h"
#include "sample/buckets.h"
#include "shuffle/buckets.h"
#include "shuffle/order.h"
#include "bench/bench.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

namespace pb = ::conveyor::format::v1;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Steady-state throughput of a stream of batches: the first batch (pipeline start-up, the first
// GOP window's decode, a server's connection and config resolution) is timed on its own and left
// out of the rate, which counts the samples after it over the time after it.
struct SteadyRate {
  double first_batch_s = 0;  // start to the first batch
  uint64_t samples = 0;      // after the first batch
  double seconds = 0;        // after the first batch
  double rate() const { return seconds > 0 ? samples / seconds : 0; }
};

// `next` returns the samples of one batch, 0 at the end of the data, or an error. Runs for
// `seconds` after the first batch (and at least until it).
template <typename Next>
absl::StatusOr<SteadyRate> MeasureSteady(double seconds, Next next) {
  SteadyRate r;
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(uint64_t first, next());
  r.first_batch_s = Since(t0);
  if (first == 0) return r;
  const auto t1 = Clock::now();
  while (Since(t1) < seconds) {
    ASSIGN_OR_RETURN(uint64_t n, next());
    if (n == 0) break;
    r.samples += n;
  }
  r.seconds = Since(t1);
  return r;
}

std::string KindName(pb::StreamKind k) { return std::string(format::StreamKindName(k)); }

// Runs shell commands in parallel (one process each) and returns the wall seconds of the batch.
double RunParallel(const std::vector<std::string>& cmds) {
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (const std::string& c : cmds) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", c.c_str(), nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  return ok ? Since(t0) : -1;
}

// iperf3 over loopback (one TCP stream for `seconds`), MB/s received; 0 when iperf3 is missing.
double Iperf3MBps(double seconds) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  if (port == 0) return 0;
  const pid_t server = fork();
  if (server == 0) {
    execlp("sh", "sh", "-c", StrCat("exec iperf3 -s -1 -p ", port, " > /dev/null 2>&1").c_str(), nullptr);
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string out;
  if (FILE* p = popen(StrCat("iperf3 -c 127.0.0.1 -p ", port, " -t ", std::max(1, static_cast<int>(seconds)),
                             " -J 2>/dev/null").c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  try {
    return json::parse(out)["end"]["sum_received"]["bits_per_second"].get<double>() / 8 / 1e6;
  } catch (...) {
    return 0;
  }
}

// The config with `pipeline.schedule.mode: gop`: the decoded-frame cache holds frames of GOP
// blocks only, so a naive config would leave a cache nothing to do (block sizes stay auto).
absl::StatusOr<std::string> WithGopSchedule(const std::string& config_text) {
  try {
    YAML::Node root = YAML::Load(config_text);
    root["pipeline"]["schedule"]["mode"] = "gop";
    YAML::Emitter out;
    out << root;
    return std::string(out.c_str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat("the config, with the GOP schedule: ", e.what()));
  }
}

struct Row {
  std::string modality, stage, order;
  int threads = 1;
  double value = 0;
  std::string unit;
  std::string limit_name;
  double limit = 0;
  json stages;  // assemble/serve: where the time went
  json frame_cache = nullptr;  // the frame cache rows: what the cache did (null: other rows)
};

class Bench {
 public:
  // `source`: one dataset, or a mixture (only its end-to-end rows are measured).
  Bench(const BenchOptions& o, const Source& source, std::string work)
      : o_(o), source_(source), ds_(source.dataset(0)), work_(std::move(work)) {}

  // --plan: the whole config through a server, at each thread count, and nothing else.
  absl::Status RunServeOnly(const SampleSpec& spec, const PipelineOptions& po, const std::string& config_text) {
    for (int t : o_.threads) RETURN_IF_ERROR(Serve(spec, po, config_text, t));
    return absl::OkStatus();
  }

  absl::Status Run(const SampleSpec& spec, const PipelineOptions& po, const std::string& config_text) {
    if (source_.is_mixture()) {
      // A mixture: the whole config through its pipeline and a server; the per-modality rows
      // measure one dataset's decoders (bench each dataset on its own for those).
      Progress(StrCat("mixture of ", source_.size(), " datasets: end-to-end rows only"));
      // Clips per video have no decode-once order (docs/sampling.md "Clips per video").
      const char* order = spec.clips.enabled() ? "naive" : "gop";
      for (int t : o_.threads) RETURN_IF_ERROR(AssembleShuffled("all", spec, po, order, t));
      if (frame_cache_on()) Progress("frame cache rows: bench each dataset of the mixture on its own for those");
      if (o_.serve) {
        for (int t : o_.threads) RETURN_IF_ERROR(Serve(spec, po, config_text, t));
      }
      return absl::OkStatus();
    }
    const Manifest& m = ds_.manifest();
    std::vector<std::string> wanted;
    for (const std::string k : {"video", "image", "audio", "lowdim"}) {
      if (o_.modality == "all" || o_.modality == k) wanted.push_back(k);
    }
    if (wanted.empty()) {
      return absl::InvalidArgumentError(StrCat("--modality '", o_.modality, "': expected video, image, audio, lowdim or all"));
    }
    if (frame_cache_on() && std::find(wanted.begin(), wanted.end(), "video") == wanted.end()) {
      Progress("frame cache rows: measured for video only (--modality video or all)");
    }
    // With clips per video the index is the clips' (one sample per clip, at the offsets the
    // pipeline draws for the config's seed), as the pipeline's is: the in-order row assembles
    // clips, not overlapping windows at every frame of each video.
    ASSIGN_OR_RETURN(index_, SampleIndex::Build(ds_, spec.anchor_stream, {}, spec.clips,
                                                OrderKey(ds_.manifest().fingerprint, po.seed)));
    // Bucketed datasets hold clips of several sizes: the CLI limits run over every clip of a
    // thread, not its first one (a 1080p clip decodes at half a 720p clip's rate).
    mixed_sizes_ = spec.buckets.enabled();
    if (spec.clips.enabled()) {
      Progress("clips per video: the shuffled rows serve the config's clips in their own order; the gop, "
               "epoch-boundary and frame cache rows (decode-once blocks of consecutive anchor steps) "
               "do not apply");
    }
    RETURN_IF_ERROR(MeasureCat());
    for (const std::string& kind : wanted) {
      int stream = -1;
      for (size_t i = 0; i < m.streams.size(); ++i) {
        if (KindName(m.streams[i].kind) == kind) {
          stream = static_cast<int>(i);
          break;
        }
      }
      if (stream < 0) {
        Progress(StrCat(kind, ": the dataset has no ", kind, " stream; skipped"));
        continue;
      }
      if (kind != "lowdim") {  // low-dim blocks are read (and decompressed) by decode
        for (int t : o_.threads) RETURN_IF_ERROR(Read(kind, stream, t));
      }
      for (int t : o_.threads) RETURN_IF_ERROR(Decode(kind, stream, t));
      if (kind == "video" && spec.buckets.enabled()) {
        for (int t : o_.threads) RETURN_IF_ERROR(DecodeBucketCrop(spec, stream, t));
      }
      SampleSpec only = spec;
      only.streams.erase(std::remove_if(only.streams.begin(), only.streams.end(),
                                        [&](const StreamSpec& s) { return KindName(s.kind) != kind; }),
                         only.streams.end());
      if (only.streams.empty()) {
        Progress(StrCat(kind, ": the config samples no ", kind, " stream; assembly skipped"));
        continue;
      }
      for (int t : o_.threads) RETURN_IF_ERROR(AssembleInOrder(kind, only, t));
      for (int t : o_.threads) {
        for (const char* order : {"naive", "gop"}) {
          // No GOPs to schedule, except a format read an episode at a time (RLDS), whose gop
          // order reads each episode once.
          if (std::string(order) == "gop" && kind != "video" && !ds_.reads_whole_episodes()) continue;
          if (std::string(order) == "gop" && spec.clips.enabled()) continue;
          RETURN_IF_ERROR(AssembleShuffled(kind, only, po, order, t));
        }
        if (spec.clips.enabled()) continue;
        if (kind == "video") RETURN_IF_ERROR(EpochBoundary(only, po, t));
        if (kind == "video" && frame_cache_on()) RETURN_IF_ERROR(AssembleWithFrameCache(only, po, t));
      }
    }
    if (o_.serve) {
      for (int t : o_.threads) {
        RETURN_IF_ERROR(Serve(spec, po, config_text, t));
        if (frame_cache_on() && !spec.clips.enabled()) RETURN_IF_ERROR(ServeWarm(spec, po, config_text, t));
      }
    }
    return absl::OkStatus();
  }

  const std::vector<Row>& rows() const { return rows_; }
  double cat_bytes_per_s() const { return cat_; }
  bool frame_cache_on() const { return o_.frame_cache.bytes > 0 || !o_.frame_cache.dir.empty(); }

 private:
  // The uncached shuffled gop row per thread count, beside which the frame cache rows stand.
  struct GopBaseline {
    double rate = 0;                // samples/s
    double limit = 0;               // its decode bound
    double decode_s_per_frame = 0;  // workers' decode seconds per frame decoded
  };

  void Progress(const std::string& s) {
    std::fprintf(stderr, "bench: %s\n", s.c_str());
    std::fflush(stderr);
  }

  void Add(Row r) {
    std::string line = StrCat(r.modality, " ", r.stage, r.order.empty() ? "" : StrCat(" (", r.order, ")"),
                              ", ", r.threads, " thread", r.threads > 1 ? "s" : "", ": ");
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.1f %s", r.value, r.unit.c_str());
    line += buf;
    if (r.limit > 0) {
      std::snprintf(buf, sizeof buf, " (%s %.1f, ratio %.2f)", r.limit_name.c_str(), r.limit, r.value / r.limit);
      line += buf;
    }
    Progress(line);
    rows_.push_back(std::move(r));
  }

  // `cat` of every shard: the raw storage limit (local datasets).
  absl::Status MeasureCat() {
    std::string files;
    uint64_t bytes = 0;
    for (const ShardInfo& s : ds_.manifest().shards) {
      const std::string path = ds_.uri() + "/" + s.path;
      if (!std::filesystem::exists(path)) return absl::OkStatus();  // not local: no cat limit
      files += " '" + path + "'";
      bytes += s.bytes;
    }
    RunParallel({"cat" + files + " > /dev/null"});  // warm the page cache
    // Enough passes for about 512 MB, so that starting `cat` does not count.
    const uint64_t passes = std::max<uint64_t>(1, (512ull << 20) / std::max<uint64_t>(bytes, 1));
    const double s = RunParallel({StrCat("for i in $(seq ", passes, "); do cat", files, "; done > /dev/null")});
    cat_ = s > 0 ? passes * bytes / s : 0;
    Progress(StrCat("cat of the shards: ", static_cast<int64_t>(cat_ / 1e6), " MB/s"));
    return absl::OkStatus();
  }

  // Episodes for thread t of n: t, t + n, ...
  std::vector<size_t> EpisodesOf(int t, int n) const {
    std::vector<size_t> out;
    for (size_t e = static_cast<size_t>(t); e < ds_.num_episodes(); e += static_cast<size_t>(n)) out.push_back(e);
    if (out.empty() && ds_.num_episodes() > 0) out.push_back(static_cast<size_t>(t) % ds_.num_episodes());
    return out;
  }

  // Runs body(thread, &units, &bytes) on `threads` threads until each returns or the time budget
  // ends (body checks `stop`); returns units/s and bytes/s.
  template <typename Body>
  absl::Status Parallel(int threads, Body body, double* units_per_s, double* bytes_per_s) {
    std::atomic<bool> stop{false};
    std::vector<absl::Status> st(static_cast<size_t>(threads));
    std::vector<uint64_t> units(static_cast<size_t>(threads)), bytes(static_cast<size_t>(threads));
    const auto t0 = Clock::now();
    std::atomic<int> running{threads};
    WorkerPool pool("conveyor-bench", threads, [&](int t) {
      st[t] = body(t, stop, &units[t], &bytes[t]);
      running.fetch_sub(1);
    });
    // This thread keeps the time budget.
    while (running.load() > 0 && Since(t0) < o_.seconds) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stop = true;
    pool.Join();
    const double s = Since(t0);
    uint64_t u = 0, b = 0;
    for (int t = 0; t < threads; ++t) {
      RETURN_IF_ERROR(st[t]);
      u += units[t];
      b += bytes[t];
    }
    *units_per_s = u / s;
    *bytes_per_s = b / s;
    return absl::OkStatus();
  }

  absl::Status Read(const std::string& kind, int stream, int threads) {
    double ups = 0, bps = 0;
    RETURN_IF_ERROR(Parallel(threads, [&](int t, std::atomic<bool>& stop, uint64_t* units, uint64_t* bytes) -> absl::Status {
      std::string buf;
      for (int pass = 0; !stop; ++pass) {
        for (size_t e : EpisodesOf(t, threads)) {
          ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
          const int n = index->streams(stream).packets().size_size();
          for (int k = 0; k < n && !stop; ++k) {
            RETURN_IF_ERROR(ds_.ReadPacket(*index, stream, static_cast<size_t>(k), &buf));
            ++*units;
            *bytes += buf.size();
          }
        }
      }
      return absl::OkStatus();
    }, &ups, &bps));
    Add(Row{kind, "read", "", threads, bps / 1e6, "MB/s", "cat", cat_ / 1e6, {}});
    return absl::OkStatus();
  }

  // The stream of episode `e` as a file the ffmpeg CLI reads (conveyor extract).
  absl::StatusOr<std::string> Extracted(const std::string& kind, int stream, size_t e) {
    const std::string ext = kind == "video" ? ".mp4" : kind == "audio" ? ".mka" : "";
    const std::string path = StrCat(work_, "/", kind, "-", e, ext);
    if (!std::filesystem::exists(path)) {
      ExtractOptions x;
      x.dataset = ds_.uri();
      x.episode = static_cast<int64_t>(e);
      x.stream = ds_.manifest().streams[stream].name;
      x.out = path;
      RETURN_IF_ERROR(RunExtract(x));
    }
    return path;
  }

  absl::Status Decode(const std::string& kind, int stream, int threads) {
    double ups = 0, bps = 0;
    const DecodeLimits limits;
    std::string unit, limit_name;
    double limit = 0;
    if (kind == "video" || kind == "image") {
      // Clips of several sizes (buckets): each thread decodes whole clips, and the CLI then the
      // same clips (CliCommands), so both decode the same frames of the same mix.
      std::vector<std::vector<size_t>> clips(static_cast<size_t>(threads));
      const bool whole_clips = kind == "video" && mixed_sizes_;
      RETURN_IF_ERROR(Parallel(threads, [&](int t, std::atomic<bool>& stop, uint64_t* units, uint64_t*) -> absl::Status {
        VideoDecoder video;
        ImageDecoder image;
        std::vector<RgbImage> out;
        RgbImage one;
        std::string bytes;
        while (!stop) {
          for (size_t e : EpisodesOf(t, threads)) {
            if (whole_clips && stop) break;
            ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
            const pb::StreamIndex& s = index->streams(stream);
            auto read = [&](size_t packet, std::string* b) { return ds_.ReadPacket(*index, stream, packet, b); };
            if (kind == "video") {
              ASSIGN_OR_RETURN(const FrameTable table, FrameTable::Build(s));
              for (int64_t k = 0; k < static_cast<int64_t>(table.size()) && (whole_clips || !stop); ++k) {
                RETURN_IF_ERROR(video.Decode(e, s, table, read, std::span<const int64_t>(&k, 1), VideoOutput{}, limits, &out));
                ++*units;
              }
              if (whole_clips) clips[t].push_back(e);
            } else {
              for (int k = 0; k < s.packets().size_size() && !stop; ++k) {
                RETURN_IF_ERROR(read(static_cast<size_t>(k), &bytes));
                RETURN_IF_ERROR(image.Decode(s.codec().codec(), bytes, 0, 0, limits, &one));
                ++*units;
              }
            }
          }
        }
        return absl::OkStatus();
      }, &ups, &bps));
      unit = "frames/s";
      if (kind == "video") {
        // The ffmpeg CLI, one process (one thread) per thread, each on its own episode's file.
        // Loops enough for about as many frames as we decoded in the budget, so that the CLI's
        // start-up does not count.
        std::vector<std::string> cmds;
        int64_t frames = 0;
        if (whole_clips) {
          ASSIGN_OR_RETURN(frames, CliCommands(stream, clips, [](size_t) { return std::string("-pix_fmt rgb24 -f null -"); },
                                               &cmds));
        }
        for (int t = 0; t < threads && !whole_clips; ++t) {
          const size_t e = EpisodesOf(t, threads).front();
          ASSIGN_OR_RETURN(const std::string f, Extracted(kind, stream, e));
          ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
          const int64_t n = std::max(1, index->streams(stream).packets().size_size());
          const int64_t loops = std::max<int64_t>(1, static_cast<int64_t>(ups / threads * o_.seconds) / n);
          frames += n * loops;
          cmds.push_back(StrCat("ffmpeg -hide_banner -loglevel error -nostdin -threads 1 -stream_loop ",
                                loops - 1, " -i '", f, "' -pix_fmt rgb24 -f null - "));
        }
        const double s = RunParallel(cmds);
        limit = s > 0 ? frames / s : 0;
        limit_name = whole_clips ? "ffmpeg -threads 1 -pix_fmt rgb24, the thread's clips"
                                  : "ffmpeg -threads 1 -pix_fmt rgb24";
      } else {
        // libjpeg-turbo's tjbench on the stream's first image, one process per thread.
        ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(0));
        const pb::StreamIndex& st = index->streams(stream);
        const std::string codec = st.codec().codec();
        if ((codec == "mjpeg" || codec == "jpeg") && st.packets().size_size() > 0) {
          std::string bytes;
          RETURN_IF_ERROR(ds_.ReadPacket(*index, stream, 0, &bytes));
          const std::string jpg = work_ + "/image-0.jpg";
          std::ofstream(jpg, std::ios::binary) << bytes;
          std::vector<std::string> cmds;
          for (int t = 0; t < threads; ++t) {
            cmds.push_back(StrCat("tjbench '", jpg, "' -rgb -benchtime ", o_.seconds, " -warmup 0.2 -nowrite > '",
                                  work_, "/tjbench-", t, ".txt' 2>&1"));
          }
          if (RunParallel(cmds) > 0) {
            for (int t = 0; t < threads; ++t) {
              std::ifstream f(StrCat(work_, "/tjbench-", t, ".txt"));
              std::stringstream out;
              out << f.rdbuf();
              const std::string text = out.str();
              const size_t pos = text.find("Frame rate:");
              double fps = 0;
              if (pos != std::string::npos && std::sscanf(text.c_str() + pos, "Frame rate: %lf", &fps) == 1) limit += fps;
            }
            limit_name = "tjbench -rgb (first image)";
            image_limit_tool_[threads] = "tjbench";
          }
        } else if ((codec == "ppm" || codec == "pgm") && st.codec().width() > 0 && st.codec().height() > 0) {
          // A raw frame's decode is a copy of its rgb24 bytes: memcpy of that many bytes, one
          // thread per thread (the source and destination stay in the CPU's caches).
          const size_t frame = static_cast<size_t>(st.codec().width()) * static_cast<size_t>(st.codec().height()) * 3;
          double copies = 0, unused = 0;
          RETURN_IF_ERROR(Parallel(threads, [&](int, std::atomic<bool>& stop, uint64_t* units, uint64_t*) -> absl::Status {
            std::vector<char> src(frame, 1), dst(frame);
            while (!stop) {
              for (int k = 0; k < 64; ++k) {
                std::memcpy(dst.data(), src.data(), frame);
                asm volatile("" : : "r"(dst.data()) : "memory");
              }
              *units += 64;
            }
            return absl::OkStatus();
          }, &copies, &unused));
          limit = copies;
          limit_name = "memcpy of a frame's rgb24 bytes";
          image_limit_tool_[threads] = "memcpy";
        }
      }
    } else if (kind == "audio") {
      const double rate = ds_.manifest().streams[stream].rate;
      RETURN_IF_ERROR(Parallel(threads, [&](int t, std::atomic<bool>& stop, uint64_t* units, uint64_t*) -> absl::Status {
        AudioDecoder decoder(AudioMethod::kChunks);  // what new jobs get (pipeline version 3)
        std::vector<float> pcm;
        std::vector<uint8_t> pad;
        while (!stop) {
          for (size_t e : EpisodesOf(t, threads)) {
            ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
            const pb::StreamIndex& s = index->streams(stream);
            auto read = [&](size_t packet, std::string* b) { return ds_.ReadPacket(*index, stream, packet, b); };
            const double seconds = ds_.episodes().record(e).duration_s;
            // Every pass decodes the episode again, as the CLI's does: no chunk kept from before.
            decoder.ClearChunkCache();
            for (int w = 0; w + 1 <= seconds && !stop; ++w) {
              RETURN_IF_ERROR(decoder.DecodeWindow(s, read, w, static_cast<int64_t>(rate), static_cast<int>(rate), 0, limits, &pcm, &pad));
              ++*units;  // one second of audio
            }
          }
        }
        return absl::OkStatus();
      }, &ups, &bps));
      unit = "audio s/s";
      std::vector<std::string> cmds;
      double audio_s = 0;
      for (int t = 0; t < threads; ++t) {
        const size_t e = EpisodesOf(t, threads).front();
        ASSIGN_OR_RETURN(const std::string f, Extracted(kind, stream, e));
        const double d = std::max(1.0, ds_.episodes().record(e).duration_s);
        const int64_t loops = std::max<int64_t>(1, static_cast<int64_t>(ups / threads * o_.seconds / d));
        audio_s += loops * d;
        cmds.push_back(StrCat("ffmpeg -hide_banner -loglevel error -nostdin -threads 1 -stream_loop ",
                              loops - 1, " -i '", f, "' -f null - "));
      }
      const double s = RunParallel(cmds);
      limit = s > 0 ? audio_s / s : 0;
      limit_name = "ffmpeg -threads 1";
    } else {  // lowdim: 50-step windows at every step
      RETURN_IF_ERROR(Parallel(threads, [&](int t, std::atomic<bool>& stop, uint64_t* units, uint64_t*) -> absl::Status {
        std::vector<float> out;
        while (!stop) {
          for (size_t e : EpisodesOf(t, threads)) {
            ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
            const size_t steps = static_cast<size_t>(ds_.episodes().record(e).lengths[stream]);
            for (size_t k = 0; k + 50 <= steps && !stop; ++k) {
              RETURN_IF_ERROR(ds_.ReadLowdim(*index, stream, k, 50, &out));
              ++*units;
            }
          }
        }
        return absl::OkStatus();
      }, &ups, &bps));
      unit = "windows/s (50 steps)";
    }
    Add(Row{kind, "decode", "", threads, ups, unit, limit_name, limit, {}});
    if (kind == "video") video_fps_limit_[threads] = limit;
    if (kind == "image") image_fps_limit_[threads] = limit;
    if (kind == "image" && image_limit_tool_[threads] == "tjbench") RETURN_IF_ERROR(DecodeInMemory(stream, threads, limit));
    return absl::OkStatus();
  }

  // tjbench decodes one image over and over; a dataset's images are all different. This row
  // decodes the stream's own images (up to 256 per thread, distinct, read before the clock
  // starts) from memory with libjpeg-turbo, as tjbench does: the decode bound of these images,
  // which the shuffled rows are then measured against (tjbench beside it).
  absl::Status DecodeInMemory(int stream, int threads, double tjbench) {
    std::vector<std::vector<std::string>> images(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      for (size_t e : EpisodesOf(t, threads)) {
        ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
        const int n = index->streams(stream).packets().size_size();
        for (int k = 0; k < n && images[t].size() < 256; ++k) {
          std::string b;
          RETURN_IF_ERROR(ds_.ReadPacket(*index, stream, static_cast<size_t>(k), &b));
          images[t].push_back(std::move(b));
        }
        if (images[t].size() >= 256) break;
      }
      if (images[t].empty()) return absl::OkStatus();
    }
    const std::string codec = ds_.manifest().streams[stream].codec;
    const DecodeLimits limits;
    double ups = 0, unused = 0;
    RETURN_IF_ERROR(Parallel(threads, [&](int t, std::atomic<bool>& stop, uint64_t* units, uint64_t*) -> absl::Status {
      ImageDecoder image;
      RgbImage one;
      while (!stop) {
        for (const std::string& b : images[static_cast<size_t>(t)]) {
          RETURN_IF_ERROR(image.Decode(codec, b, 0, 0, limits, &one));
          ++*units;
        }
      }
      return absl::OkStatus();
    }, &ups, &unused));
    Add(Row{"image", "decode", "in memory, distinct images", threads, ups, "frames/s", "tjbench -rgb (first image)", tjbench, {}});
    image_fps_limit_[threads] = ups;
    image_limit_tool_[threads] = "libjpeg-turbo on the stream's own images";
    return absl::OkStatus();
  }

  // One shell command per thread in `cmds`: the ffmpeg CLI (one process at a time, one thread)
  // on each of `clips[t]` in turn (episodes, `stream` extracted to a file), whole: the clips that
  // Conveyor's thread t decoded, so that both decode the same frames of the same mix. `args(e)`:
  // the arguments after episode e's input. Returns the frames the commands decode. A process
  // starts per clip (about 20 ms beside the 1-3 s a clip of 84-120 frames takes to decode here).
  absl::StatusOr<int64_t> CliCommands(int stream, const std::vector<std::vector<size_t>>& clips,
                                      const std::function<std::string(size_t)>& args,
                                      std::vector<std::string>* cmds) {
    int64_t frames = 0;
    for (const std::vector<size_t>& thread_clips : clips) {
      std::string cmd;
      for (size_t e : thread_clips) {
        ASSIGN_OR_RETURN(const std::string f, Extracted("video", stream, e));
        ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
        frames += index->streams(stream).packets().size_size();
        cmd += StrCat("ffmpeg -hide_banner -loglevel error -nostdin -threads 1 -filter_threads 1 -i '", f, "' ",
                      args(e), " || exit 1; ");
      }
      if (!cmd.empty()) cmds->push_back(cmd);
    }
    return frames;
  }

  // Buckets (docs/sampling.md "Buckets"): every frame of whole clips decoded, cut to the clip's
  // bucket's centre rectangle and scaled to the bucket's size in one libswscale pass (what a
  // bucketed sample's frames cost), beside the ffmpeg CLI doing the same decode, crop and scale on
  // the same clips (`-vf crop=W:H:X:Y,scale=BW:BH -pix_fmt rgb24`), and the CLI decoding them
  // alone (the ceiling of any crop path, in the row's JSON).
  absl::Status DecodeBucketCrop(const SampleSpec& spec, int stream, int threads) {
    struct Cut {
      VideoCrop crop;
      BucketSize size;
    };
    std::map<size_t, Cut> cuts;  // by episode
    ResizeFilter filter = ResizeFilter::kBilinear;
    for (const StreamSpec& s : spec.streams) {
      if (s.kind == pb::VIDEO && s.stream == stream) filter = s.resize;
    }
    for (size_t e = 0; e < ds_.num_episodes(); ++e) {
      ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
      const BucketSize size = spec.buckets.sizes[EpisodeBucket(spec, *index)];
      cuts[e] = Cut{BucketCrop(size, DisplayedSizeOf(index->streams(stream), true)), size};
    }
    const DecodeLimits limits;
    double ups = 0, bps = 0;
    std::vector<std::vector<size_t>> clips(static_cast<size_t>(threads));  // whole clips decoded, per thread
    RETURN_IF_ERROR(Parallel(threads, [&](int t, std::atomic<bool>& stop, uint64_t* units, uint64_t*) -> absl::Status {
      VideoDecoder video;
      std::vector<RgbImage> out;
      while (!stop) {
        for (size_t e : EpisodesOf(t, threads)) {
          if (stop) break;
          ASSIGN_OR_RETURN(auto index, ds_.LoadEpisode(e));
          const pb::StreamIndex& s = index->streams(stream);
          auto read = [&](size_t packet, std::string* b) { return ds_.ReadPacket(*index, stream, packet, b); };
          ASSIGN_OR_RETURN(const FrameTable table, FrameTable::Build(s));
          VideoOutput vo;
          vo.crop = cuts[e].crop;
          vo.width = cuts[e].size.width;
          vo.height = cuts[e].size.height;
          vo.filter = filter;
          for (int64_t k = 0; k < static_cast<int64_t>(table.size()); ++k) {
            RETURN_IF_ERROR(video.Decode(e, s, table, read, std::span<const int64_t>(&k, 1), vo, limits, &out));
            ++*units;
          }
          clips[t].push_back(e);
        }
      }
      return absl::OkStatus();
    }, &ups, &bps));
    const std::string flags = CliScaleFlags(filter);
    auto crop_args = [&](size_t e) {
      const Cut& c = cuts[e];
      return StrCat("-vf crop=", c.crop.width, ":", c.crop.height, ":", c.crop.x, ":", c.crop.y, ",scale=",
                    c.size.width, ":", c.size.height, ":flags=", flags, " -pix_fmt rgb24 -f null -");
    };
    std::vector<std::string> cmds, decode_cmds;
    ASSIGN_OR_RETURN(const int64_t frames, CliCommands(stream, clips, crop_args, &cmds));
    const double s = RunParallel(cmds);
    ASSIGN_OR_RETURN(const int64_t decode_frames,
                     CliCommands(stream, clips, [](size_t) { return std::string("-f null -"); }, &decode_cmds));
    const double decode_s = RunParallel(decode_cmds);
    // The CLI's cost of starting a process per clip: the same commands stopped after one frame.
    std::vector<std::string> start_cmds;
    RETURN_IF_ERROR(CliCommands(stream, clips, [](size_t) { return std::string("-frames:v 1 -f null -"); }, &start_cmds)
                        .status());
    const double start_s = RunParallel(start_cmds);
    if (s <= 0 || decode_s <= 0 || start_s <= 0) {
      return absl::InternalError(StrCat("the ffmpeg CLI failed on one of: ", cmds.front()));
    }
    Row r{"video", "decode", "bucket crop and scale", threads, ups, "frames/s",
          StrCat("ffmpeg -threads 1 -filter_threads 1 -vf crop=W:H:X:Y,scale=BW:BH:flags=", flags,
                 " -pix_fmt rgb24, the thread's clips"),
          frames / s, {}};
    size_t decoded = 0;
    for (const std::vector<size_t>& c : clips) decoded += c.size();
    r.stages = {{"cli_decode_only_frames_per_s", decode_frames / decode_s}, {"clips", cuts.size()},
                {"clips_decoded", decoded}, {"frames_decoded", frames}, {"cli_first_frames_s", start_s},
                {"cli_less_start_frames_per_s", s > start_s ? frames / (s - start_s) : 0.0}};
    Progress(absl::StrFormat("video decode (bucket crop and scale), %d thread%s: %zu whole clips; the CLI decoding "
                             "them alone: %.1f frames/s; its process starts (the same commands to the first "
                             "frame) %.2f s of its %.2f s", threads, threads > 1 ? "s" : "", decoded,
                             decode_frames / decode_s, start_s, s));
    bucket_fps_limit_[threads] = r.limit;
    Add(std::move(r));
    return absl::OkStatus();
  }

  // libswscale's name for `f` in the CLI's scale filter (flags=...).
  static std::string CliScaleFlags(ResizeFilter f) {
    switch (f) {
      case ResizeFilter::kBilinear: return "bilinear";
      case ResizeFilter::kBicubic: return "bicubic";
      case ResizeFilter::kArea: return "area";
      case ResizeFilter::kNearest: return "neighbor";
      case ResizeFilter::kLanczos: return "lanczos";
    }
    return "bilinear";
  }

  // How an epoch fills the buckets (shuffle/buckets.h): per bucket its samples, the whole groups
  // an epoch serves and the samples left for a later epoch (fewer than a group). Logged once.
  json BucketFill(const SampleSpec& spec, const BucketTable& table, uint64_t group) {
    json fill = json::array();
    std::string line = StrCat("buckets, groups of ", group, ":");
    uint64_t total = 0, served = 0;
    for (size_t b = 0; b < table.num_buckets(); ++b) {
      const uint64_t n = table.BucketSamples(b);
      const BucketSize& size = spec.buckets.sizes[b];
      fill.push_back({{"height", size.height}, {"width", size.width}, {"samples", n}, {"group", group}, {"groups", n / group},
                      {"left_for_a_later_epoch", n % group}});
      line += StrCat(" ", size.width, "x", size.height, " ", n, " samples (", n / group, " groups, ", n % group,
                     " left)", b + 1 < table.num_buckets() ? ";" : "");
      total += n;
      served += n / group * group;
    }
    if (!bucket_fill_logged_) {
      Progress(StrCat(line, "; an epoch serves ", served, " of ", total, " samples"));
      bucket_fill_logged_ = true;
    }
    return fill;
  }

  double FramesPerSample(const SampleSpec& spec, pb::StreamKind kind = pb::VIDEO) const {
    double f = 0;
    for (const StreamSpec& s : spec.streams) {
      if (s.kind == kind) f += static_cast<double>(s.deltas.size());
    }
    return f;
  }

  absl::Status AssembleInOrder(const std::string& kind, const SampleSpec& spec, int threads) {
    const uint64_t n = index_.size();
    double ups = 0, bps = 0;
    RETURN_IF_ERROR(Parallel(threads, [&](int t, std::atomic<bool>& stop, uint64_t* units, uint64_t*) -> absl::Status {
      SampleAssembler a(ds_, spec, index_);
      const uint64_t begin = n * t / threads, end = n * (t + 1) / threads;
      for (uint64_t i = begin; !stop; i = (i + 1 < end) ? i + 1 : begin) {
        ASSIGN_OR_RETURN(Sample s, a.Assemble(i, 0, 0));
        ++*units;
      }
      return absl::OkStatus();
    }, &ups, &bps));
    Add(Row{kind, "assemble", "in order", threads, ups, "samples/s", "", 0, {}});
    return absl::OkStatus();
  }

  absl::Status AssembleShuffled(const std::string& kind, const SampleSpec& spec, PipelineOptions po,
                                const std::string& order, int threads) {
    po.threads = threads;
    po.packing.reset();
    po.consumer = 0;
    po.consumers = 1;
    po.order = order == "naive" ? OrderOptions{} : (po.order.naive() ? OrderOptions::AutoGop() : po.order);
    // Episodes read whole (RLDS) start cold, as a job's first epoch does.
    ds_.DropEpisodeCache();
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, Pipeline::Create(source_, spec, po, Cursor{}));
    ASSIGN_OR_RETURN(SteadyRate m, MeasureSteady(o_.seconds, [&]() -> absl::StatusOr<uint64_t> {
      ASSIGN_OR_RETURN(std::optional<Batch> b, p->Next());
      return b ? b->ids.size() : 0;  // 0: max_epochs reached
    }));
    m.first_batch_s = Since(t0) - m.seconds;
    const PipelineStats st = p->stats();
    const std::optional<EpisodeReadStats> reads = ds_.episode_read_stats();
    Row r{kind, "assemble", StrCat("shuffled, ", order), threads, m.rate(), "samples/s", "", 0, {}};
    if (kind == "video" && video_fps_limit_.count(threads) && st.amplification() > 0) {
      // The most samples/s `threads` ffmpeg-speed decoders allow at this amplification.
      r.limit_name = "decode bound (ffmpeg rate / decoded frames per sample)";
      r.limit = video_fps_limit_[threads] / (st.amplification() * FramesPerSample(spec));
    }
    if (kind == "video" && bucket_fps_limit_.count(threads) && bucket_fps_limit_[threads] > 0 &&
        st.amplification() > 0) {
      // Buckets: each decoded frame also costs the crop and scale to its bucket, as the CLI's do.
      r.limit_name = "bucket bound (ffmpeg decode, crop and scale rate / decoded frames per sample)";
      r.limit = bucket_fps_limit_[threads] / (st.amplification() * FramesPerSample(spec));
    }
    if (kind == "image" && image_fps_limit_.count(threads) && image_fps_limit_[threads] > 0 &&
        FramesPerSample(spec, pb::IMAGE) > 0) {
      // The most samples/s `threads` tjbench-speed decoders allow: one decode per image.
      r.limit_name = StrCat("decode bound (", image_limit_tool_[threads], " rate / images per sample)");
      r.limit = image_fps_limit_[threads] / FramesPerSample(spec, pb::IMAGE);
    }
    r.stages = Stages(st, m);
    if (p->options().order.buckets) r.stages["buckets"] = BucketFill(spec, *p->options().order.buckets, p->options().order.bucket_group);
    if (reads.has_value()) {
      r.stages["episode_reads"] = reads->reads;
      r.stages["distinct_episodes"] = reads->distinct;
      r.stages["episode_bytes_read"] = reads->bytes_read;
      r.stages["read_amplification"] = reads->amplification();
    }
    if (kind == "video" && order == "gop") {
      gop_[threads] = GopBaseline{m.rate(), r.limit,
                                  st.frames_decoded > 0 ? st.decode_seconds / st.frames_decoded : 0};
    }
    if (source_.is_mixture()) {
      json datasets = json::object();
      const std::vector<MixtureProgress> mix = p->Mixture();
      for (size_t k = 0; k < mix.size(); ++k) {
        datasets[mix[k].name] = {{"requested_share", mix[k].requested_share},
                                 {"realized_share", st.samples ? static_cast<double>(st.member_samples[k]) / st.samples : 0.0},
                                 {"samples", st.member_samples[k]},
                                 {"epochs", mix[k].epochs}};
      }
      r.stages["datasets"] = datasets;
    }
    Add(std::move(r));
    return absl::OkStatus();
  }

  // "Where the time goes" of a shuffled run.
  static json Stages(const PipelineStats& st, const SteadyRate& m) {
    return {{"decode_s", st.decode_seconds}, {"assemble_s", st.assemble_seconds},
            {"batch_s", st.batch_seconds}, {"wait_s", st.wait_seconds},
            {"worker_idle_s", st.worker_idle_seconds}, {"amplification", st.amplification()},
            {"seconds", m.seconds}, {"first_batch_s", m.first_batch_s}};
  }

  // The wait at an epoch boundary beside a mid-epoch step's (issue 30 item 3): the uncached
  // video gop pipeline read by a consumer that trains for a fixed step between batches, paced at
  // kBoundaryPace of the uncached gop row's samples/s (a trainer the data keeps up with, so a
  // step that waits is the pipeline's doing), from k steps before the end of epoch 1 through k
  // steps after it (k: the steps --seconds covers at that pace), or through whole epochs when an
  // epoch is shorter. Each Next() is timed. Whatever the pipeline does for the next epoch
  // happens while it runs ahead of the consumer, so the boundary's cost can land on a step before
  // step 0: the boundary steps are those within r = min(k / 2, steps / 4) of an epoch's start,
  // the mid-epoch steps the others (about as many), both after a warm-up of the first k / 4.
  // Row: the longest wait of a boundary step beside the longest mid-epoch one (the goal: at most
  // that); the JSON adds step 0's wait (beside the mid-epoch p99, issue 30's literal goal), the
  // mid-epoch p50 and p99, the pace and the pipeline's planning counters.
  static constexpr double kBoundaryPace = 0.9;
  absl::Status EpochBoundary(const SampleSpec& spec, PipelineOptions po, int threads) {
    po.threads = threads;
    po.packing.reset();
    po.consumer = 0;
    po.consumers = 1;
    po.order = po.order.naive() ? OrderOptions::AutoGop() : po.order;
    po.max_epochs = 0;
    const double rate = gop_.count(threads) ? gop_[threads].rate : 0;
    const double pace_s = rate > 0 ? static_cast<double>(po.global_batch_size) / (kBoundaryPace * rate) : 0;
    uint64_t steps = 0;
    {
      ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> probe, Pipeline::Create(source_, spec, po, Cursor{}));
      steps = probe->steps_per_epoch();  // dropped before any batch is asked for
    }
    const uint64_t k = std::max<uint64_t>(8, pace_s > 0 ? static_cast<uint64_t>(o_.seconds / pace_s) : 64);
    const uint64_t r = std::max<uint64_t>(1, std::min(k / 2, steps / 4));
    const Cursor start{0, steps > k ? steps - k : 0};
    const uint64_t total = std::max<uint64_t>(2 * k, steps - start.step + 1);  // past one boundary at least
    const uint64_t warmup = k / 4;
    ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, Pipeline::Create(source_, spec, po, start));
    std::vector<double> mid;
    double worst = 0, step0 = 0;
    uint64_t near = 0;
    for (uint64_t i = 0; i < total; ++i) {
      const auto t0 = Clock::now();
      ASSIGN_OR_RETURN(std::optional<Batch> b, p->Next());
      const double waited = Since(t0);
      if (!b) break;
      const uint64_t s = b->cursor.step;
      if (s == 0 && b->cursor.epoch > 0) step0 = std::max(step0, waited);
      if (i >= warmup) {
        if ((s < r && b->cursor.epoch > 0) || steps - s <= r) {
          worst = std::max(worst, waited);
          ++near;
        } else {
          mid.push_back(waited);
        }
      }
      if (pace_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pace_s));
    }
    const PipelineStats st = p->stats();
    p.reset();
    std::sort(mid.begin(), mid.end());
    auto pct = [&](double q) {
      if (mid.empty()) return 0.0;
      return mid[std::min(mid.size() - 1, static_cast<size_t>(std::ceil(q * static_cast<double>(mid.size()))) - 1)];
    };
    Row row{"video", "epoch boundary", StrCat("shuffled, gop, paced at ", kBoundaryPace), threads, 1e3 * worst,
            "ms longest boundary wait", "longest mid-epoch wait", mid.empty() ? 0.0 : 1e3 * mid.back(), {}};
    row.stages = {{"boundary_wait_ms", 1e3 * worst}, {"step0_wait_ms", 1e3 * step0}, {"boundary_steps", near},
                  {"boundary_radius_steps", r}, {"mid_p50_ms", 1e3 * pct(0.50)}, {"mid_p99_ms", 1e3 * pct(0.99)},
                  {"mid_max_ms", mid.empty() ? 0.0 : 1e3 * mid.back()}, {"mid_steps", mid.size()},
                  {"pace_ms", 1e3 * pace_s}, {"pace_of_uncached_gop", rate > 0 ? kBoundaryPace : 0.0},
                  {"start_step", start.step}, {"steps_per_epoch", steps},
                  {"epoch_orders_planned_ahead", st.epoch_orders_planned_ahead},
                  {"epoch_orders_built_late", st.epoch_orders_built_late},
                  {"met", !mid.empty() && worst <= mid.back() && step0 <= pct(0.99)}};
    Progress(absl::StrFormat("video epoch boundary, %d thread%s: the longest wait within %llu steps of a boundary "
                             "%.1f ms (step 0: %.1f ms); mid-epoch p50 %.1f ms, p99 %.1f ms, max %.1f ms (%zu steps); "
                             "paced %.1f ms a step; epoch orders planned ahead %llu, built late %llu",
                             threads, threads > 1 ? "s" : "", static_cast<unsigned long long>(r), 1e3 * worst,
                             1e3 * step0, 1e3 * pct(0.5), 1e3 * pct(0.99), mid.empty() ? 0.0 : 1e3 * mid.back(),
                             mid.size(), 1e3 * pace_s,
                             static_cast<unsigned long long>(st.epoch_orders_planned_ahead),
                             static_cast<unsigned long long>(st.epoch_orders_built_late)));
    Add(std::move(row));
    return absl::OkStatus();
  }

  // The video GOP pipeline with a decoded-frame cache (--frame-cache-bytes / --frame-cache-dir;
  // docs/pipeline.md "The decoded-frame cache"), two rows beside the uncached gop row of the same
  // threads: epoch 1 (cold), from a fresh memory tier to the end of the epoch, so that every
  // frame the epoch needs is offered to the cache; then epochs 2+ (warm), a new pipeline from
  // epoch 2 on the same cache, for --seconds. Both steady state (the first batch apart).
  absl::Status AssembleWithFrameCache(const SampleSpec& spec, PipelineOptions po, int threads) {
    ASSIGN_OR_RETURN(std::shared_ptr<DecodedFrameCache> cache, MakeFrameCache(ToConfig(o_.frame_cache)));
    po.threads = threads;
    po.packing.reset();
    po.consumer = 0;
    po.consumers = 1;
    po.order = po.order.naive() ? OrderOptions::AutoGop() : po.order;
    po.frame_cache = cache;
    const GopBaseline base = gop_.count(threads) ? gop_[threads] : GopBaseline{};
    const std::string tier = o_.frame_cache.dir.empty() ? "frame cache" : "frame cache + node store";

    // --frame-cache-prefault: the pages epoch 1 keeps, mapped before it starts (timed on its own).
    auto t0 = Clock::now();
    const uint64_t prefaulted = o_.frame_cache.prefault ? PrefaultFrameCache(source_, spec, *cache, threads) : 0;
    const double prefault_s = o_.frame_cache.prefault ? Since(t0) : 0.0;
    if (o_.frame_cache.prefault) {
      Progress(absl::StrFormat("frame cache: %.1f MB pre-faulted in %.2f s on %d thread%s", prefaulted / 1e6,
                               prefault_s, threads, threads > 1 ? "s" : ""));
    }

    // Epoch 1, to its end: a long epoch is cut at the cap, and the rows say how much of it ran.
    PipelineOptions cold = po;
    cold.max_epochs = 1;
    const double cap = std::max(60.0, 20 * o_.seconds);
    t0 = Clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, Pipeline::Create(source_, spec, cold, Cursor{}));
    const uint64_t epoch_samples = p->steps_per_epoch() * p->options().global_batch_size;
    uint64_t delivered = 0;
    bool ended = false;
    ASSIGN_OR_RETURN(SteadyRate c, MeasureSteady(cap, [&]() -> absl::StatusOr<uint64_t> {
      ASSIGN_OR_RETURN(std::optional<Batch> b, p->Next());
      if (!b) {
        ended = true;
        return 0;
      }
      delivered += b->ids.size();
      return b->ids.size();
    }));
    const double epoch_1_s = Since(t0);
    c.first_batch_s = epoch_1_s - c.seconds;
    const double fraction = ended ? 1.0 : epoch_samples > 0 ? static_cast<double>(delivered) / epoch_samples : 0.0;
    const PipelineStats cs = p->stats();
    const FrameCacheStats fresh;
    const FrameCacheStats after_cold = cache->stats();
    p.reset();
    if (!ended) {
      Progress(StrCat("frame cache: epoch 1 cut at ", static_cast<int64_t>(cap), " s, after ",
                      static_cast<int64_t>(100 * fraction), "% of it; the warm rows hit only what that part decoded"));
    }
    Row r{"video", "assemble",
          StrCat("shuffled, gop, ", tier, ", epoch 1 (cold", ended ? "" : StrCat(", first ", static_cast<int64_t>(100 * fraction), "%"), ")"),
          threads, c.rate(), "samples/s", base.limit > 0 ? "decode bound of the uncached gop row" : "", base.limit, {}};
    r.stages = Stages(cs, c);
    r.frame_cache = CacheFigures(cs, after_cold, fresh, base, c);
    r.frame_cache["epoch"] = "1";
    r.frame_cache["epoch_1_fraction"] = fraction;
    r.frame_cache["epoch_1_samples"] = delivered;
    r.frame_cache["epoch_1_seconds"] = epoch_1_s;  // from Create, the first batch included
    r.frame_cache["prefaulted_bytes"] = prefaulted;  // before Create (--frame-cache-prefault)
    r.frame_cache["prefault_seconds"] = prefault_s;
    r.frame_cache["buffers_lent"] = after_cold.buffers_lent;
    Add(std::move(r));

    // Epochs 2+, on the cache epoch 1 filled.
    t0 = Clock::now();
    ASSIGN_OR_RETURN(p, Pipeline::Create(source_, spec, po, Cursor{1, 0}));
    ASSIGN_OR_RETURN(SteadyRate w, MeasureSteady(o_.seconds, [&]() -> absl::StatusOr<uint64_t> {
      ASSIGN_OR_RETURN(std::optional<Batch> b, p->Next());
      return b ? b->ids.size() : 0;
    }));
    w.first_batch_s = Since(t0) - w.seconds;
    const PipelineStats ws = p->stats();
    const FrameCacheStats after_warm = cache->stats();
    p.reset();
    Row warm{"video", "assemble", StrCat("shuffled, gop, ", tier, ", epoch 2+ (warm)"), threads, w.rate(),
             "samples/s", base.limit > 0 ? "decode bound of the uncached gop row" : "", base.limit, {}};
    warm.stages = Stages(ws, w);
    warm.frame_cache = CacheFigures(ws, after_warm, after_cold, base, w);
    warm.frame_cache["epoch"] = "2+";
    warm.frame_cache["epoch_1_fraction"] = fraction;
    Add(std::move(warm));
    return absl::OkStatus();
  }

  // What the cache did in one phase (`before`: its stats when the phase began), the same
  // quantities `conveyor batches --stats` prints, and the row's figure beside the uncached one.
  json CacheFigures(const PipelineStats& st, const FrameCacheStats& fc, const FrameCacheStats& before,
                    const GopBaseline& base, const SteadyRate& m) const {
    const uint64_t needed = st.frame_cache_hits + st.frame_cache_misses;
    json j = {{"policy", o_.frame_cache.policy},
              {"bound_bytes", fc.max_bytes},
              {"held_bytes", fc.bytes},
              {"frames", fc.frames},
              {"hit_rate", needed > 0 ? static_cast<double>(st.frame_cache_hits) / needed : 0.0},
              {"frames_from_cache", st.frame_cache_hits},
              {"frames_decoded_into_cache", st.frame_cache_misses},
              {"frames_decoded", st.frames_decoded},
              {"blocks_not_decoded", st.blocks_from_frame_cache},
              {"lookup_hits", fc.hits - before.hits},
              {"lookup_misses", fc.misses - before.misses},
              {"inserted_bytes", fc.inserted_bytes - before.inserted_bytes},
              {"evicted_bytes", fc.evicted_bytes - before.evicted_bytes},
              {"not_admitted", fc.rejected - before.rejected},
              {"decode_seconds_saved", st.frame_cache_hits * base.decode_s_per_frame},
              {"uncached_decode_s_per_frame", base.decode_s_per_frame},
              {"uncached_samples_per_s", base.rate},
              {"decode_bound_samples_per_s", base.limit},
              {"vs_uncached", base.rate > 0 ? m.rate() / base.rate : 0.0},
              {"first_batch_s", m.first_batch_s},
              {"summary", FrameCacheSummary(fc, o_.frame_cache.policy)}};
    if (fc.has_store) {
      const FrameStoreStats& s = fc.store;
      const FrameStoreStats& b = before.store;
      j["store"] = {{"dir", o_.frame_cache.dir},
                    {"compression", o_.frame_cache.compression},
                    {"hits", s.hits - b.hits},
                    {"misses", s.misses - b.misses},
                    {"hit_bytes", s.hit_bytes - b.hit_bytes},
                    {"published", s.published - b.published},
                    {"published_bytes", s.published_bytes - b.published_bytes},
                    {"already_present", s.already_present - b.already_present},
                    {"rejected", s.rejected - b.rejected},
                    {"evicted_bytes", s.evicted_bytes - b.evicted_bytes},
                    {"corrupt", s.corrupt - b.corrupt},
                    {"write_errors", s.write_errors - b.write_errors},
                    {"usage_bytes", s.usage_bytes},
                    {"bound_bytes", s.max_bytes}};
    }
    return j;
  }

  // What one transport delivered: the steady rate, the bytes after the first batch, the client's
  // counters (summed over the consumers with --consumers N).
  struct Served {
    SteadyRate rate;
    uint64_t bytes = 0;
    client::ClientStats cs;
  };

  // The gRPC rows' name: with --payload-streams, how many stripes carry the payloads.
  std::string GrpcName() const {
    return o_.payload_streams > 1 ? StrCat("gRPC (", o_.payload_streams, " payload streams)") : "gRPC";
  }

  // One stream (or the job's --consumers at once) from `address`, starting at `start`, for
  // --seconds after the first batch.
  absl::StatusOr<Served> ServeStream(const std::string& address, bool shared_memory, Cursor start) {
    client::ClientOptions co;
    co.servers = {address};
    co.job = "bench";
    co.shared_memory = shared_memory;
    co.payload_streams = shared_memory ? 1 : o_.payload_streams;
    co.start = start;
    Served out;
    if (o_.consumers <= 1) {
      const auto t0 = Clock::now();
      ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Create(co));
      bool first = true;
      ASSIGN_OR_RETURN(out.rate, MeasureSteady(o_.seconds, [&]() -> absl::StatusOr<uint64_t> {
        ASSIGN_OR_RETURN(std::optional<client::Batch> b, c->Next());
        if (!b) return 0;
        if (!first) out.bytes += b->bytes();
        first = false;
        return b->ids.size();
      }));
      out.rate.first_batch_s = Since(t0) - out.rate.seconds;
      out.cs = c->stats();
    } else {
      ASSIGN_OR_RETURN(out.rate, ServeConsumers(co, &out.bytes, &out.cs));
    }
    return out;
  }

  absl::Status Serve(const SampleSpec& spec, const PipelineOptions& po, const std::string& config_text, int threads) {
    // Offline first: the limit.
    PipelineOptions off = po;
    off.threads = threads;
    auto t0 = Clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, Pipeline::Create(source_, spec, off, Cursor{}));
    ASSIGN_OR_RETURN(SteadyRate offline, MeasureSteady(o_.seconds, [&]() -> absl::StatusOr<uint64_t> {
      ASSIGN_OR_RETURN(std::optional<Batch> b, p->Next());
      return b ? b->ids.size() : 0;
    }));
    offline.first_batch_s = Since(t0) - offline.seconds;
    const double offline_rate = offline.rate();
    p.reset();
    const std::string cfg = work_ + "/bench-config.yaml";
    std::ofstream(cfg) << config_text;
    ServerOptions so;
    so.dataset = source_.is_mixture() ? o_.dataset : ds_.uri();
    so.config_paths = {cfg};
    so.listen = "127.0.0.1:0";
    so.threads = threads;
    so.cpu_slots = o_.cpu_slots;
    so.queue_bytes = po.queue_bytes;
    ASSIGN_OR_RETURN(std::unique_ptr<DataServer> server, DataServer::Start(so));
    // Each transport against the same server: payloads in gRPC messages, then through the
    // region the server hands the client (docs/serving.md "Same-host transport").
    ASSIGN_OR_RETURN(Served grpc, ServeStream(server->address(), false, Cursor{}));
    ASSIGN_OR_RETURN(Served shm, ServeStream(server->address(), true, Cursor{}));
    server->Shutdown(1);
    const SteadyRate& served = grpc.rate;
    const uint64_t bytes = grpc.bytes;
    const double s = served.seconds;
    // Steady state (the first batch excluded from both rates), then the start-up on its own.
    const std::string to = o_.consumers > 1 ? StrCat(o_.consumers, " consumers") : "a client";
    Row r{"all", "serve", StrCat(GrpcName(), " to ", to), threads, served.rate(), "samples/s",
          "offline pipeline", offline_rate, {}};
    r.stages = {{"mb_per_s", s > 0 ? bytes / 1e6 / s : 0}, {"client_wait_s", grpc.cs.wait_seconds}, {"seconds", s},
                {"first_batch_s", served.first_batch_s}};
    Add(std::move(r));
    Row same{"all", "serve", StrCat("same host (shared memory) to ", to), threads, shm.rate.rate(),
             "samples/s", "offline pipeline", offline_rate, {}};
    same.stages = {{"mb_per_s", shm.rate.seconds > 0 ? shm.bytes / 1e6 / shm.rate.seconds : 0},
                   {"client_wait_s", shm.cs.wait_seconds}, {"seconds", shm.rate.seconds},
                   {"first_batch_s", shm.rate.first_batch_s},
                   {"shared_memory_batches", shm.cs.shared_memory_batches}, {"batches", shm.cs.batches}};
    Add(std::move(same));
    Add(Row{"all", "serve", "time to first batch (served)", threads, served.first_batch_s, "s",
            "offline pipeline", offline.first_batch_s, {}});
    if (iperf_ == 0 && o_.plan <= 0) iperf_ = Iperf3MBps(o_.seconds);
    Add(Row{"all", "serve", "bytes to the client", threads, s > 0 ? bytes / 1e6 / s : 0, "MB/s",
            iperf_ > 0 ? "iperf3 loopback" : "", iperf_, {}});
    return absl::OkStatus();
  }

  // The serve rows again with a warm in-memory decoded-frame cache (issue 29: with one, the
  // offline pipeline runs several times the decoder, so the transport is what bounds the served
  // rate). The server gets the cache through ServerOptions, as `conveyor serve --frame-cache-bytes`
  // does; its limit is the offline pipeline with a cache of its own and the same threads. Each
  // cache is warmed by one epoch from the start (a pipeline, or one client stream: every stream
  // of a server shares its cache), cut at the frame cache rows' cap; then the timed runs start at
  // epoch 2, as the warm frame cache row does. The cache holds only frames of GOP blocks, so a
  // config with the naive order is measured here with the GOP schedule, as the frame cache rows are.
  absl::Status ServeWarm(const SampleSpec& spec, const PipelineOptions& po, const std::string& config_text,
                         int threads) {
    PipelineOptions off = po;
    off.threads = threads;
    std::string text = config_text;
    const bool forced_gop = po.order.naive();
    if (forced_gop) {
      off.order = OrderOptions::AutoGop();
      off.order.version = po.order.version;  // the schedule version the config names, if any
      ASSIGN_OR_RETURN(text, WithGopSchedule(config_text));
    }
    const Cursor timed{po.max_epochs == 1 ? 0u : 1u, 0};  // a one-epoch config has no epoch 2
    const double cap = std::max(60.0, 20 * o_.seconds);
    const std::string tier = o_.frame_cache.dir.empty() ? "frame cache" : "frame cache + node store";
    // Frame cache lookups (Find calls) that hit, over a phase: what says the cache was warm.
    auto hit_rate = [](uint64_t hits, uint64_t misses) {
      return hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0;
    };

    // The limit: the offline pipeline on its own cache, one epoch to warm it, then timed. The
    // cache is dropped before the server makes its own, so that both never hold memory at once.
    uint64_t steps = 0, offline_warm_samples = 0;
    double offline_warm_s = 0, offline_hit_rate = 0;
    SteadyRate offline;
    {
      ASSIGN_OR_RETURN(std::shared_ptr<DecodedFrameCache> cache, MakeFrameCache(ToConfig(o_.frame_cache)));
      off.frame_cache = cache;
      PipelineOptions first = off;
      first.max_epochs = 1;
      auto t0 = Clock::now();
      ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, Pipeline::Create(source_, spec, first, Cursor{}));
      steps = p->steps_per_epoch();
      while (Since(t0) < cap) {
        ASSIGN_OR_RETURN(std::optional<Batch> b, p->Next());
        if (!b) break;
        offline_warm_samples += b->ids.size();
      }
      offline_warm_s = Since(t0);
      p.reset();
      const FrameCacheStats before = cache->stats();
      t0 = Clock::now();
      ASSIGN_OR_RETURN(p, Pipeline::Create(source_, spec, off, timed));
      ASSIGN_OR_RETURN(offline, MeasureSteady(o_.seconds, [&]() -> absl::StatusOr<uint64_t> {
        ASSIGN_OR_RETURN(std::optional<Batch> b, p->Next());
        return b ? b->ids.size() : 0;
      }));
      offline.first_batch_s = Since(t0) - offline.seconds;
      p.reset();
      const FrameCacheStats after = cache->stats();
      offline_hit_rate = hit_rate(after.hits - before.hits, after.misses - before.misses);
    }
    const double offline_rate = offline.rate();

    const std::string cfg = work_ + "/bench-config-warm.yaml";
    std::ofstream(cfg) << text;
    ServerOptions so;
    so.dataset = ds_.uri();
    so.config_paths = {cfg};
    so.listen = "127.0.0.1:0";
    so.threads = threads;
    so.cpu_slots = o_.cpu_slots;
    so.queue_bytes = po.queue_bytes;
    ApplyFrameCache(o_.frame_cache, &so);
    ASSIGN_OR_RETURN(std::unique_ptr<DataServer> server, DataServer::Start(so));
    client::ClientOptions info_options;
    info_options.servers = {server->address()};
    auto cache_counts = [&]() -> absl::StatusOr<std::pair<uint64_t, uint64_t>> {
      ASSIGN_OR_RETURN(const ::conveyor::v1::InfoResponse info, client::GetInfo(info_options));
      return std::pair<uint64_t, uint64_t>{info.frame_cache().hits(), info.frame_cache().misses()};
    };

    // One client stream through epoch 1 fills the server's cache for every later stream.
    uint64_t served_warm_samples = 0;
    double served_warm_s = 0;
    {
      client::ClientOptions co = info_options;
      co.job = "bench-warm-up";
      co.max_batches = steps;
      const auto t0 = Clock::now();
      ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Create(co));
      while (Since(t0) < cap) {
        ASSIGN_OR_RETURN(std::optional<client::Batch> b, c->Next());
        if (!b) break;
        served_warm_samples += b->ids.size();
      }
      served_warm_s = Since(t0);
    }
    ASSIGN_OR_RETURN(const auto c0, cache_counts());
    ASSIGN_OR_RETURN(Served grpc, ServeStream(server->address(), false, timed));
    ASSIGN_OR_RETURN(const auto c1, cache_counts());
    ASSIGN_OR_RETURN(Served shm, ServeStream(server->address(), true, timed));
    ASSIGN_OR_RETURN(const auto c2, cache_counts());
    server->Shutdown(1);

    const uint64_t epoch_samples = steps * off.global_batch_size;
    auto fraction = [&](uint64_t samples) {
      return epoch_samples > 0 ? std::min(1.0, static_cast<double>(samples) / epoch_samples) : 0.0;
    };
    if (fraction(offline_warm_samples) < 1 || fraction(served_warm_samples) < 1) {
      Progress(StrCat("serve, warm ", tier, ": the warm-up epoch was cut at ", static_cast<int64_t>(cap),
                      " s (offline after ", static_cast<int64_t>(100 * fraction(offline_warm_samples)),
                      "% of it, served after ", static_cast<int64_t>(100 * fraction(served_warm_samples)),
                      "%); the hit rates say how warm the caches were"));
    }
    const std::string to = o_.consumers > 1 ? StrCat(o_.consumers, " consumers") : "a client";
    const std::string limit_name = StrCat("offline pipeline, warm ", tier);
    auto stages = [&](const Served& x, std::pair<uint64_t, uint64_t> before, std::pair<uint64_t, uint64_t> after) {
      const double s = x.rate.seconds;
      return json{{"mb_per_s", s > 0 ? x.bytes / 1e6 / s : 0}, {"client_wait_s", x.cs.wait_seconds}, {"seconds", s},
                  {"first_batch_s", x.rate.first_batch_s},
                  // The server's cache over this stream, beside the offline limit's over its run.
                  {"frame_cache_hit_rate", hit_rate(after.first - before.first, after.second - before.second)},
                  {"frame_cache_lookups", (after.first - before.first) + (after.second - before.second)},
                  {"offline_frame_cache_hit_rate", offline_hit_rate},
                  {"offline_first_batch_s", offline.first_batch_s},
                  {"warm_up_samples", served_warm_samples}, {"warm_up_seconds", served_warm_s},
                  {"offline_warm_up_samples", offline_warm_samples}, {"offline_warm_up_seconds", offline_warm_s},
                  {"epoch_samples", epoch_samples}, {"timed_from_epoch", timed.epoch},
                  {"schedule", forced_gop ? "gop (the config's order is naive)" : "the config's"}};
    };
    Row r{"all", "serve", StrCat(GrpcName(), " to ", to, ", warm ", tier), threads, grpc.rate.rate(), "samples/s",
          limit_name, offline_rate, {}};
    r.stages = stages(grpc, c0, c1);
    Add(std::move(r));
    Row same{"all", "serve", StrCat("same host (shared memory) to ", to, ", warm ", tier), threads,
             shm.rate.rate(), "samples/s", limit_name, offline_rate, {}};
    same.stages = stages(shm, c1, c2);
    same.stages["shared_memory_batches"] = shm.cs.shared_memory_batches;
    same.stages["batches"] = shm.cs.batches;
    Add(std::move(same));
    return absl::OkStatus();
  }

  // The job's consumers (consumer i of N, as data-parallel ranks stream) at once, one thread
  // each: their samples summed over the window in which all of them are past their first batch
  // (each stream's start-up excluded, as with one consumer). `bytes` and `cs` sum over them.
  absl::StatusOr<SteadyRate> ServeConsumers(client::ClientOptions co, uint64_t* bytes,
                                            client::ClientStats* cs) {
    const int n = o_.consumers;
    struct Arrival {
      Clock::time_point at;
      uint64_t samples;
      uint64_t bytes;
    };
    std::vector<std::vector<Arrival>> arrivals(static_cast<size_t>(n));
    std::vector<absl::Status> status(static_cast<size_t>(n));
    std::vector<client::ClientStats> stats(static_cast<size_t>(n));
    std::atomic<int> started{0};
    const auto t0 = Clock::now();
    {
      WorkerPool consumers("conveyor-consume", n, [&](int i) {
        client::ClientOptions mine = co;
        mine.consumer = i;
        mine.consumers = n;
        absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(mine);
        if (!c.ok()) {
          status[static_cast<size_t>(i)] = c.status();
          started.fetch_add(1);
          return;
        }
        bool counted = false;
        Clock::time_point all_started;
        for (;;) {
          absl::StatusOr<std::optional<client::Batch>> b = (*c)->Next();
          if (!b.ok()) {
            status[static_cast<size_t>(i)] = b.status();
            break;
          }
          if (!b->has_value()) break;
          arrivals[static_cast<size_t>(i)].push_back(
              {Clock::now(), (*b)->ids.size(), (*b)->bytes()});
          if (!counted) {
            counted = true;
            started.fetch_add(1);
          }
          // Measure for `seconds` once every consumer has its first batch.
          if (started.load() == n) {
            if (all_started == Clock::time_point{}) all_started = Clock::now();
            if (Since(all_started) >= o_.seconds) break;
          }
        }
        if (!counted) started.fetch_add(1);
        stats[static_cast<size_t>(i)] = (*c)->stats();
      });
    }  // joins
    for (const absl::Status& st : status) RETURN_IF_ERROR(st);
    Clock::time_point start{}, end = Clock::time_point::max();
    for (const auto& a : arrivals) {
      if (a.empty()) return absl::InternalError("a consumer received no batch");
      start = std::max(start, a.front().at);
      end = std::min(end, a.back().at);
    }
    SteadyRate r;
    r.first_batch_s = std::chrono::duration<double>(start - t0).count();
    for (const auto& a : arrivals) {
      for (const Arrival& x : a) {
        if (x.at > start && x.at <= end) {
          r.samples += x.samples;
          *bytes += x.bytes;
        }
      }
    }
    r.seconds = end > start ? std::chrono::duration<double>(end - start).count() : 0;
    for (const client::ClientStats& st : stats) {
      cs->wait_seconds += st.wait_seconds;
      cs->batches += st.batches;
      cs->shared_memory_batches += st.shared_memory_batches;
      if (!st.shared_memory_refused.empty()) cs->shared_memory_refused = st.shared_memory_refused;
    }
    return r;
  }

  const BenchOptions& o_;
  const Source& source_;
  const Dataset& ds_;  // the source's first (for a single dataset: only) dataset
  std::string work_;
  SampleIndex index_;
  double cat_ = 0;
  double iperf_ = 0;
  std::map<int, double> video_fps_limit_;
  std::map<int, double> bucket_fps_limit_;  // the CLI's decode + bucket crop + scale, by threads
  bool mixed_sizes_ = false;                // buckets: clips of several sizes
  bool bucket_fill_logged_ = false;
  std::map<int, double> image_fps_limit_;  // tjbench or memcpy, by threads (JPEG / raw images)
  std::map<int, std::string> image_limit_tool_;  // "tjbench" or "memcpy", by threads
  std::map<int, GopBaseline> gop_;
  std::vector<Row> rows_;
};

// A grouped bar chart: one panel per modality, bars per (stage, order) and thread count, the
// limits drawn as black ticks. Debian's python3-matplotlib, run by /usr/bin/python3.
constexpr char kPlotScript[] = R"PY(
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = json.load(open(sys.argv[1]))["rows"]
mods = [m for m in ["video", "image", "audio", "lowdim", "all"] if any(r["modality"] == m for r in rows)]
fig, axes = plt.subplots(1, len(mods), figsize=(5 * len(mods), 4.5), squeeze=False)
for ax, m in zip(axes[0], mods):
    rs = [r for r in rows if r["modality"] == m]
    labels = []
    for r in rs:
        key = r["stage"] + ("\n" + r["order"] if r["order"] else "")
        if key not in labels:
            labels.append(key)
    threads = sorted({r["threads"] for r in rs})
    w = 0.8 / len(threads)
    for j, t in enumerate(threads):
        for i, key in enumerate(labels):
            for r in rs:
                k = r["stage"] + ("\n" + r["order"] if r["order"] else "")
                if k == key and r["threads"] == t:
                    x = i + (j - (len(threads) - 1) / 2) * w
                    ax.bar(x, r["value"], w, color="C%d" % j, label="%d thread%s" % (t, "s" if t > 1 else "") if i == 0 else None)
                    if r["limit"] > 0:
                        ax.plot([x - w / 2, x + w / 2], [r["limit"]] * 2, color="black", lw=2)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_title(m + " (black: the limit in the same run)")
    ax.set_ylabel("per second (units in the table)")
    ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
)PY";

// Capacity planning from the serve rows just measured: the per-core rate is the lowest of
// samples/s / threads over the thread counts (scaling is rarely linear, so the most threads
// measured usually set it), and the job needs target / that rate cores.
absl::Status PrintPlan(const BenchOptions& o, const std::vector<Row>& rows) {
  json measured = json::array();
  double per_core = 0;
  int at_threads = 0;
  for (const Row& r : rows) {
    // The gRPC rows: servers on nodes of their own reach their trainers over the network; the
    // same-host row is what a server beside its trainers does better.
    if (r.stage != "serve" || r.unit != "samples/s" || r.order.rfind("gRPC", 0) != 0) continue;
    const double pc = r.value / r.threads;
    measured.push_back({{"threads", r.threads}, {"samples_per_s", r.value}, {"per_core", pc},
                        {"offline_samples_per_s", r.limit}});
    if (per_core == 0 || pc < per_core) {
      per_core = pc;
      at_threads = r.threads;
    }
  }
  if (per_core <= 0) {
    return absl::FailedPreconditionError("no samples came through the server: nothing to plan from");
  }
  const double cores = o.plan / per_core;
  const int64_t cores_job = static_cast<int64_t>(std::ceil(cores - 1e-9));
  const double cores_per_gpu = cores / o.gpus;
  const int64_t servers = static_cast<int64_t>(std::ceil(cores / o.server_cores - 1e-9));
  std::printf("\nplan: %.1f samples/s for %d GPU%s (%.1f per GPU), %s\n", o.plan, o.gpus,
              o.gpus > 1 ? "s" : "", o.plan / o.gpus,
              o.config.empty() ? "the default spec" : o.config.c_str());
  std::printf("  measured on this machine (%u cores), the whole config through a server to %d "
              "consumer%s at once:\n",
              std::thread::hardware_concurrency(), o.consumers, o.consumers > 1 ? "s" : "");
  std::printf("  %7s %12s %12s %12s\n", "threads", "samples/s", "per core", "offline");
  for (const json& m : measured) {
    std::printf("  %7d %12.1f %12.1f %12.1f\n", m["threads"].get<int>(), m["samples_per_s"].get<double>(),
                m["per_core"].get<double>(), m["offline_samples_per_s"].get<double>());
  }
  std::printf("  per-core rate used: %.1f samples/s (the lowest per core, at %d thread%s)\n", per_core,
              at_threads, at_threads > 1 ? "s" : "");
  std::printf("  server cores: %.2f for the job = %lld cores, %.2f per GPU\n", cores,
              static_cast<long long>(cores_job), cores_per_gpu);
  std::printf("  servers of %d cores: %lld + 1 spare = %lld (deploy/README.md \"How many servers\")\n",
              o.server_cores, static_cast<long long>(servers), static_cast<long long>(servers + 1));
  std::printf("  measured with the client on the server's cores (a server node of its own does "
              "better) and over loopback (check the MB/s against the nodes' network).\n");
  if (!o.json.empty()) {
    const json doc = {{"dataset", o.dataset},
                      {"config", o.config},
                      {"nproc", std::thread::hardware_concurrency()},
                      {"plan",
                       {{"target_samples_per_s", o.plan},
                        {"gpus", o.gpus},
                        {"consumers", o.consumers},
                        {"measured", measured},
                        {"per_core_samples_per_s", per_core},
                        {"per_core_threads", at_threads},
                        {"cores", cores},
                        {"cores_for_the_job", cores_job},
                        {"cores_per_gpu", cores_per_gpu},
                        {"server_cores", o.server_cores},
                        {"servers", servers},
                        {"servers_with_spare", servers + 1}}}};
    std::ofstream f(o.json);
    f << doc.dump(2) << "\n";
    if (!f) return absl::InternalError(StrCat("cannot write ", o.json));
    std::printf("wrote %s\n", o.json.c_str());
  }
  return absl::OkStatus();
}

// The frame cache flags given, as a command line would give them ("" without a cache).
std::string FrameCacheFlagsText(const FrameCacheFlags& f) {
  if (f.bytes == 0 && f.dir.empty()) return "";
  std::string out = StrCat("--frame-cache-bytes ", f.bytes, " --frame-cache-policy ", f.policy);
  if (f.prefault) out += " --frame-cache-prefault";
  if (!f.dir.empty()) {
    StrAppend(&out, " --frame-cache-dir ", f.dir, " --frame-cache-dir-bytes ", f.dir_bytes,
              " --frame-cache-compression ", f.compression);
  }
  return out;
}

// The options' ranges, before anything is opened.
absl::Status CheckOptions(const BenchOptions& o) {
  if (o.threads.empty()) return absl::InvalidArgumentError("--threads needs at least one count");
  for (int t : o.threads) {
    if (t < 1 || t > 256) return absl::InvalidArgumentError(StrCat("--threads ", t, ": expected 1..256"));
  }
  if (o.seconds <= 0) return absl::InvalidArgumentError("--seconds must be > 0");
  if (o.plan < 0 || !std::isfinite(o.plan)) {
    return absl::InvalidArgumentError(StrCat("--plan ", o.plan, ": give the job's target samples/s (> 0)"));
  }
  if (o.plan > 0 && !o.serve) {
    return absl::InvalidArgumentError("--plan measures through a server: drop --no-serve");
  }
  if (o.gpus < 1 || o.server_cores < 1) {
    return absl::InvalidArgumentError(StrCat("--gpus ", o.gpus, " --server-cores ", o.server_cores, ": need >= 1"));
  }
  if (o.consumers < 1 || o.consumers > 256) {
    return absl::InvalidArgumentError(StrCat("--consumers ", o.consumers, ": need 1 to 256"));
  }
  return absl::OkStatus();
}

// The config's text and spec: --config, or every stream with frames and low-dim steps at the
// anchor time and one second of audio before it.
absl::Status BenchSpec(const BenchOptions& o, const Manifest& manifest, std::string* text,
                       SampleSpec* spec) {
  if (!o.config.empty()) {
    ASSIGN_OR_RETURN(*text, ReadLocalFile(o.config, "config"));
    ASSIGN_OR_RETURN(*spec, SampleSpec::FromYaml(*text, manifest, o.config));
  } else {
    // Every stream: frames and low-dim steps at the anchor time, one second of audio before it.
    ASSIGN_OR_RETURN(const SampleSpec defaults, SampleSpec::Default(manifest));
    *text = StrCat("anchor: ", defaults.anchor, "\nstreams:\n");
    for (const StreamInfo& s : manifest.streams) {
      const std::string kind = KindName(s.kind);
      StrAppend(text, "  ", s.name, ": ",
                kind == "audio"                        ? "{delta_timestamps: [-1.0, 0.0]}"
                : kind == "text" || kind == "unknown" ? "{}"
                                                       : "{delta_timestamps: [0.0]}",
                "\n");
    }
    ASSIGN_OR_RETURN(*spec, SampleSpec::FromYaml(*text, manifest, "the default bench spec"));
  }
  return absl::OkStatus();
}

// The table of rows and where the time went, on stdout; the rows as JSON.
json PrintRows(const std::vector<Row>& rows) {
  std::printf("\n%-7s %-9s %-20s %7s %12s %-22s %12s %7s\n", "modality", "stage", "order", "threads",
              "value", "unit", "limit", "ratio");
  json out = json::array();
  for (const Row& r : rows) {
    std::printf("%-7s  %-9s %-20s %7d %12.1f %-22s %12s %7s\n", r.modality.c_str(), r.stage.c_str(),
                r.order.c_str(), r.threads, r.value, r.unit.c_str(),
                r.limit > 0 ? StrCat(static_cast<int64_t>(r.limit)).c_str() : "-",
                r.limit > 0 ? StrCat(std::round(100 * r.value / r.limit) / 100).c_str() : "-");
    out.push_back({{"modality", r.modality}, {"stage", r.stage}, {"order", r.order}, {"threads", r.threads},
                    {"value", r.value}, {"unit", r.unit}, {"limit_name", r.limit_name}, {"limit", r.limit},
                    {"ratio", r.limit > 0 ? r.value / r.limit : 0}, {"stages", r.stages}});
    if (!r.frame_cache.is_null()) out.back()["frame_cache"] = r.frame_cache;
  }
  std::printf("\nwhere the time goes (seconds summed over workers; shares of their sum):\n");
  for (const Row& r : rows) {
    if (!r.stages.is_object() || !r.stages.contains("decode_s")) continue;
    const double d = r.stages["decode_s"], a = r.stages["assemble_s"], b = r.stages["batch_s"],
                 w = r.stages["wait_s"], i = r.stages["worker_idle_s"];
    const double sum = std::max(d + a + b + w + i, 1e-9);
    std::printf("  %-7s %-20s %d thread%s: pre-decode %3.0f%%, assemble (decode, resize, augment) %3.0f%%, "
                "batch/pack %3.0f%%, consumer waited %3.0f%%, workers idle %3.0f%%; amplification %.2f\n",
                r.modality.c_str(), r.order.c_str(), r.threads, r.threads > 1 ? "s" : "", 100 * d / sum,
                100 * a / sum, 100 * b / sum, 100 * w / sum, 100 * i / sum,
                r.stages["amplification"].get<double>());
    if (r.stages.contains("read_amplification")) {
      std::printf("  %-7s %-20s %d thread%s: %llu episode reads of %llu distinct episodes: read amplification %.3f\n",
                  r.modality.c_str(), r.order.c_str(), r.threads, r.threads > 1 ? "s" : "",
                  static_cast<unsigned long long>(r.stages["episode_reads"].get<uint64_t>()),
                  static_cast<unsigned long long>(r.stages["distinct_episodes"].get<uint64_t>()),
                  r.stages["read_amplification"].get<double>());
    }
  }
  for (const Row& r : rows) {
    if (r.stage != "serve" || !r.stages.is_object()) continue;
    std::printf("  serve %d thread%s, %s: %.1f MB/s to the client, which waited %.2f of %.2f s%s\n", r.threads,
                r.threads > 1 ? "s" : "", r.order.c_str(), r.stages["mb_per_s"].get<double>(),
                r.stages["client_wait_s"].get<double>(), r.stages["seconds"].get<double>(),
                r.stages.contains("frame_cache_hit_rate")
                    ? absl::StrFormat("; frame cache hit rate %.3f served, %.3f offline",
                                      r.stages["frame_cache_hit_rate"].get<double>(),
                                      r.stages["offline_frame_cache_hit_rate"].get<double>()).c_str()
                    : "");
  }
  return out;
}

// The decoded-frame cache rows (true when there were any), then what each limit is.
bool PrintCacheRowsAndLimits(const BenchOptions& o, const std::vector<Row>& rows,
                             const std::string& cache_flags) {
  bool cache_rows = false;
  for (const Row& r : rows) {
    if (r.frame_cache.is_null()) continue;
    const json& c = r.frame_cache;
    if (!cache_rows) {
      std::printf("\nthe decoded-frame cache (video, shuffled gop; %s):\n", cache_flags.c_str());
      cache_rows = true;
    }
    const double uncached = c["uncached_samples_per_s"], bound = c["decode_bound_samples_per_s"];
    std::printf("  %d thread%s, epoch %s: %.1f samples/s, %.2fx uncached (%.1f), %.2fx the decode bound (%.1f); "
                "first batch %.2f s%s%s\n",
                r.threads, r.threads > 1 ? "s" : "", c["epoch"].get<std::string>().c_str(), r.value,
                uncached > 0 ? r.value / uncached : 0.0, uncached, bound > 0 ? r.value / bound : 0.0, bound,
                c["first_batch_s"].get<double>(),
                c.contains("epoch_1_seconds")
                    ? absl::StrFormat("; %llu samples in %.2f s from the start", c["epoch_1_samples"].get<unsigned long long>(),
                                      c["epoch_1_seconds"].get<double>()).c_str()
                    : "",
                c["epoch"] == "1" && c["epoch_1_fraction"].get<double>() < 1
                    ? StrCat("; cut after ", static_cast<int64_t>(100 * c["epoch_1_fraction"].get<double>()), "% of the epoch").c_str()
                    : "");
    std::printf("    hit rate %.3f: %llu frames from the cache, %llu decoded into it (%llu decoded in all), %llu blocks "
                "not decoded at all; about %.2f s of decoding saved; %llu frames not admitted, %.1f MB evicted\n",
                c["hit_rate"].get<double>(), c["frames_from_cache"].get<unsigned long long>(),
                c["frames_decoded_into_cache"].get<unsigned long long>(), c["frames_decoded"].get<unsigned long long>(),
                c["blocks_not_decoded"].get<unsigned long long>(), c["decode_seconds_saved"].get<double>(),
                c["not_admitted"].get<unsigned long long>(), c["evicted_bytes"].get<double>() / 1e6);
    std::printf("    %s\n", c["summary"].get<std::string>().c_str());
  }
  std::printf("\nlimits: cat = `cat` of the shards (page cache warm); ffmpeg = the CLI with one "
              "thread per process, one process per thread, on the same stream extracted to a file; "
              "decode bound = ffmpeg's rate / (amplification x frames per sample); serve is beside "
              "the offline pipeline with the same threads.\n");
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.order == "bucket crop and scale"; })) {
    std::printf("buckets: a dataset of several sizes, so each decode row's threads decode whole clips and its CLI "
                "limit decodes the same clips, one process per clip; bucket crop and scale = every frame cut to its clip's bucket "
                "and scaled to its size, beside the CLI's `-vf crop=W:H:X:Y,scale=BW:BH` on the same clips; "
                "bucket bound = that CLI rate / (amplification x frames per sample).\n");
  }
  for (const Row& r : rows) {
    if (r.stage != "serve" || r.order.find(", warm frame cache") == std::string::npos) continue;
    std::printf("serve, warm frame cache (%s): a server with the cache, warmed by one client stream through "
                "epoch 1 (cut at max(60 s, 20 x --seconds)), then each transport from epoch 2, beside the "
                "offline pipeline with a cache of its own warmed the same way; a naive config is measured with "
                "the GOP schedule there (the cache holds GOP blocks' frames). The served and offline hit rates "
                "are in the lines above.\n",
                cache_flags.c_str());
    break;
  }
  if (cache_rows) {
    std::printf("frame cache rows (%s): the video gop pipeline with a fresh cache: epoch 1 (cold) from the "
                "start to the end of the first epoch (cut at max(60 s, 20 x --seconds)), then epoch 2+ (warm) "
                "for --seconds on what epoch 1 left in the cache; steady state, the first batch apart (its time "
                "in the lines above). Beside each: the uncached gop row of the same threads (\"uncached\") and "
                "its decode bound (the limit column): a warm ratio above 1 is what the cache buys. Hit rate: "
                "frames taken from the cache / frames the GOP blocks needed; decoding saved: those frames x the "
                "uncached row's worker decode seconds per frame.%s\n",
                cache_flags.c_str(),
                o.frame_cache.dir.empty() ? ""
                                          : " The node store keeps what earlier runs and thread counts published: "
                                            "epoch 1 is cold only for an empty store (its hits say how cold).");
  }
  return cache_rows;
}

// One Markdown table per modality, for bench/RESULTS.md (--markdown).
absl::Status WriteMarkdown(const BenchOptions& o, const std::vector<Row>& rows,
                           double cat_bytes_per_s, const std::string& cache_flags, bool cache_rows) {
  // One table per modality, for bench/RESULTS.md.
  std::ofstream md(o.markdown);
  md << "Command: `conveyor bench " << o.dataset << (o.config.empty() ? "" : " --config " + o.config)
     << (o.modality == "all" ? "" : " --modality " + o.modality) << " --seconds " << o.seconds
     << (cache_flags.empty() ? "" : " " + cache_flags) << "`; " << std::thread::hardware_concurrency() << " cores; `cat` of the shards "
     << static_cast<int64_t>(cat_bytes_per_s / 1e6) << " MB/s.\n";
  std::string current;
  for (const Row& r : rows) {
    if (r.modality != current) {
      current = r.modality;
      md << "\n**" << (current == "all" ? "end to end (the whole config)" : current) << "**\n\n"
         << "| stage | order | threads | figure | unit | limit | limit figure | ratio |\n"
         << "|---|---|---|---|---|---|---|---|\n";
    }
    char line[512];
    std::snprintf(line, sizeof line, "| %s | %s | %d | %.1f | %s | %s | %s | %s |\n", r.stage.c_str(),
                  r.order.c_str(), r.threads, r.value, r.unit.c_str(),
                  r.limit > 0 ? r.limit_name.c_str() : "-",
                  r.limit > 0 ? StrCat(std::round(10 * r.limit) / 10).c_str() : "-",
                  r.limit > 0 ? StrCat(std::round(100 * r.value / r.limit) / 100).c_str() : "-");
    md << line;
  }
  if (cache_rows) {
    md << "\n**decoded-frame cache (video, shuffled gop" << (o.frame_cache.dir.empty() ? "" : ", with the node store")
       << ")**\n\n"
       << "| epoch | threads | samples/s | uncached samples/s | decode bound | vs uncached | vs decode bound | "
          "first batch s | hit rate | frames decoded | held MB / bound MB | frames held | evicted MB | "
          "not admitted | decode s saved |"
       << (o.frame_cache.dir.empty() ? "" : " node store hits / misses / published |") << "\n"
       << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" << (o.frame_cache.dir.empty() ? "" : "---|")
       << "\n";
    for (const Row& r : rows) {
      if (r.frame_cache.is_null()) continue;
      const json& c = r.frame_cache;
      const double uncached = c["uncached_samples_per_s"], bound = c["decode_bound_samples_per_s"];
      char line[640];
      std::snprintf(line, sizeof line,
                    "| %s%s | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.3f | %llu | %.1f / %.1f | %llu | %.1f | "
                    "%llu | %.2f |",
                    c["epoch"].get<std::string>().c_str(),
                    c["epoch"] == "1" && c["epoch_1_fraction"].get<double>() < 1 ? " (cut)" : "", r.threads, r.value,
                    uncached, bound, uncached > 0 ? r.value / uncached : 0.0, bound > 0 ? r.value / bound : 0.0,
                    c["first_batch_s"].get<double>(), c["hit_rate"].get<double>(),
                    c["frames_decoded"].get<unsigned long long>(), c["held_bytes"].get<double>() / 1e6,
                    c["bound_bytes"].get<double>() / 1e6, c["frames"].get<unsigned long long>(),
                    c["evicted_bytes"].get<double>() / 1e6, c["not_admitted"].get<unsigned long long>(),
                    c["decode_seconds_saved"].get<double>());
      md << line;
      if (c.contains("store")) {
        const json& st = c["store"];
        md << " " << st["hits"].get<uint64_t>() << " / " << st["misses"].get<uint64_t>() << " / "
           << st["published"].get<uint64_t>() << " |";
      }
      md << "\n";
    }
  }
  if (!md) return absl::InternalError(StrCat("cannot write ", o.markdown));
  std::printf("wrote %s\n", o.markdown.c_str());
  return absl::OkStatus();
}

// A PNG of the JSON document (--plot), through matplotlib.
absl::Status WritePlot(const std::string& work, const std::string& json_path, const std::string& plot) {
  const std::string script = work + "/plot.py";
  std::ofstream(script) << kPlotScript;
  const std::string cmd = "/usr/bin/python3 '" + script + "' '" + json_path + "' '" + plot + "'";
  if (std::system(cmd.c_str()) != 0) {
    return absl::FailedPreconditionError(StrCat("the plot needs /usr/bin/python3 with matplotlib "
                                                "(apt-get install python3-matplotlib): ", cmd, " failed"));
  }
  std::printf("wrote %s\n", plot.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunBench(const BenchOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  ASSIGN_OR_RETURN(std::unique_ptr<Source> source, Source::Open(o.dataset));
  if (source->is_mixture() && o.config.empty()) {
    return absl::InvalidArgumentError(StrCat(o.dataset, " is a mixture: give its config (--config F), "
                                             "written against the mixture's stream names"));
  }
  const Manifest& manifest = source->manifest();
  spdlog::set_level(spdlog::level::warn);  // the in-process server's per-stream lines
  std::string text;
  SampleSpec spec;
  RETURN_IF_ERROR(BenchSpec(o, manifest, &text, &spec));
  PipelineOptions po;
  RETURN_IF_ERROR(po.MergeYaml(text, spec, manifest, o.config.empty() ? "default spec" : o.config));
  RETURN_IF_ERROR(ResolveSchedule(*source, spec, &po));
  const std::string work = (std::filesystem::temp_directory_path() /
                            StrCat("conveyor-bench-", getpid())).string();
  std::filesystem::create_directories(work);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{work};

  std::fprintf(stderr, "bench: %s (%zu episodes), %s, threads", o.dataset.c_str(), static_cast<size_t>(manifest.num_episodes),
               o.config.empty() ? "the default spec" : o.config.c_str());
  for (int t : o.threads) std::fprintf(stderr, " %d", t);
  std::fprintf(stderr, ", %.1f s per figure\n", o.seconds);
  Bench bench(o, *source, work);
  if (o.plan > 0) {
    if (bench.frame_cache_on()) std::fprintf(stderr, "bench: --plan measures the serve rows only: no frame cache rows\n");
    RETURN_IF_ERROR(bench.RunServeOnly(spec, po, text));
    return PrintPlan(o, bench.rows());
  }
  RETURN_IF_ERROR(bench.Run(spec, po, text));

  const json rows = PrintRows(bench.rows());
  const std::string cache_flags = FrameCacheFlagsText(o.frame_cache);
  const bool cache_rows = PrintCacheRowsAndLimits(o, bench.rows(), cache_flags);
  const json doc = {{"dataset", o.dataset}, {"config", o.config}, {"cat_bytes_per_s", bench.cat_bytes_per_s()},
                    {"nproc", std::thread::hardware_concurrency()}, {"consumers", o.consumers},
                    {"cpu_slots", o.cpu_slots < 0 ? AvailableCpus() + 1 : o.cpu_slots}, {"rows", rows}};
  std::string json_path = o.json;
  if (json_path.empty() && !o.plot.empty()) json_path = work + "/bench.json";
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << doc.dump(2) << "\n";
    if (!f) return absl::InternalError(StrCat("cannot write ", json_path));
    if (!o.json.empty()) std::printf("wrote %s\n", o.json.c_str());
  }
  if (!o.markdown.empty()) {
    RETURN_IF_ERROR(WriteMarkdown(o, bench.rows(), bench.cat_bytes_per_s(), cache_flags, cache_rows));
  }
  if (!o.plot.empty()) RETURN_IF_ERROR(WritePlot(work, json_path, o.plot));
  return absl::OkStatus();
}

}  // namespace conveyor::tools
