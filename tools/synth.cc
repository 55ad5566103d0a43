// `conveyor synth`: realistic synthetic robot episodes, really encoded through libavcodec
// (media/media_encoder.h).
//
// Episodes are generated in parallel (one encoder per camera, single-threaded, so output is
// deterministic) and handed to the DatasetWriter in episode order, with at most 2 x threads
// episodes in memory.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/worker_pool.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/media_encoder.h"
#include "format/dataset_writer.h"
#include "tools/command.h"
#include "tools/commands.h"
#include "tools/synth_signals.h"

namespace conveyor::tools {
namespace {

namespace pb = format::v1;

std::vector<std::string> StateNames(int dim, const std::string& prefix) {
  static const char* const kAloha[] = {"waist", "shoulder", "elbow", "forearm_roll",
                                       "wrist_angle", "wrist_rotate", "gripper"};
  std::vector<std::string> names;
  for (int d = 0; d < dim; ++d) {
    if (dim == 14) {
      names.push_back(StrCat(d < 7 ? "left_" : "right_", kAloha[d % 7]));
    } else {
      names.push_back(StrCat(prefix, "_", d));
    }
  }
  return names;
}

// Generates and encodes episode `e` entirely in memory.
absl::StatusOr<EpisodeData> MakeEpisode(const SynthOptions& o, int e, uint64_t* frames_encoded) {
  const EpisodePlan plan = PlanEpisode(o.seed, e, o.min_seconds, o.max_seconds, o.fps,
                                       o.lowdim_rate, o.cameras, o.state_dim);
  EpisodeData ep;
  ep.source = StrCat("synth seed=", o.seed, " episode=", e);

  // Cameras: render, record each frame's mean colour, encode.
  std::vector<std::vector<float>> means(o.cameras);  // [camera][frame * 3 + ch]
  std::vector<uint8_t> rgb;
  VideoEncoderOptions video;
  video.codec = o.video_codec;
  video.width = o.width;
  video.height = o.height;
  video.fps = o.fps;
  video.gop = o.gop;
  for (int cam = 0; cam < o.cameras; ++cam) {
    const std::string name = StrCat("cam", cam);
    const std::string where = StrCat("synth episode ", e, ", stream '", name, "'");
    ASSIGN_OR_RETURN(std::unique_ptr<VideoEncoder> enc, VideoEncoder::Open(video, where));
    means[cam].resize(static_cast<size_t>(plan.num_frames) * 3);
    for (int k = 0; k < plan.num_frames; ++k) {
      RenderFrame(plan, o.seed, e, cam, k, o.fps, o.width, o.height, &rgb, &means[cam][k * 3]);
      RETURN_IF_ERROR(enc->Encode(rgb, k));
    }
    ASSIGN_OR_RETURN(EpisodeData::Stream s, enc->Finish());
    *frames_encoded += static_cast<uint64_t>(plan.num_frames);
    s.info.name = name;
    ep.streams.push_back(std::move(s));
  }

  // Audio.
  if (o.audio_codec != "none") {
    std::vector<float> samples;
    RenderAudio(plan, o.seed, e, o.audio_rate, &samples);
    ASSIGN_OR_RETURN(EpisodeData::Stream s,
                     EncodeMonoAudio({.codec = o.audio_codec, .sample_rate = o.audio_rate}, samples,
                                     StrCat("synth episode ", e, ", stream 'audio'")));
    s.info.name = "audio";
    ep.streams.push_back(std::move(s));
  }

  // State and action at the low-dimensional rate.
  EpisodeData::Stream state, action;
  state.info = {"observation.state", pb::LOWDIM, "zstd-shuffle4", o.lowdim_rate,
                {o.state_dim}, StateNames(o.state_dim, "state"), ""};
  action.info = {"action", pb::LOWDIM, "zstd-shuffle4", o.lowdim_rate,
                 {o.action_dim}, StateNames(o.action_dim, "action"), ""};
  std::vector<float> s_row(o.state_dim), a_row(o.action_dim);
  std::vector<const float*> cam_means(o.cameras);
  for (int i = 0; i < plan.num_steps; ++i) {
    const double t = i / o.lowdim_rate;
    for (int d = 0; d < o.state_dim; ++d) s_row[d] = static_cast<float>(plan.state[d].At(t));
    const int k = FrameAtTime(t, o.fps, plan.num_frames);
    for (int cam = 0; cam < o.cameras; ++cam) cam_means[cam] = &means[cam][k * 3];
    ComputeAction(s_row.data(), o.state_dim, cam_means, o.action_dim, a_row.data());
    state.timestamps_s.push_back(t);
    action.timestamps_s.push_back(t);
    state.values.insert(state.values.end(), s_row.begin(), s_row.end());
    action.values.insert(action.values.end(), a_row.begin(), a_row.end());
  }
  if (o.state_dim > 0) ep.streams.push_back(std::move(state));
  if (o.action_dim > 0) ep.streams.push_back(std::move(action));

  EpisodeData::Stream text;
  text.info = {"instruction", pb::TEXT, "utf-8", 0, {}, {}, ""};
  text.text = o.captions ? VideoCaption(plan, o.seed, e) : plan.instruction;
  ep.streams.push_back(std::move(text));
  return ep;
}

absl::Status CheckOptions(const SynthOptions& o) {
  auto bad = [](std::string_view what) { return absl::InvalidArgumentError(std::string(what)); };
  if (o.out.empty()) return bad("--out is required");
  if (o.episodes < 1) return bad(StrCat("--episodes must be at least 1 (got ", o.episodes, ")"));
  if (o.cameras < 0 || o.cameras > 16) return bad(StrCat("--cameras must be in [0, 16] (got ", o.cameras, ")"));
  if (o.width < 16 || o.height < 16 || o.width > 4096 || o.height > 4096 || o.width % 2 || o.height % 2) {
    return bad(StrCat("--size ", o.width, "x", o.height,
                      " is not supported: width and height must be even and in [16, 4096]"));
  }
  if (!(o.fps > 0 && o.fps <= 240)) return bad(StrCat("--fps must be in (0, 240] (got ", o.fps, ")"));
  if (o.gop < 1 || o.gop > 1000) return bad(StrCat("--gop must be in [1, 1000] (got ", o.gop, ")"));
  if (!IsKnownVideoCodec(o.video_codec)) {
    return bad(StrCat("--video-codec '", o.video_codec, "' is not one of h264, hevc, av1, vp9"));
  }
  if (o.audio_codec != "none" && !IsKnownAudioCodec(o.audio_codec)) {
    return bad(StrCat("--audio-codec '", o.audio_codec, "' is not one of aac, opus, flac, none"));
  }
  if (o.audio_rate < 8000 || o.audio_rate > 192000) {
    return bad(StrCat("--audio-rate must be in [8000, 192000] (got ", o.audio_rate, ")"));
  }
  if (o.state_dim < 0 || o.action_dim < 0 || o.state_dim > 4096 || o.action_dim > 4096) {
    return bad("--state-dim and --action-dim must be in [0, 4096]");
  }
  if (!(o.lowdim_rate > 0 && o.lowdim_rate <= 10000)) {
    return bad(StrCat("--lowdim-rate must be in (0, 10000] (got ", o.lowdim_rate, ")"));
  }
  if (!(o.min_seconds > 0) || o.max_seconds < o.min_seconds || o.max_seconds > 3600) {
    return bad(StrCat("--episode-seconds ", o.min_seconds, ":", o.max_seconds,
                      " must satisfy 0 < MIN <= MAX <= 3600"));
  }
  if (o.episodes_per_shard < 1) return bad("--episodes-per-shard must be at least 1");
  return absl::OkStatus();
}

}  // namespace

absl::Status RunSynth(const SynthOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  // Fail fast on a codec this FFmpeg cannot encode, before any work.
  RETURN_IF_ERROR(CheckVideoEncoderAvailable(options.video_codec));
  if (options.audio_codec != "none") {
    RETURN_IF_ERROR(CheckAudioEncoderAvailable(options.audio_codec));
  }
  DatasetWriter::Options wo;
  wo.name = StrCat("synth-seed", options.seed);
  wo.created_by = "conveyor synth";
  wo.episodes_per_shard = options.episodes_per_shard;
  ASSIGN_OR_RETURN(std::unique_ptr<DatasetWriter> writer, DatasetWriter::Create(options.out, wo));

  const int threads = std::max(1, std::min(options.threads > 0 ? options.threads
                                                               : static_cast<int>(std::thread::hardware_concurrency()),
                                           options.episodes));
  const int max_in_flight = 2 * threads;

  // Workers generate episodes in any order; this thread writes them in episode order. Workers
  // may run at most max_in_flight episodes ahead of the writer, which bounds memory.
  struct State {
    absl::Mutex mu;
    std::map<int, absl::StatusOr<EpisodeData>> done ABSL_GUARDED_BY(mu);  // finished, not yet written
    int next_to_start ABSL_GUARDED_BY(mu) = 0;
    int next_to_write ABSL_GUARDED_BY(mu) = 0;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
  } state;
  std::atomic<uint64_t> frames{0};

  auto worker = [&] {
    while (true) {
      int e;
      {
        absl::MutexLock lock(&state.mu);
        auto may_start = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
          return state.cancelled || state.next_to_start - state.next_to_write < max_in_flight;
        };
        state.mu.Await(absl::Condition(&may_start));
        if (state.cancelled || state.next_to_start >= options.episodes) return;
        e = state.next_to_start++;
      }
      uint64_t f = 0;
      absl::StatusOr<EpisodeData> ep = MakeEpisode(options, e, &f);
      frames += f;
      absl::MutexLock lock(&state.mu);
      state.done.emplace(e, std::move(ep));
    }
  };
  WorkerPool pool("conveyor-synth", threads, [&](int) { worker(); });

