// `conveyor synth`: realistic synthetic robot episodes, really encoded through libavcodec.
//
// Episodes are generated in parallel (one encoder per camera, single-threaded, so output is
// deterministic) and handed to the DatasetWriter in episode order, with at most 2 x threads
// episodes in memory.
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

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
#include "decoders/internal/av_util.h"
#include "readers/dataset_writer.h"
#include "decoders/internal/av_codec_params.h"
#include "tools/command.h"
#include "tools/commands.h"
#include "tools/synth_signals.h"

extern "C" {
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
}

namespace conveyor::tools {
namespace {

namespace pb = format::v1;
using av::CodecParamsFromAv;
using av::CodecParamsToAv;
using av::SetStreamRotation;
using av::StreamRotationDeg;

// The libavcodec encoder used for each --video-codec, best first.
std::vector<std::string> VideoEncoderNames(const std::string& codec) {
  if (codec == "h264") return {"libx264"};
  if (codec == "hevc") return {"libx265"};
  if (codec == "av1") return {"libsvtav1", "libaom-av1"};
  if (codec == "vp9") return {"libvpx-vp9"};
  return {};
}

std::vector<std::string> AudioEncoderNames(const std::string& codec) {
  if (codec == "aac") return {"aac"};
  if (codec == "opus") return {"libopus", "opus"};
  if (codec == "flac") return {"flac"};
  return {};
}

absl::StatusOr<const AVCodec*> FindEncoder(const std::vector<std::string>& names,
                                           const std::string& what) {
  for (const std::string& n : names) {
    if (const AVCodec* c = avcodec_find_encoder_by_name(n.c_str())) return c;
  }
  if (names.empty()) return absl::InvalidArgumentError(StrCat("unknown ", what));
  return absl::FailedPreconditionError(
      StrCat(what, ": this FFmpeg build has no encoder for it (looked for ", names[0], ")"));
}

// Collects an encoder's packets into EpisodeData::Packet.
absl::Status Drain(AVCodecContext* ctx, AVPacket* pkt, std::vector<EpisodeData::Packet>* out,
                   const std::string& where) {
  while (true) {
    int r = avcodec_receive_packet(ctx, pkt);
    if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return absl::OkStatus();
    if (r < 0) return av::AvError(r, where);
    EpisodeData::Packet p;
    p.pts = pkt->pts;
    p.dts = pkt->dts;
    p.duration = pkt->duration;
    p.key = (pkt->flags & AV_PKT_FLAG_KEY) != 0;
    p.bytes.assign(reinterpret_cast<const char*>(pkt->data), static_cast<size_t>(pkt->size));
    out->push_back(std::move(p));
    av_packet_unref(pkt);
  }
}

// ":asm=..." naming the x86 instruction sets x264 may use, AVX-512 left out; "" elsewhere.
// Found with `synth` run repeatedly on one input: with AVX-512 (x264 r3095, Debian 12, AMD Zen 4)
// about one run in two changed a B-frame's bits; with AVX2 and below, or no asm, every run gave
// the same bytes. valgrind (which has no AVX-512) saw nothing.
std::string X264InstructionSets() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  std::string sets = "MMX2,SSE,SSE2,CMOV";
  struct Set {
    bool present;
    const char* name;
  };
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool lzcnt = __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 5));
  const Set optional[] = {{__builtin_cpu_supports("sse3") != 0, "SSE3"},
                          {__builtin_cpu_supports("ssse3") != 0, "SSSE3"},
                          {__builtin_cpu_supports("sse4.1") != 0, "SSE4.1"},
                          {__builtin_cpu_supports("sse4.2") != 0, "SSE4.2"},
                          {__builtin_cpu_supports("avx") != 0, "AVX"},
                          {__builtin_cpu_supports("fma") != 0, "FMA3"},
                          {__builtin_cpu_supports("bmi") != 0, "BMI1"},
                          {__builtin_cpu_supports("bmi2") != 0, "BMI2"},
                          {__builtin_cpu_supports("avx2") != 0, "AVX2"},
                          {lzcnt, "LZCNT"}};
  for (const Set& s : optional) {
    if (s.present) StrAppend(&sets, ",", s.name);
  }
  return ":asm=" + sets;
#else
  return "";
#endif
}

