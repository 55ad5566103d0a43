#include "media/audio_decoder.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string_view>

// Header-only XXH3 (the fuzz target links no xxhash library).
#define XXH_INLINE_ALL
#include <xxhash.h>

extern "C" {
#include <libavutil/channel_layout.h>
#include <libavutil/samplefmt.h>
}

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/internal/av_codec_params.h"
#include "media/internal/av_util.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

constexpr int kMaxRate = 768000;
constexpr int kMaxChannels = 64;
constexpr int kMaxDownsampling = 256;  // stream rate / out_rate
// |start_s| beyond this (~115 days) is a caller bug; the bound also keeps the sample arithmetic
// far from overflow.
constexpr double kMaxAbsStartS = 1e7;
// Packets read past the window's end waiting for a decoder with delay to produce its samples.
constexpr int kMaxPostrollPackets = 4;
// AudioMethod::kChunks: a chunk is kChunkSeconds of samples at the stream's rate, or fewer so that
// it holds at most kMaxChunkBytes of float samples; a decoder keeps at most kMaxCacheBytes of
// chunks. The chunk length decides the bits of AAC with PNS: changing it is a new AudioMethod.
constexpr int64_t kChunkSeconds = 4;
constexpr int64_t kMaxChunkBytes = int64_t{4} << 20;
constexpr size_t kMaxCacheBytes = size_t{16} << 20;

using i128 = __int128;

i128 FloorDiv(i128 a, i128 b) {  // b > 0
  i128 q = a / b;
  if (a % b != 0 && a < 0) --q;
  return q;
}
i128 CeilDiv(i128 a, i128 b) { return -FloorDiv(-a, b); }
int64_t Clamp64(i128 v) {
  constexpr int64_t kBound = int64_t{1} << 62;  // far from overflow in later sums
  return static_cast<int64_t>(std::clamp<i128>(v, -kBound, kBound));
}

// Maps stream pts to input sample numbers k on the episode clock: sample k is at k / rate s.
struct SampleClock {
  int64_t origin;
  int64_t tb_num;
  int64_t tb_den;
  int64_t rate;

  // The sample at `pts` (+ `duration`), rounded to the nearest one.
  int64_t SampleAt(int64_t pts, int64_t duration = 0) const {
    const i128 num = (static_cast<i128>(pts) + duration - origin) * tb_num * rate;
    return Clamp64(FloorDiv(2 * num + tb_den, 2 * static_cast<i128>(tb_den)));
  }
  // The last pts at or before sample k.
  int64_t PtsAtOrBefore(int64_t k) const {
    return Clamp64(origin +
                   FloorDiv(static_cast<i128>(k) * tb_den, static_cast<i128>(tb_num) * rate));
  }
  double Seconds(int64_t pts) const {
    return static_cast<double>(static_cast<i128>(pts) - origin) * static_cast<double>(tb_num) /
           static_cast<double>(tb_den);
  }
};

// How far before the window decoding starts, so that the decoder's state (overlap, bit
// reservoir, predictors) is what it would be after decoding the stream from its start: at least
// `packets` packets and `samples` samples (at the stream rate) before the packet that holds the
// window's first sample.
}  // namespace

namespace audio_internal {
struct Preroll {
  int packets;
  int64_t samples;
};
}  // namespace audio_internal
using audio_internal::Preroll;

namespace {

Preroll PrerollFor(const pb::CodecParams& par) {
  const std::string& c = par.codec();
  // Every packet decodes on its own.
  if (c.starts_with("pcm_") || c == "flac" || c == "alac" || c == "wavpack" || c == "tta") {
    return {0, 0};
  }
  // MDCT overlap with the previous frame (SBR adds a little QMF history).
  if (c == "aac" || c == "aac_latm") return {2, 0};
  // The bit reservoir reaches up to 511 bytes back (5 frames at 32 kbit/s), plus the overlap of
  // the hybrid filterbank.
  if (c == "mp1" || c == "mp2" || c == "mp3") return {10, 0};
  // RFC 7845 asks for 80 ms (3840 samples; the container's seek_preroll), which only brings the
  // output close: CELT predicts band energies from the previous frame, and the error of a cold
  // start shrinks about tenfold per 100 ms (measured: 0.05 after 80 ms, 1e-6 after 400 ms,
  // bit-exact from 600 ms). Ten times the RFC's figure makes windows bit-exact with a margin, at
  // the cost of decoding 0.8 s more per window.
  if (c == "opus") return {2, 10 * std::max<int64_t>(par.seek_preroll(), 3840)};
  return {4, par.seek_preroll()};
}

// Whether avcodec_flush_buffers returns the decoder to the state avcodec_open2 leaves it in, so
// that one open context can serve every window and still give each window the same bits. Other
// decoders are opened afresh for each window, which costs little (measured per open: AAC 65 us,
// Opus 29 us, against ~1 ms to decode a 1 s window): AAC's noise generator for perceptual noise
// substitution (PNS) and its memory of the previous window shape survive a flush, and the fuzz
// target found an Opus stream and an MP3 stream (tests/fuzz/regressions/audio_mp3_flush) whose
// output after a flush depended on the window decoded before. Only PCM, which keeps no state
// between packets, is trusted; FLAC and the MPEG audio layers are opened afresh too.
bool FlushRestoresOpenState(const std::string& c) { return c.starts_with("pcm_"); }

// Input samples per chunk (AudioMethod::kChunks): a function of the stream's rate and channels.
int64_t ChunkSamples(int rate, int channels) {
  const int64_t by_bytes = kMaxChunkBytes / (static_cast<int64_t>(sizeof(float)) * channels);
  return std::max<int64_t>(1, std::min<int64_t>(kChunkSeconds * rate, by_bytes));
}

// A packet the decoder rejected while decoding a chunk: its samples [lo, hi) and the error, which
// a window overlapping them returns (as the per-window method returns it for such a window).
}  // namespace