  const auto start = std::chrono::steady_clock::now();
  const bool tty = isatty(STDERR_FILENO);
  absl::Status status;
  for (int e = 0; e < options.episodes && status.ok(); ++e) {
    absl::StatusOr<EpisodeData> ep;
    {
      absl::MutexLock lock(&state.mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) { return state.done.count(e) > 0; };
      state.mu.Await(absl::Condition(&ready));
      ep = std::move(state.done.at(e));
      state.done.erase(e);
    }
    status = ep.ok() ? writer->AddEpisode(*ep) : ep.status();
    {
      absl::MutexLock lock(&state.mu);
      state.next_to_write = e + 1;
      if (!status.ok()) state.cancelled = true;
    }
    if (options.progress && status.ok()) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "%ssynth: %d/%d episodes, %llu frames encoded, %.0f frames/s, %.1f MB written%s",
                   tty ? "\r" : "", e + 1, options.episodes,
                   static_cast<unsigned long long>(frames.load()), frames.load() / std::max(secs, 1e-9),
                   writer->bytes_written() / 1e6, tty ? "" : "\n");
      std::fflush(stderr);
    }
  }
  if (options.progress && tty) std::fprintf(stderr, "\n");
  pool.Join();
  RETURN_IF_ERROR(status);
  ASSIGN_OR_RETURN(Manifest m, writer->Finish());
  if (options.progress) {
    std::fprintf(stderr, "synth: wrote %llu episodes (%.1f s of robot time) in %zu shards, %.1f MB, to %s\n",
                 static_cast<unsigned long long>(m.num_episodes), m.total_duration_s, m.shards.size(),
                 m.total_bytes / 1e6, options.out.c_str());
  }
  return absl::OkStatus();
}


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