class VideoEncoder {
 public:
  absl::Status Open(const SynthOptions& o, const std::string& where) {
    where_ = where;
    ASSIGN_OR_RETURN(const AVCodec* codec,
                     FindEncoder(VideoEncoderNames(o.video_codec), "video codec '" + o.video_codec + "'"));
    ctx_.reset(avcodec_alloc_context3(codec));
    AVCodecContext* c = ctx_.get();
    c->width = o.width;
    c->height = o.height;
    c->pix_fmt = AV_PIX_FMT_YUV420P;
    c->time_base = av_inv_q(av_d2q(o.fps, 1 << 20));
    c->framerate = av_d2q(o.fps, 1 << 20);
    c->gop_size = o.gop;
    c->max_b_frames = o.video_codec == "h264" || o.video_codec == "hevc" ? 2 : 0;
    c->thread_count = 1;  // deterministic output; parallelism comes from episodes
    c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    AVDictionary* opts = nullptr;
    const std::string name = codec->name;
    if (name == "libx264") {
      av_dict_set(&opts, "preset", "veryfast", 0);
      av_dict_set(&opts, "crf", "23", 0);
      // No scene-cut keyframes: keyframes exactly every GOP. The instruction sets are capped at
      // AVX2 (X264InstructionSets) because x264's AVX-512 kernels gave different bytes from run
      // to run on Zen 4.
      av_dict_set(&opts, "x264-params", StrCat("scenecut=0", X264InstructionSets()).c_str(), 0);  // keyframes exactly every GOP
    } else if (name == "libx265") {
      av_dict_set(&opts, "preset", "ultrafast", 0);
      av_dict_set(&opts, "x265-params", "scenecut=0:log-level=error:pools=none:frame-threads=1", 0);
    } else if (name == "libvpx-vp9") {
      av_dict_set(&opts, "deadline", "realtime", 0);
      av_dict_set(&opts, "cpu-used", "8", 0);
      av_dict_set(&opts, "crf", "32", 0);
      c->bit_rate = 0;
    } else if (name == "libsvtav1") {
      av_dict_set(&opts, "preset", "12", 0);
      av_dict_set(&opts, "svtav1-params", "scd=0", 0);
    } else if (name == "libaom-av1") {
      av_dict_set(&opts, "cpu-used", "8", 0);
      av_dict_set(&opts, "usage", "realtime", 0);
    }
    int r = avcodec_open2(c, codec, &opts);
    av_dict_free(&opts);
    if (r < 0) return av::AvError(r, StrCat(where, ": opening encoder ", name));
    frame_ = av::MakeFrame();
    frame_->format = c->pix_fmt;
    frame_->width = c->width;
    frame_->height = c->height;
    if ((r = av_frame_get_buffer(frame_.get(), 0)) < 0) return av::AvError(r, where);
    sws_.reset(sws_getContext(c->width, c->height, AV_PIX_FMT_RGB24, c->width, c->height,
                              c->pix_fmt, SWS_BILINEAR | SWS_BITEXACT | SWS_ACCURATE_RND, nullptr,
                              nullptr, nullptr));
    if (sws_ == nullptr) return absl::InternalError(StrCat(where, ": sws_getContext failed"));
    pkt_ = av::MakePacket();
    return absl::OkStatus();
  }

  absl::Status Encode(const std::vector<uint8_t>& rgb, int64_t pts) {
    int r = av_frame_make_writable(frame_.get());
    if (r < 0) return av::AvError(r, where_);
    const uint8_t* src[1] = {rgb.data()};
    const int stride[1] = {3 * ctx_->width};
    sws_scale(sws_.get(), src, stride, 0, ctx_->height, frame_->data, frame_->linesize);
    frame_->pts = pts;
    if ((r = avcodec_send_frame(ctx_.get(), frame_.get())) < 0) return av::AvError(r, where_);
    return Drain(ctx_.get(), pkt_.get(), &packets_, where_);
  }

  absl::Status Flush() {
    int r = avcodec_send_frame(ctx_.get(), nullptr);
    if (r < 0) return av::AvError(r, where_);
    return Drain(ctx_.get(), pkt_.get(), &packets_, where_);
  }

  AVCodecContext* ctx() const { return ctx_.get(); }
  std::vector<EpisodeData::Packet>& packets() { return packets_; }

 private:
  std::string where_;
  av::UniqueCodecContext ctx_;
  av::UniqueFrame frame_;
  av::UniqueSws sws_;
  av::UniquePacket pkt_;
  std::vector<EpisodeData::Packet> packets_;
};