namespace audio_internal {
struct BadRange {
  int64_t lo;
  int64_t hi;
  absl::Status status;
};
}  // namespace audio_internal
using audio_internal::BadRange;

namespace {

// The channel layout the stream declares: its native mask when it has a consistent one, else
// FFmpeg's default for the count (what FFmpeg's decoders assume for such streams).
absl::Status StreamLayout(const pb::CodecParams& par, AVChannelLayout* out) {
  av_channel_layout_uninit(out);
  if (par.channel_mask() != 0 && std::popcount(par.channel_mask()) == par.channels()) {
    const int ret = av_channel_layout_from_mask(out, par.channel_mask());
    if (ret < 0) return av::AvError(ret, "setting the channel layout");
  } else {
    av_channel_layout_default(out, par.channels());
  }
  return absl::OkStatus();
}

struct ChannelLayoutOwner {
  AVChannelLayout layout{};
  ~ChannelLayoutOwner() { av_channel_layout_uninit(&layout); }
};

// Writes samples [first, first + count) of `frame` as interleaved floats to `dst`, converting
// as libswresample does (so that the values equal `ffmpeg -f f32le`'s bit for bit).
template <typename T, typename Conv>
void CopyAsFloat(const AVFrame& frame, bool planar, int channels, int64_t first, int64_t count,
                 float* dst, Conv conv) {
  for (int c = 0; c < channels; ++c) {
    const T* src = planar
                       ? reinterpret_cast<const T*>(frame.extended_data[c]) + first
                       : reinterpret_cast<const T*>(frame.extended_data[0]) + first * channels + c;
    const int64_t stride = planar ? 1 : channels;
    for (int64_t i = 0; i < count; ++i) dst[i * channels + c] = conv(src[i * stride]);
  }
}

bool CopyFrameAsFloat(const AVFrame& frame, int channels, int64_t first, int64_t count,
                      float* dst) {
  const auto fmt = static_cast<AVSampleFormat>(frame.format);
  const bool planar = av_sample_fmt_is_planar(fmt) != 0;
  switch (av_get_packed_sample_fmt(fmt)) {
    case AV_SAMPLE_FMT_U8:
      CopyAsFloat<uint8_t>(frame, planar, channels, first, count, dst, [](uint8_t v) {
        return (static_cast<int>(v) - 0x80) * (1.0f / (1 << 7));
      });
      return true;
    case AV_SAMPLE_FMT_S16:
      CopyAsFloat<int16_t>(frame, planar, channels, first, count, dst,
                           [](int16_t v) { return v * (1.0f / (1 << 15)); });
      return true;
    case AV_SAMPLE_FMT_S32:
      CopyAsFloat<int32_t>(frame, planar, channels, first, count, dst,
                           [](int32_t v) { return v * (1.0f / (1U << 31)); });
      return true;
    case AV_SAMPLE_FMT_S64:
      CopyAsFloat<int64_t>(frame, planar, channels, first, count, dst,
                           [](int64_t v) { return v * (1.0f / (UINT64_C(1) << 63)); });
      return true;
    case AV_SAMPLE_FMT_FLT:
      CopyAsFloat<float>(frame, planar, channels, first, count, dst, [](float v) { return v; });
      return true;
    case AV_SAMPLE_FMT_DBL:
      CopyAsFloat<double>(frame, planar, channels, first, count, dst,
                          [](double v) { return static_cast<float>(v); });
      return true;
    default:
      return false;
  }
}

std::string PacketWhere(const pb::StreamIndex& stream, const SampleClock& clock, size_t p) {
  const int64_t pts = stream.packets().pts(static_cast<int>(p));
  return StrCat("packet ", p, " (pts ", pts, ", t=", clock.Seconds(pts), " s)");
}

// One window's arithmetic, fixed before anything is decoded.
}  // namespace

namespace audio_internal {
struct WindowPlan {
  int64_t num_samples = 0;
  int out_rate = 0;
  int rate = 0;      // the stream's
  int channels = 0;  // the stream's
  int out_ch = 0;
  int64_t out_floats = 0;  // num_samples * out_ch
  SampleClock clock{};
  // Output sample j is at grid point x0 + j of the output clock (x / out_rate seconds).
  int64_t x0 = 0;
  bool passthrough = false;
  // The input samples [s_lo, s_hi) the window needs; the resampler's output sample m is at output
  // grid point o0 + m, and output sample j is resampler sample d + j.
  int64_t s_lo = 0, s_hi = 0, d = 0;
  // The stream covers samples [0, k_end); the window decodes [dec_lo, dec_hi) of them.
  int64_t k_end = 0, dec_lo = 0, dec_hi = 0;
};
}  // namespace audio_internal
using audio_internal::WindowPlan;

