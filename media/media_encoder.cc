#include "media/media_encoder.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cmath>

extern "C" {
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
}

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/internal/av_codec_params.h"
#include "media/internal/av_util.h"

namespace conveyor {
namespace {

namespace pb = format::v1;

// The libavcodec encoder used for each video codec, best first.
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

absl::StatusOr<const AVCodec*> FindVideoEncoder(const std::string& codec) {
  return FindEncoder(VideoEncoderNames(codec), "video codec '" + codec + "'");
}

absl::StatusOr<const AVCodec*> FindAudioEncoder(const std::string& codec) {
  return FindEncoder(AudioEncoderNames(codec), "audio codec '" + codec + "'");
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

// The codec parameters an open encoder reports, as the shard format stores them.
pb::CodecParams EncoderCodecParams(const AVCodecContext* ctx) {
  av::UniqueCodecParameters par(avcodec_parameters_alloc());
  avcodec_parameters_from_context(par.get(), ctx);
  return av::CodecParamsFromAv(*par, 0);
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

}  // namespace

bool IsKnownVideoCodec(const std::string& codec) { return !VideoEncoderNames(codec).empty(); }
bool IsKnownAudioCodec(const std::string& codec) { return !AudioEncoderNames(codec).empty(); }

absl::Status CheckVideoEncoderAvailable(const std::string& codec) {
  av::QuietLogging();
  return FindVideoEncoder(codec).status();
}

absl::Status CheckAudioEncoderAvailable(const std::string& codec) {
  av::QuietLogging();
  return FindAudioEncoder(codec).status();
}

struct VideoEncoder::Impl {
  std::string where;
  double fps = 0;
  av::UniqueCodecContext ctx;
  av::UniqueFrame frame;
  av::UniqueSws sws;
  av::UniquePacket pkt;
  std::vector<EpisodeData::Packet> packets;
};

VideoEncoder::VideoEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VideoEncoder::~VideoEncoder() = default;

absl::StatusOr<std::unique_ptr<VideoEncoder>> VideoEncoder::Open(const VideoEncoderOptions& o,
                                                                 const std::string& where) {
  av::QuietLogging();
  auto impl = std::make_unique<Impl>();
  impl->where = where;
  impl->fps = o.fps;
  ASSIGN_OR_RETURN(const AVCodec* codec, FindVideoEncoder(o.codec));
  impl->ctx.reset(avcodec_alloc_context3(codec));
  AVCodecContext* c = impl->ctx.get();
  c->width = o.width;
  c->height = o.height;
  c->pix_fmt = AV_PIX_FMT_YUV420P;
  c->time_base = av_inv_q(av_d2q(o.fps, 1 << 20));
  c->framerate = av_d2q(o.fps, 1 << 20);
  c->gop_size = o.gop;
  c->max_b_frames = o.codec == "h264" || o.codec == "hevc" ? 2 : 0;
  c->thread_count = 1;  // deterministic output; parallelism comes from running encoders side by side
  c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  AVDictionary* opts = nullptr;
  const std::string name = codec->name;
  if (name == "libx264") {
    av_dict_set(&opts, "preset", "veryfast", 0);
    av_dict_set(&opts, "crf", "23", 0);
    // No scene-cut keyframes: keyframes exactly every GOP. The instruction sets are capped at
    // AVX2 (X264InstructionSets) because x264's AVX-512 kernels gave different bytes from run
    // to run on Zen 4.
    av_dict_set(&opts, "x264-params", StrCat("scenecut=0", X264InstructionSets()).c_str(), 0);
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
  impl->frame = av::MakeFrame();
  AVFrame* frame = impl->frame.get();
  frame->format = c->pix_fmt;
  frame->width = c->width;
  frame->height = c->height;
  if ((r = av_frame_get_buffer(frame, 0)) < 0) return av::AvError(r, where);
  // Bit-exact, accurately rounded conversion: the same RGB gives the same YUV on every CPU.
  impl->sws.reset(sws_getContext(c->width, c->height, AV_PIX_FMT_RGB24, c->width, c->height,
                                 c->pix_fmt, SWS_BILINEAR | SWS_BITEXACT | SWS_ACCURATE_RND,
                                 nullptr, nullptr, nullptr));
  if (impl->sws == nullptr) return absl::InternalError(StrCat(where, ": sws_getContext failed"));
  impl->pkt = av::MakePacket();
  return std::unique_ptr<VideoEncoder>(new VideoEncoder(std::move(impl)));
}

absl::Status VideoEncoder::Encode(std::span<const uint8_t> rgb, int64_t pts) {
  Impl& m = *impl_;
  const size_t frame_bytes = static_cast<size_t>(m.ctx->width) * m.ctx->height * 3;
  if (rgb.size() < frame_bytes + kVideoEncoderInputPadding) {
    return absl::InvalidArgumentError(StrCat(m.where, ": frame ", pts, " has ", rgb.size(),
                                             " bytes, expected ", frame_bytes, " + ",
                                             kVideoEncoderInputPadding, " padding"));
  }
  int r = av_frame_make_writable(m.frame.get());
  if (r < 0) return av::AvError(r, m.where);
  const uint8_t* src[1] = {rgb.data()};
  const int stride[1] = {3 * m.ctx->width};
  sws_scale(m.sws.get(), src, stride, 0, m.ctx->height, m.frame->data, m.frame->linesize);
  m.frame->pts = pts;
  if ((r = avcodec_send_frame(m.ctx.get(), m.frame.get())) < 0) return av::AvError(r, m.where);
  return Drain(m.ctx.get(), m.pkt.get(), &m.packets, m.where);
}

absl::StatusOr<EpisodeData::Stream> VideoEncoder::Finish() {
  Impl& m = *impl_;
  int r = avcodec_send_frame(m.ctx.get(), nullptr);
  if (r < 0) return av::AvError(r, m.where);
  RETURN_IF_ERROR(Drain(m.ctx.get(), m.pkt.get(), &m.packets, m.where));
  const AVCodecContext* c = m.ctx.get();
  EpisodeData::Stream s;
  s.info.kind = pb::VIDEO;
  s.info.codec = avcodec_get_name(c->codec_id);
  s.info.rate = m.fps;
  s.info.shape = {c->height, c->width, 3};
  s.info.pix_fmt = av_get_pix_fmt_name(c->pix_fmt);
  s.codec = EncoderCodecParams(c);
  s.time_base_num = c->time_base.num;
  s.time_base_den = c->time_base.den;
  s.pts_origin = 0;
  s.packets = std::move(m.packets);
  return s;
}

absl::StatusOr<EpisodeData::Stream> EncodeMonoAudio(const AudioEncoderOptions& o,
                                                    const std::vector<float>& samples,
                                                    const std::string& where) {
  av::QuietLogging();
  ASSIGN_OR_RETURN(const AVCodec* codec, FindAudioEncoder(o.codec));
  av::UniqueCodecContext ctx(avcodec_alloc_context3(codec));
  AVCodecContext* c = ctx.get();
  c->sample_rate = o.sample_rate;
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
  c->time_base = AVRational{1, o.sample_rate};
  c->bit_rate = o.codec == "flac" ? 0 : 32000;
  c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  c->strict_std_compliance = FF_COMPLIANCE_EXPERIMENTAL;
  int r = avcodec_open2(c, codec, nullptr);
  if (r < 0) {
    return av::AvError(r, StrCat(where, ": opening audio encoder ", codec->name, " at ",
                                 o.sample_rate, " Hz (opus takes 8/12/16/24/48 kHz)"));
  }
  EpisodeData::Stream out;
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
    RETURN_IF_ERROR(Drain(c, pkt.get(), &out.packets, where));
  }
  if ((r = avcodec_send_frame(c, nullptr)) < 0) return av::AvError(r, where);
  RETURN_IF_ERROR(Drain(c, pkt.get(), &out.packets, where));

  out.codec = EncoderCodecParams(c);
  out.time_base_num = c->time_base.num;
  out.time_base_den = c->time_base.den;
  out.pts_origin = 0;
  out.info.kind = pb::AUDIO;
  out.info.codec = avcodec_get_name(c->codec_id);
  out.info.rate = o.sample_rate;
  out.info.shape = {1};
  out.info.names = {"mono"};
  return out;
}

}  // namespace conveyor