// Writes mono float samples into `frame` in the encoder's sample format.
void FillAudio(const float* in, int n, AVSampleFormat fmt, AVFrame* frame) {
  for (int i = 0; i < n; ++i) {
    const float v = in[i];
    switch (fmt) {
      case AV_SAMPLE_FMT_FLT:
      case AV_SAMPLE_FMT_FLTP:
        reinterpret_cast<float*>(frame->data[0])[i] = v;
        break;
      case AV_SAMPLE_FMT_S16:
      case AV_SAMPLE_FMT_S16P:
        reinterpret_cast<int16_t*>(frame->data[0])[i] = static_cast<int16_t>(std::lround(v * 32767.0f));
        break;
      case AV_SAMPLE_FMT_S32:
      case AV_SAMPLE_FMT_S32P:
        reinterpret_cast<int32_t*>(frame->data[0])[i] =
            static_cast<int32_t>(std::lround(static_cast<double>(v) * 2147483000.0));
        break;
      default:
        break;
    }
  }
}

bool SupportedSampleFormat(AVSampleFormat f) {
  return f == AV_SAMPLE_FMT_FLT || f == AV_SAMPLE_FMT_FLTP || f == AV_SAMPLE_FMT_S16 ||
         f == AV_SAMPLE_FMT_S16P || f == AV_SAMPLE_FMT_S32 || f == AV_SAMPLE_FMT_S32P;
}