namespace {

// The request's own arguments, checked before the stream is looked at.
absl::Status CheckRequest(double start_s, int64_t num_samples, int out_rate, int out_channels,
                          const DecodeLimits& limits, const std::vector<float>* out,
                          const std::vector<uint8_t>* is_pad) {
  if (out == nullptr || is_pad == nullptr) {
    return absl::InvalidArgumentError("audio window: null output");
  }
  if (!std::isfinite(start_s) || std::abs(start_s) > kMaxAbsStartS) {
    return absl::InvalidArgumentError(StrCat("audio window start ", start_s, " s is not finite or ",
                                             "beyond +-", kMaxAbsStartS, " s"));
  }
  if (num_samples < 0) {
    return absl::InvalidArgumentError(StrCat("audio window of ", num_samples, " samples"));
  }
  if (out_rate <= 0 || out_rate > kMaxRate) {
    return absl::InvalidArgumentError(
        StrCat("audio output rate ", out_rate, " Hz is outside [1, ", kMaxRate, "]"));
  }
  if (out_channels < 0 || out_channels > kMaxChannels) {
    return absl::InvalidArgumentError(
        StrCat("audio output channels ", out_channels, " is outside [0, ", kMaxChannels, "]"));
  }
  if (num_samples > limits.max_audio_samples) {
    return absl::ResourceExhaustedError(StrCat("audio window of ", num_samples,
                                               " samples exceeds the limit of ",
                                               limits.max_audio_samples, " (max_audio_samples)"));
  }
  return absl::OkStatus();
}

// The stream's parameters and packet table, and the output size they give: fills `w`'s rates,
// channels, output size and clock.
absl::Status CheckStream(const pb::StreamIndex& stream, int64_t num_samples, int out_rate,
                         int out_channels, const DecodeLimits& limits, WindowPlan* w) {
  const pb::CodecParams& par = stream.codec();
  const std::string& codec_name = par.codec();
  if (stream.kind() != pb::AUDIO) {
    return absl::InvalidArgumentError(
        StrCat("stream of kind ", pb::StreamKind_Name(stream.kind()), " is not audio"));
  }
  const int rate = par.sample_rate();
  const int channels = par.channels();
  if (rate <= 0 || rate > kMaxRate || channels <= 0 || channels > kMaxChannels) {
    return absl::InvalidArgumentError(StrCat(codec_name, " stream: sample rate ", rate, " Hz and ",
                                             channels, " channels are not usable"));
  }
  if (stream.time_base_num() <= 0 || stream.time_base_den() <= 0) {
    return absl::InvalidArgumentError(StrCat(codec_name, " stream: time base ",
                                             stream.time_base_num(), "/", stream.time_base_den()));
  }
  if (static_cast<int64_t>(out_rate) * kMaxDownsampling < rate) {
    return absl::InvalidArgumentError(StrCat("audio output rate ", out_rate, " Hz is more than ",
                                             kMaxDownsampling, "x below the stream's ", rate,
                                             " Hz"));
  }
  const pb::PacketTable& table = stream.packets();
  if (table.duration_size() != table.pts_size() ||
      (table.flags_size() != 0 && table.flags_size() != table.pts_size())) {
    return absl::InvalidArgumentError(
        StrCat(codec_name, " stream: packet table columns differ in length (pts ", table.pts_size(),
               ", duration ", table.duration_size(), ", flags ", table.flags_size(), ")"));
  }
  const int out_ch = out_channels == 0 ? channels : out_channels;
  const int64_t out_floats = num_samples * out_ch;
  if (out_floats * static_cast<int64_t>(sizeof(float)) > limits.max_sample_bytes) {
    return absl::ResourceExhaustedError(StrCat("audio window of ", num_samples, " x ", out_ch,
                                               " float samples exceeds ", limits.max_sample_bytes,
                                               " bytes (max_sample_bytes)"));
  }
  w->num_samples = num_samples;
  w->out_rate = out_rate;
  w->rate = rate;
  w->channels = channels;
  w->out_ch = out_ch;
  w->out_floats = out_floats;
  w->clock = SampleClock{stream.pts_origin(), stream.time_base_num(), stream.time_base_den(), rate};
  return absl::OkStatus();
}

// Fills `w`'s x0 and the input samples [s_lo, s_hi) the window needs (see WindowPlan).
absl::Status PlanInputSamples(double start_s, const DecodeLimits& limits, WindowPlan* w) {
  const int rate = w->rate, out_rate = w->out_rate;
  const int64_t num_samples = w->num_samples;
  const int64_t x0 = std::llround(start_s * out_rate);
  w->x0 = x0;
  w->passthrough = out_rate == rate && w->out_ch == w->channels;
  w->s_lo = x0;
  w->s_hi = x0 + num_samples;
  w->d = 0;
  if (w->passthrough) return absl::OkStatus();
  const int64_t g = std::gcd(rate, out_rate);
  const int64_t l_in = rate / g, l_out = out_rate / g;
  // Beyond the resampler's filter (32 taps at the lower of the two rates) on both sides.
  const int64_t margin = 64 + 64 * CeilDiv(rate, out_rate);
  if (CeilDiv(static_cast<i128>(num_samples) * l_in, l_out) > limits.max_audio_samples) {
    return absl::ResourceExhaustedError(
        StrCat("audio window of ", num_samples, " samples at ", out_rate, " Hz needs more than ",
               limits.max_audio_samples, " input samples at ", rate, " Hz (max_audio_samples)"));
  }
  // Starting the resampler on a multiple of l_in input samples puts its output on the output
  // grid exactly: input sample n*l_in and output grid point n*l_out are the same instant.
  const int64_t n0 =
      static_cast<int64_t>(FloorDiv(FloorDiv(static_cast<i128>(x0) * l_in, l_out) - margin, l_in));
  const int64_t s_lo = n0 * l_in;
  const int64_t d = x0 - n0 * l_out;
  const int64_t s_hi =
      static_cast<int64_t>(CeilDiv(static_cast<i128>(x0 + num_samples) * l_in, l_out)) + margin;
  if ((s_hi - s_lo) * w->channels * static_cast<int64_t>(sizeof(float)) > limits.max_sample_bytes ||
      s_hi - s_lo > std::numeric_limits<int>::max() ||
      d + num_samples > std::numeric_limits<int>::max()) {
    return absl::ResourceExhaustedError(
        StrCat("audio window needs ", s_hi - s_lo, " x ", w->channels, " input samples, more than ",
               limits.max_sample_bytes, " bytes (max_sample_bytes)"));
  }
  w->s_lo = s_lo;
  w->s_hi = s_hi;
  w->d = d;
  return absl::OkStatus();
}

// Clears the pad flag of the output samples the stream covers and fills `w`'s k_end and decode
// range; false when no output sample is real (nothing to decode). REQUIRES: the stream has
// packets.
bool MarkRealSamples(const pb::PacketTable& table, WindowPlan* w, std::vector<uint8_t>* is_pad) {
  // The stream covers samples [0, k_end): from t = 0 to the end of its last packet.
  const int last = table.pts_size() - 1;
  const int64_t k_end =
      w->clock.SampleAt(table.pts(last), std::max<int64_t>(table.duration(last), 0));
  // Output sample j (at x = x0 + j) is real for 0 <= x < x_end: x_end = k_end at the stream's
  // rate, else the first x with x * rate >= k_end * out_rate. The real samples are one run, so
  // the flags are a prefix and a suffix (two memsets, not a per-sample loop).
  i128 x_end = k_end;
  if (!w->passthrough) {
    const i128 num = static_cast<i128>(k_end) * w->out_rate;
    x_end = num <= 0 ? 0 : (num + w->rate - 1) / w->rate;
  }
  const i128 j_lo = std::clamp<i128>(-static_cast<i128>(w->x0), 0, w->num_samples);
  const i128 j_hi = std::clamp<i128>(x_end - static_cast<i128>(w->x0), j_lo, w->num_samples);
  const bool any_real = j_hi > j_lo;
  if (any_real) {
    std::memset(is_pad->data() + static_cast<size_t>(j_lo), 0, static_cast<size_t>(j_hi - j_lo));
  }
  w->k_end = k_end;
  w->dec_lo = std::max<int64_t>(w->s_lo, 0);
  w->dec_hi = std::min(w->s_hi, k_end);
  return any_real;
}

// A fresh decoder for `stream`, configured as every window needs it.
absl::Status OpenDecoder(const pb::StreamIndex& stream, const DecodeLimits& limits,
                         av::UniqueCodecContext* ctx) {
  const pb::CodecParams& par = stream.codec();
  const std::string& codec_name = par.codec();
  av::UniqueCodecParameters avpar(avcodec_parameters_alloc());
  if (avpar == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating codec parameters");
  RETURN_IF_ERROR(Annotate(av::CodecParamsToAv(par, avpar.get()),
                           StrCat("audio stream codec parameters (", codec_name, ")")));
  if (avpar->codec_type != AVMEDIA_TYPE_AUDIO) {
    return absl::InvalidArgumentError(StrCat("codec '", codec_name, "' is not an audio codec"));
  }
  const AVCodec* decoder = avcodec_find_decoder(avpar->codec_id);
  if (decoder == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("this FFmpeg (libavcodec ", LIBAVCODEC_IDENT, ") has no ", codec_name, " decoder"));
  }
  ctx->reset(avcodec_alloc_context3(decoder));
  if (*ctx == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating a decoder");
  int ret = avcodec_parameters_to_context(ctx->get(), avpar.get());
  if (ret < 0) return av::AvError(ret, StrCat("configuring the ", codec_name, " decoder"));
  (*ctx)->pkt_timebase = AVRational{stream.time_base_num(), stream.time_base_den()};
  (*ctx)->thread_count = 1;  // decoders own no threads (docs/architecture.md)
  // One frame never needs more than a window's worth; FLAC's largest block is 65535.
  (*ctx)->max_samples = std::max<int64_t>(limits.max_audio_samples, 1 << 16);
  ret = avcodec_open2(ctx->get(), decoder, nullptr);
  if (ret < 0) {
    return av::AvError(
        ret, StrCat("opening the ", codec_name, " decoder (", par.sample_rate(), " Hz, ",
                    par.channels(), " channels, ", par.extradata().size(), " bytes of extradata)"));
  }
  return absl::OkStatus();
}

// The packet holding sample dec_lo (packets are in pts order), then the pre-roll before it.
// REQUIRES: the stream has packets.
size_t FirstPacket(const pb::PacketTable& table, const SampleClock& clock, int64_t dec_lo,
                   const Preroll& preroll) {
  const auto* pts_begin = table.pts().data();
  const int64_t target_pts = clock.PtsAtOrBefore(dec_lo);
  size_t first = static_cast<size_t>(
      std::upper_bound(pts_begin, pts_begin + table.pts_size(), target_pts) - pts_begin);
  first = first > 0 ? first - 1 : 0;
  const int64_t cover_k = clock.SampleAt(table.pts(static_cast<int>(first)));
  size_t back = 0;
  while (first > 0 &&
         (back < static_cast<size_t>(preroll.packets) ||
          cover_k - clock.SampleAt(table.pts(static_cast<int>(first))) < preroll.samples)) {
    --first;
    ++back;
  }
  return first;
}

// The decoding of one window: packets from the pre-roll on go to the decoder, and the samples of
// each frame that fall in [dec_lo, dec_hi) are placed at `dst` (input sample s_lo first).
struct WindowDecode {
  const pb::StreamIndex& stream;
  const pb::PacketTable& table;
  const std::string& codec_name;
  const WindowPlan& w;
  AVCodecContext* ctx;
  AVFrame* frame;
  AVPacket* pkt;
  float* dst;
  // Bounds the work a broken index can cause (packets that all claim the same time, say).
  int64_t decode_budget;
  size_t packet;  // the packet being sent (named in errors)
  // Chunks: decoder errors on the chunk's packets are recorded here (and decoding goes on), not
  // returned, so that they fail only the windows that overlap those packets.
  std::vector<BadRange>* bad = nullptr;
  int64_t decoded = 0;
  int64_t covered = std::numeric_limits<int64_t>::min();  // end of the latest samples placed
  int64_t next_k = std::numeric_limits<int64_t>::min();   // where a frame without pts goes

  absl::Status Place(const AVFrame& f) {
    if (f.nb_samples <= 0) return absl::OkStatus();
    if (f.ch_layout.nb_channels != w.channels || (f.sample_rate != 0 && f.sample_rate != w.rate)) {
      return absl::DataLossError(
          StrCat("the ", codec_name, " decoder produced ", f.ch_layout.nb_channels, " channels at ",
                 f.sample_rate, " Hz at ", PacketWhere(stream, w.clock, packet),
                 "; the stream has ", w.channels, " channels at ", w.rate, " Hz"));
    }
    decoded += f.nb_samples;
    if (decoded > decode_budget) {
      return absl::ResourceExhaustedError(StrCat(
          "decoding the audio window took more than ", decode_budget, " samples of ", codec_name,
          " at ", PacketWhere(stream, w.clock, packet), " (packet timestamps inconsistent?)"));
    }
    int64_t pts = f.best_effort_timestamp != AV_NOPTS_VALUE ? f.best_effort_timestamp : f.pts;
    int64_t k0 = pts != AV_NOPTS_VALUE ? w.clock.SampleAt(pts)
                 : next_k != std::numeric_limits<int64_t>::min()
                     ? next_k
                     : w.clock.SampleAt(table.pts(static_cast<int>(packet)));
    const int64_t k1 = k0 + f.nb_samples;
    next_k = k1;
    covered = std::max(covered, k1);
    const int64_t lo = std::max(k0, w.dec_lo), hi = std::min(k1, w.dec_hi);
    if (lo >= hi) return absl::OkStatus();
    if (!CopyFrameAsFloat(f, w.channels, lo - k0, hi - lo, dst + (lo - w.s_lo) * w.channels)) {
      return absl::DataLossError(StrCat("the ", codec_name, " decoder produced sample format ",
                                        f.format, " at ", PacketWhere(stream, w.clock, packet)));
    }
    return absl::OkStatus();
  }

  // Errors on pre-roll packets are forgiven: the decoder may lack context there (an MP3 bit
  // reservoir reaching back further), and those samples are not output.
  absl::Status DecoderError(int ret, bool in_window, std::string_view what) const {
    if (!in_window && ret != AVERROR(ENOMEM)) return absl::OkStatus();
    const std::string msg =
        StrCat("the ", codec_name, " decoder ", what, " ", PacketWhere(stream, w.clock, packet),
               ": ", av::ErrorString(ret));
    return ret == AVERROR(ENOMEM) ? absl::ResourceExhaustedError(msg) : absl::DataLossError(msg);
  }

  // `s`, or OK after recording it in `bad` when decoding a chunk (DATA_LOSS only).
  absl::Status Fail(absl::Status s) {
    if (s.ok() || bad == nullptr || s.code() != absl::StatusCode::kDataLoss) return s;
    const int p = static_cast<int>(packet);
    const int64_t lo = w.clock.SampleAt(table.pts(p));
    const int64_t hi =
        w.clock.SampleAt(table.pts(p), std::max<int64_t>(table.duration(p), 0));
    bad->push_back({lo, std::max(hi, lo + 1), std::move(s)});
    return absl::OkStatus();
  }

  // Places every frame the decoder has ready.
  absl::Status Receive(bool in_window) {
    while (true) {
      const int ret = avcodec_receive_frame(ctx, frame);
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return absl::OkStatus();
      if (ret < 0) {
        RETURN_IF_ERROR(Fail(DecoderError(ret, in_window, "failed after")));
        return absl::OkStatus();
      }
      const absl::Status s = Place(*frame);
      av_frame_unref(frame);
      RETURN_IF_ERROR(s);
    }
  }

  // Reads `packet` through `bytes` into `pkt`, with its timestamps and flags from the table.
  absl::Status ReadPacket(PacketReader read, std::string* bytes) {
    const int p = static_cast<int>(packet);
    RETURN_IF_ERROR(read(packet, bytes));
    if (bytes->size() > static_cast<size_t>(std::numeric_limits<int>::max() / 2)) {
      return absl::DataLossError(StrCat(codec_name, " ", PacketWhere(stream, w.clock, packet),
                                        " is ", bytes->size(), " bytes"));
    }
    av_packet_unref(pkt);
    int ret = av_new_packet(pkt, static_cast<int>(bytes->size()));
    if (ret < 0) return av::AvError(ret, "allocating a packet");
    if (!bytes->empty()) std::memcpy(pkt->data, bytes->data(), bytes->size());
    pkt->pts = pkt->dts = table.pts(p);
    pkt->duration = table.duration(p);
    const uint32_t flags = table.flags_size() != 0 ? table.flags(p) : 1;
    if (flags & 1) pkt->flags |= AV_PKT_FLAG_KEY;
    if (flags & 2) pkt->flags |= AV_PKT_FLAG_DISCARD;
    return absl::OkStatus();
  }

  // Sends packets from `packet` on until the window is covered (or a few packets past its end
  // for a decoder with delay), then drains the decoder if the stream ends inside the window.
  absl::Status Run(PacketReader read, std::string* bytes, uint64_t* packets_decoded) {
    const size_t num_packets = static_cast<size_t>(table.pts_size());
    int past_end = 0;
    for (; packet < num_packets; ++packet) {
      if (covered >= w.dec_hi) break;
      const int p = static_cast<int>(packet);
      const int64_t pkt_k = w.clock.SampleAt(table.pts(p));
      if (pkt_k >= w.dec_hi && ++past_end > kMaxPostrollPackets) break;
      const bool in_window =
          w.clock.SampleAt(table.pts(p), std::max<int64_t>(table.duration(p), 0)) > w.dec_lo;
      RETURN_IF_ERROR(ReadPacket(read, bytes));
      int ret = avcodec_send_packet(ctx, pkt);
      if (ret == AVERROR(EAGAIN)) {  // not expected: every frame is received after each packet
        RETURN_IF_ERROR(Receive(in_window));
        ret = avcodec_send_packet(ctx, pkt);
      }
      ++*packets_decoded;
      if (ret < 0) {
        RETURN_IF_ERROR(Fail(DecoderError(ret, in_window, "rejected")));
        continue;
      }
      RETURN_IF_ERROR(Receive(in_window));
    }
    if (packet == num_packets && covered < w.dec_hi) {
      // The stream ends inside the window: drain what the decoder still holds.
      packet = num_packets - 1;
      const int ret = avcodec_send_packet(ctx, nullptr);
      if (ret < 0 && ret != AVERROR_EOF) {
        RETURN_IF_ERROR(Fail(DecoderError(ret, true, "failed draining after")));
      }
      RETURN_IF_ERROR(Receive(true));
    }
    return absl::OkStatus();
  }
};

// A fresh libswresample context from the stream's layout and rate to the output's (float32
// interleaved both ways).
absl::Status MakeResampler(const pb::CodecParams& par, const WindowPlan& w, av::UniqueSwr* swr) {
  ChannelLayoutOwner in_layout, out_layout;
  RETURN_IF_ERROR(StreamLayout(par, &in_layout.layout));
  if (w.out_ch == w.channels) {
    const int ret = av_channel_layout_copy(&out_layout.layout, &in_layout.layout);
    if (ret < 0) return av::AvError(ret, "copying the channel layout");
  } else {
    av_channel_layout_default(&out_layout.layout, w.out_ch);
  }
  SwrContext* raw = nullptr;
  int ret = swr_alloc_set_opts2(&raw, &out_layout.layout, AV_SAMPLE_FMT_FLT, w.out_rate,
                                &in_layout.layout, AV_SAMPLE_FMT_FLT, w.rate, 0, nullptr);
  swr->reset(raw);
  if (ret >= 0) ret = swr_init(swr->get());
  if (ret < 0) {
    return av::AvError(ret, StrCat("setting up the resampler from ", w.rate, " Hz, ", w.channels,
                                   " channels to ", w.out_rate, " Hz, ", w.out_ch, " channels"));
  }
  return absl::OkStatus();
}

// Resamples the window's input samples `staging` into `out` through `resampled` (output grid
// points from o0 on), then zeroes the pad samples.
absl::Status Resample(const pb::CodecParams& par, const WindowPlan& w,
                      const std::vector<float>& staging, const std::vector<uint8_t>& is_pad,
                      std::vector<float>* resampled, std::vector<float>* out) {
  av::UniqueSwr swr;
  RETURN_IF_ERROR(MakeResampler(par, w, &swr));
  const int out_ch = w.out_ch;
  const int64_t want = w.d + w.num_samples;
  resampled->assign(static_cast<size_t>(want * out_ch), 0.0f);
  const uint8_t* in_planes[1] = {reinterpret_cast<const uint8_t*>(staging.data())};
  int64_t got = 0;
  int64_t in_left = w.s_hi - w.s_lo;
  while (got < want) {
    uint8_t* out_planes[1] = {reinterpret_cast<uint8_t*>(resampled->data() + got * out_ch)};
    // All input at once (the resampler buffers what does not fit), then flushes.
    const int n = swr_convert(swr.get(), out_planes, static_cast<int>(want - got),
                              in_left > 0 ? in_planes : nullptr, static_cast<int>(in_left));
    if (n < 0) return av::AvError(n, "resampling");
    const bool flushed = in_left == 0;
    in_left = 0;
    got += n;
    if (n == 0 && flushed) break;
  }
  // `got` falls short of `want` only if the resampler ends early; those samples stay 0.
  std::copy(resampled->begin() + w.d * out_ch, resampled->end(), out->begin());
  // Output samples outside the stream are pad, and pad is 0 (the filter rings into them).
  for (int64_t j = 0; j < w.num_samples; ++j) {
    if (is_pad[static_cast<size_t>(j)]) {
      std::fill_n(out->begin() + j * out_ch, out_ch, 0.0f);
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct AudioDecoder::Codec {
  std::string key;  // the CodecParams, time base and limits it was opened with
  av::UniqueCodecContext ctx;
  bool needs_flush = false;
};

struct AudioDecoder::Chunk {
  uint64_t key = 0;  // checksum of everything its samples depend on (ChunkKey)
  bool valid = false;  // false: only its memory is kept, for the next chunk decoded
  int64_t lo = 0;    // input samples [lo, hi) at the stream's rate
  int64_t hi = 0;
  int channels = 0;
  std::vector<float> samples;  // interleaved, (hi - lo) * channels
  std::vector<BadRange> bad;   // packets of the chunk the decoder rejected

  size_t bytes() const { return samples.capacity() * sizeof(float) + sizeof(Chunk); }
};

AudioDecoder::AudioDecoder(AudioMethod method) : method_(method) { av::QuietLogging(); }
AudioDecoder::~AudioDecoder() = default;

void AudioDecoder::ClearChunkCache() {
  for (auto& c : chunks_) c->valid = false;  // the memory stays, for the chunks decoded next
}

// The decoder: kept open and flushed while the stream's parameters stay the same, where a flush
// is as good as a fresh decoder; otherwise opened afresh.
absl::Status AudioDecoder::UseDecoderFor(const pb::StreamIndex& stream,
                                         const DecodeLimits& limits) {
  const pb::CodecParams& par = stream.codec();
  const std::string key = StrCat(par.SerializeAsString(), "|", stream.time_base_num(), "/",
                                 stream.time_base_den(), "|", limits.max_audio_samples);
  if (codec_ == nullptr || codec_->key != key || !FlushRestoresOpenState(par.codec())) {
    codec_.reset();
    auto codec = std::make_unique<Codec>();
    RETURN_IF_ERROR(OpenDecoder(stream, limits, &codec->ctx));
    codec->key = key;
    codec_ = std::move(codec);
  } else if (codec_->needs_flush) {
    avcodec_flush_buffers(codec_->ctx.get());
  }
  codec_->needs_flush = true;
  return absl::OkStatus();
}

namespace {

// The packets a chunk's decode may send: from the pre-roll before its first sample to the
// kMaxPostrollPackets-th packet past its end (WindowDecode::Run stops there at the latest).
struct ChunkPackets {
  size_t first;
  size_t stop;
};

ChunkPackets PacketsOfChunk(const pb::PacketTable& table, const WindowPlan& cw,
                            const Preroll& preroll) {
  ChunkPackets r{FirstPacket(table, cw.clock, cw.dec_lo, preroll), 0};
  const size_t n = static_cast<size_t>(table.pts_size());
  int past_end = 0;
  r.stop = r.first;
  for (; r.stop < n; ++r.stop) {
    if (cw.clock.SampleAt(table.pts(static_cast<int>(r.stop))) >= cw.dec_hi &&
        ++past_end > kMaxPostrollPackets) {
      break;
    }
  }
  return r;
}

template <typename T>
void AppendSlice(const google::protobuf::RepeatedField<T>& f, size_t first, size_t stop,
                 std::string* key) {
  key->append(reinterpret_cast<const char*>(f.data() + first), (stop - first) * sizeof(T));
}

// A checksum of everything a chunk's samples depend on: the decoder's configuration (`codec_key`),
// the grid, the clock, and the timestamps, flags and checksums of the packets it may send; 0 when
// the table has no packet checksums (the chunk is then not kept).
uint64_t ChunkKey(const std::string& codec_key, const WindowPlan& cw, int64_t chunk_samples,
                  const pb::PacketTable& table, const ChunkPackets& pk, std::string* key) {
  const size_t n = static_cast<size_t>(table.pts_size());
  if (static_cast<size_t>(table.xxh3_size()) != n || static_cast<size_t>(table.duration_size()) != n) {
    return 0;
  }
  key->assign(codec_key);
  const int64_t nums[] = {cw.dec_lo,         cw.dec_hi,        chunk_samples,
                          cw.k_end,          cw.clock.origin,  static_cast<int64_t>(pk.first),
                          static_cast<int64_t>(pk.stop), static_cast<int64_t>(n),
                          table.flags_size()};
  key->append(reinterpret_cast<const char*>(nums), sizeof(nums));
  AppendSlice(table.pts(), pk.first, pk.stop, key);
  AppendSlice(table.duration(), pk.first, pk.stop, key);
  AppendSlice(table.xxh3(), pk.first, pk.stop, key);
  if (static_cast<size_t>(table.flags_size()) == n) AppendSlice(table.flags(), pk.first, pk.stop, key);
  return std::max<uint64_t>(XXH3_64bits(key->data(), key->size()), 1);
}

}  // namespace

absl::Status AudioDecoder::DecodeWindow(const pb::StreamIndex& stream, PacketReader read,
                                        double start_s, int64_t num_samples, int out_rate,
                                        int out_channels, const DecodeLimits& limits,
                                        std::vector<float>* out, std::vector<uint8_t>* is_pad) {
  RETURN_IF_ERROR(CheckRequest(start_s, num_samples, out_rate, out_channels, limits, out, is_pad));
  WindowPlan w;
  RETURN_IF_ERROR(CheckStream(stream, num_samples, out_rate, out_channels, limits, &w));
  RETURN_IF_ERROR(PlanInputSamples(start_s, limits, &w));

  out->assign(static_cast<size_t>(w.out_floats), 0.0f);
  is_pad->assign(static_cast<size_t>(num_samples), 1);
  const pb::PacketTable& table = stream.packets();
  if (table.pts_size() == 0 || !MarkRealSamples(table, &w, is_pad)) {
    ++windows_;
    return absl::OkStatus();
  }

  // Where decoded samples go: straight into `out` when no resampling is needed.
  float* dst = nullptr;
  if (w.passthrough) {
    dst = out->data();
  } else {
    staging_.assign(static_cast<size_t>((w.s_hi - w.s_lo) * w.channels), 0.0f);
    dst = staging_.data();
  }
  const Preroll preroll = PrerollFor(stream.codec());
  if (method_ == AudioMethod::kChunks) {
    RETURN_IF_ERROR(CopyFromChunks(stream, read, limits, w, preroll, dst));
  } else {
    RETURN_IF_ERROR(DecodeOne(stream, read, limits, w, preroll, dst, nullptr));
  }
  if (!w.passthrough) {
    RETURN_IF_ERROR(Resample(stream.codec(), w, staging_, *is_pad, &resampled_, out));
  }
  ++windows_;
  return absl::OkStatus();
}

// Decodes input samples [w.dec_lo, w.dec_hi) of `stream` into `dst` (sample w.s_lo first) with a
// fresh decoder (or a flushed PCM one), starting `preroll` before them.
absl::Status AudioDecoder::DecodeOne(const pb::StreamIndex& stream, PacketReader read,
                                     const DecodeLimits& limits, const WindowPlan& w,
                                     const Preroll& preroll, float* dst, std::vector<BadRange>* bad) {
  RETURN_IF_ERROR(UseDecoderFor(stream, limits));
  const pb::PacketTable& table = stream.packets();
  const size_t first = FirstPacket(table, w.clock, w.dec_lo, preroll);
  av::UniqueFrame frame = av::MakeFrame();
  av::UniquePacket pkt = av::MakePacket();
  if (frame == nullptr || pkt == nullptr) {
    return av::AvError(AVERROR(ENOMEM), "allocating a frame and a packet");
  }
  WindowDecode run{
      .stream = stream,
      .table = table,
      .codec_name = stream.codec().codec(),
      .w = w,
      .ctx = codec_->ctx.get(),
      .frame = frame.get(),
      .pkt = pkt.get(),
      .dst = dst,
      .decode_budget = 2 * (w.s_hi - w.s_lo) +
                       16 * static_cast<int64_t>(std::max(preroll.samples, int64_t{1} << 16)),
      .packet = first,
      .bad = bad,
  };
  return run.Run(read, &packet_bytes_, &packets_decoded_);
}

// AudioMethod::kChunks: copies input samples [w.dec_lo, w.dec_hi) into `dst` from the chunks of
// the grid they fall in, decoding those not kept.
absl::Status AudioDecoder::CopyFromChunks(const pb::StreamIndex& stream, PacketReader read,
                                          const DecodeLimits& limits, const WindowPlan& w,
                                          const Preroll& preroll, float* dst) {
  const pb::PacketTable& table = stream.packets();
  const int64_t chunk_samples = ChunkSamples(w.rate, w.channels);
  const pb::CodecParams& par = stream.codec();
  const std::string codec_key = StrCat(par.SerializeAsString(), "|", stream.time_base_num(), "/",
                                       stream.time_base_den(), "|", limits.max_audio_samples);
  // dec_lo >= 0: the grid starts at t = 0.
  for (int64_t c = w.dec_lo / chunk_samples; c * chunk_samples < w.dec_hi; ++c) {
    WindowPlan cw = w;
    cw.dec_lo = cw.s_lo = c * chunk_samples;
    cw.dec_hi = cw.s_hi = std::min((c + 1) * chunk_samples, w.k_end);
    const ChunkPackets pk = PacketsOfChunk(table, cw, preroll);
    const uint64_t key = ChunkKey(codec_key, cw, chunk_samples, table, pk, &chunk_key_);
    Chunk* chunk = nullptr;
    for (auto it = chunks_.begin(); key != 0 && it != chunks_.end(); ++it) {
      Chunk& k = **it;
      if (k.valid && k.key == key && k.lo == cw.dec_lo && k.hi == cw.dec_hi && k.channels == w.channels) {
        std::rotate(it, it + 1, chunks_.end());  // most recently used last
        chunk = chunks_.back().get();
        break;
      }
    }
    if (chunk == nullptr) {
      // The memory of a chunk no longer valid, or of the least recently used one when the new
      // one would not fit beside it; else new memory.
      const size_t need = static_cast<size_t>((cw.dec_hi - cw.dec_lo) * w.channels) * sizeof(float);
      auto reuse = std::find_if(chunks_.begin(), chunks_.end(), [](const auto& k) { return !k->valid; });
      if (reuse == chunks_.end() && !chunks_.empty() &&
          chunk_bytes_ + need + sizeof(Chunk) > kMaxCacheBytes) {
        reuse = chunks_.begin();
      }
      std::unique_ptr<Chunk> fresh;
      if (reuse != chunks_.end()) {
        fresh = std::move(*reuse);
        chunks_.erase(reuse);
        chunk_bytes_ -= fresh->bytes();
      } else {
        fresh = std::make_unique<Chunk>();
      }
      fresh->key = 0;
      fresh->valid = false;
      fresh->lo = cw.dec_lo;
      fresh->hi = cw.dec_hi;
      fresh->channels = w.channels;
      fresh->bad.clear();
      fresh->samples.assign(static_cast<size_t>((cw.dec_hi - cw.dec_lo) * w.channels), 0.0f);
      RETURN_IF_ERROR(
          DecodeOne(stream, read, limits, cw, preroll, fresh->samples.data(), &fresh->bad));
      ++chunks_decoded_;
      fresh->key = key;
      fresh->valid = key != 0;  // without packet checksums: used for this window only
      chunk_bytes_ += fresh->bytes();
      chunks_.push_back(std::move(fresh));
      chunk = chunks_.back().get();
    }
    const int64_t lo = std::max(cw.dec_lo, w.dec_lo), hi = std::min(cw.dec_hi, w.dec_hi);
    for (const BadRange& b : chunk->bad) {
      if (b.hi > lo && b.lo < hi) return b.status;
    }
    std::memcpy(dst + (lo - w.s_lo) * w.channels,
                chunk->samples.data() + (lo - chunk->lo) * w.channels,
                static_cast<size_t>((hi - lo) * w.channels) * sizeof(float));
  }
  // Keep the chunks within their bound, least recently used first.
  while (!chunks_.empty() && chunk_bytes_ > kMaxCacheBytes) {
    chunk_bytes_ -= chunks_.front()->bytes();
    chunks_.erase(chunks_.begin());
  }
  return absl::OkStatus();
}

}  // namespace conveyor