// `conveyor synth`: its flags and its run (tools/command.h).
class SynthCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("synth", "Generate realistic synthetic robot episodes");
    c->add_option("--out", o_.out, "Output dataset directory (must not exist or be empty)")->required();
    c->add_option("--episodes", o_.episodes, "Number of episodes")->capture_default_str();
    c->add_option("--cameras", o_.cameras, "Cameras per episode")->capture_default_str();
    c->add_option("--size", size_, "Frame size WxH")->capture_default_str();
    c->add_option("--fps", o_.fps, "Camera frame rate")->capture_default_str();
    c->add_option("--gop", o_.gop, "Keyframe interval in frames")->capture_default_str();
    c->add_option("--video-codec", o_.video_codec, "h264, hevc, av1 or vp9")->capture_default_str();
    c->add_option("--audio-codec", o_.audio_codec, "aac, opus, flac or none")->capture_default_str();
    c->add_option("--audio-rate", o_.audio_rate, "Audio sample rate (Hz)")->capture_default_str();
    c->add_option("--state-dim", o_.state_dim, "Proprioceptive state dimensions")->capture_default_str();
    c->add_option("--action-dim", o_.action_dim, "Action dimensions")->capture_default_str();
    c->add_option("--lowdim-rate", o_.lowdim_rate, "State/action rate (Hz)")->capture_default_str();
    c->add_option("--episode-seconds", seconds_, "Episode length: S or MIN:MAX seconds")->capture_default_str();
    c->add_option("--episodes-per-shard", o_.episodes_per_shard, "Episodes per shard file")->capture_default_str();
    c->add_option("--seed", o_.seed, "Random seed (same seed, same dataset, bit for bit)")->capture_default_str();
    c->add_option("--threads", o_.threads, "Encoding threads (0: one per core)")->capture_default_str();
    c->add_flag("--quiet", quiet_, "No progress output");
    c->add_option("--preset", preset_,
                  "robot (the defaults above) or video-model: 720p clips for video world models, "
                  "1 camera 1280x720 at 24 fps (GOP 24), 2 to 5 s, no audio, a caption of one to "
                  "four sentences per clip; flags given explicitly win")
        ->capture_default_str()
        ->check(CLI::IsMember({"robot", "video-model"}));
    app_ = c;
    return c;
  }
  absl::Status Run() override {
    if (preset_ == "video-model") ApplyVideoModelPreset();
    if (!ParseSize(size_, &o_.width, &o_.height)) {
      return absl::InvalidArgumentError(StrCat("--size '", size_, "' is not WxH (e.g. 224x224)"));
    }
    if (!ParseRange(seconds_, &o_.min_seconds, &o_.max_seconds)) {
      return absl::InvalidArgumentError(StrCat("--episode-seconds '", seconds_, "' is not S or MIN:MAX"));
    }
    o_.progress = !quiet_;
    return RunSynth(o_);
  }

 private:
  // The video-model preset's values for every flag the command line did not give.
  void ApplyVideoModelPreset() {
    auto unset = [this](const char* flag) { return app_->get_option(flag)->count() == 0; };
    if (unset("--cameras")) o_.cameras = 1;
    if (unset("--size")) size_ = "1280x720";
    if (unset("--fps")) o_.fps = 24;
    if (unset("--gop")) o_.gop = 24;
    if (unset("--audio-codec")) o_.audio_codec = "none";
    if (unset("--episode-seconds")) seconds_ = "2:5";
    o_.captions = true;
  }

  SynthOptions o_;
  std::string size_ = "224x224";
  std::string seconds_ = "10:30";
  std::string preset_ = "robot";
  bool quiet_ = false;
  CLI::App* app_ = nullptr;
};

std::unique_ptr<Command> NewSynthCommand() {
  return std::make_unique<SynthCommand>();
}

}  // namespace conveyor::tools