absl::Status EncodeAudio(const SynthOptions& o, const std::vector<float>& samples,
                         const std::string& where, EpisodeData::Stream* out) {
  ASSIGN_OR_RETURN(const AVCodec* codec,
                   FindEncoder(AudioEncoderNames(o.audio_codec), "audio codec '" + o.audio_codec + "'"));
  av::UniqueCodecContext ctx(avcodec_alloc_context3(codec));
  AVCodecContext* c = ctx.get();
  c->sample_rate = o.audio_rate;
  av_channel_layout_default(&c->ch_layout, 1);
  c->sample_fmt = AV_SAMPLE_FMT_NONE;
  for (const AVSampleFormat* f = codec->sample_fmts; f && *f != AV_SAMPLE_FMT_NONE; ++f) {
    if (SupportedSampleFormat(*f)) {
      c->sample_fmt = *f;
      break;
    }
  }
  if (c->sample_fmt == AV_SAMPLE_FMT_NONE) {
    return absl::FailedPreconditionError(StrCat(where, ": encoder ", codec->name,
                                                " takes no sample format synth can produce"));
  }
  c->time_base = AVRational{1, o.audio_rate};
  c->bit_rate = o.audio_codec == "flac" ? 0 : 32000;
  c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  c->strict_std_compliance = FF_COMPLIANCE_EXPERIMENTAL;
  int r = avcodec_open2(c, codec, nullptr);
  if (r < 0) {
    return av::AvError(r, StrCat(where, ": opening audio encoder ", codec->name, " at ",
                                 o.audio_rate, " Hz (opus takes 8/12/16/24/48 kHz)"));
  }
  const int frame_size = c->frame_size > 0 ? c->frame_size : 1024;
  av::UniqueFrame frame = av::MakeFrame();
  av::UniquePacket pkt = av::MakePacket();
  for (size_t at = 0; at < samples.size(); at += static_cast<size_t>(frame_size)) {
    const int n = static_cast<int>(std::min<size_t>(frame_size, samples.size() - at));
    av_frame_unref(frame.get());
    frame->format = c->sample_fmt;
    frame->nb_samples = n;
    av_channel_layout_copy(&frame->ch_layout, &c->ch_layout);
    if ((r = av_frame_get_buffer(frame.get(), 0)) < 0) return av::AvError(r, where);
    FillAudio(samples.data() + at, n, c->sample_fmt, frame.get());
    frame->pts = static_cast<int64_t>(at);
    if ((r = avcodec_send_frame(c, frame.get())) < 0) return av::AvError(r, where);
    RETURN_IF_ERROR(Drain(c, pkt.get(), &out->packets, where));
  }
  if ((r = avcodec_send_frame(c, nullptr)) < 0) return av::AvError(r, where);
  RETURN_IF_ERROR(Drain(c, pkt.get(), &out->packets, where));

  av::UniqueCodecParameters par(avcodec_parameters_alloc());
  avcodec_parameters_from_context(par.get(), c);
  out->codec = CodecParamsFromAv(*par, 0);
  out->time_base_num = c->time_base.num;
  out->time_base_den = c->time_base.den;
  out->pts_origin = 0;
  out->info.kind = pb::AUDIO;
  out->info.codec = avcodec_get_name(c->codec_id);
  out->info.rate = o.audio_rate;
  out->info.shape = {1};
  out->info.names = {"mono"};
  return absl::OkStatus();
}

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
  for (int cam = 0; cam < o.cameras; ++cam) {
    const std::string name = StrCat("cam", cam);
    const std::string where = StrCat("synth episode ", e, ", stream '", name, "'");
    VideoEncoder enc;
    RETURN_IF_ERROR(enc.Open(o, where));
    means[cam].resize(static_cast<size_t>(plan.num_frames) * 3);
    for (int k = 0; k < plan.num_frames; ++k) {
      RenderFrame(plan, o.seed, e, cam, k, o.fps, o.width, o.height, &rgb, &means[cam][k * 3]);
      RETURN_IF_ERROR(enc.Encode(rgb, k));
    }
    RETURN_IF_ERROR(enc.Flush());
    *frames_encoded += static_cast<uint64_t>(plan.num_frames);
    EpisodeData::Stream s;
    s.info.name = name;
    s.info.kind = pb::VIDEO;
    s.info.codec = avcodec_get_name(enc.ctx()->codec_id);
    s.info.rate = o.fps;
    s.info.shape = {o.height, o.width, 3};
    s.info.pix_fmt = av_get_pix_fmt_name(enc.ctx()->pix_fmt);
    av::UniqueCodecParameters par(avcodec_parameters_alloc());
    avcodec_parameters_from_context(par.get(), enc.ctx());
    s.codec = CodecParamsFromAv(*par, 0);
    s.time_base_num = enc.ctx()->time_base.num;
    s.time_base_den = enc.ctx()->time_base.den;
    s.pts_origin = 0;
    s.packets = std::move(enc.packets());
    ep.streams.push_back(std::move(s));
  }

  // Audio.
  if (o.audio_codec != "none") {
    EpisodeData::Stream s;
    s.info.name = "audio";
    std::vector<float> samples;
    RenderAudio(plan, o.seed, e, o.audio_rate, &samples);
    RETURN_IF_ERROR(EncodeAudio(o, samples, StrCat("synth episode ", e, ", stream 'audio'"), &s));
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
  text.text = plan.instruction;
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
  if (VideoEncoderNames(o.video_codec).empty()) {
    return bad(StrCat("--video-codec '", o.video_codec, "' is not one of h264, hevc, av1, vp9"));
  }
  if (o.audio_codec != "none" && AudioEncoderNames(o.audio_codec).empty()) {
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
  av::QuietLogging();
  // Fail fast on a codec this FFmpeg cannot encode, before any work.
  RETURN_IF_ERROR(FindEncoder(VideoEncoderNames(options.video_codec),
                              "video codec '" + options.video_codec + "'").status());
  if (options.audio_codec != "none") {
    RETURN_IF_ERROR(FindEncoder(AudioEncoderNames(options.audio_codec),
                                "audio codec '" + options.audio_codec + "'").status());
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
  absl::Mutex mu;
  std::map<int, absl::StatusOr<EpisodeData>> done;  // finished, not yet written
  int next_to_start = 0;
  int next_to_write = 0;
  bool cancelled = false;
  std::atomic<uint64_t> frames{0};

  auto worker = [&] {
    while (true) {
      int e;
      {
        absl::MutexLock lock(&mu);
        auto may_start = [&] { return cancelled || next_to_start - next_to_write < max_in_flight; };
        mu.Await(absl::Condition(&may_start));
        if (cancelled || next_to_start >= options.episodes) return;
        e = next_to_start++;
      }
      uint64_t f = 0;
      absl::StatusOr<EpisodeData> ep = MakeEpisode(options, e, &f);
      frames += f;
      absl::MutexLock lock(&mu);
      done.emplace(e, std::move(ep));
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);

  const auto start = std::chrono::steady_clock::now();
  const bool tty = isatty(STDERR_FILENO);
  absl::Status status;
  for (int e = 0; e < options.episodes && status.ok(); ++e) {
    absl::StatusOr<EpisodeData> ep;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&] { return done.count(e) > 0; };
      mu.Await(absl::Condition(&ready));
      ep = std::move(done.at(e));
      done.erase(e);
    }
    status = ep.ok() ? writer->AddEpisode(*ep) : ep.status();
    {
      absl::MutexLock lock(&mu);
      next_to_write = e + 1;
      if (!status.ok()) cancelled = true;
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
  for (std::thread& t : pool) t.join();
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
    return c;
  }
  absl::Status Run() override {
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
  SynthOptions o_;
  std::string size_ = "224x224";
  std::string seconds_ = "10:30";
  bool quiet_ = false;
};

std::unique_ptr<Command> NewSynthCommand() {
  return std::make_unique<SynthCommand>();
}

}  // namespace conveyor::tools
