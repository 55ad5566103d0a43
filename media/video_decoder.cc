#include "media/video_decoder.h"

extern "C" {
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
}

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <numeric>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/internal/av_codec_params.h"
#include "media/internal/av_util.h"
#include "format/format.h"

namespace conveyor {

namespace pb = format::v1;

int SwsFlagsFor(ResizeFilter f) {
  switch (f) {
    case ResizeFilter::kBilinear: return SWS_BILINEAR;
    case ResizeFilter::kBicubic: return SWS_BICUBIC;
    case ResizeFilter::kArea: return SWS_AREA;
    case ResizeFilter::kNearest: return SWS_POINT;
    case ResizeFilter::kLanczos: return SWS_LANCZOS;
  }
  return SWS_BILINEAR;
}

// ---------------------------------------------------------------------------------------------
// VideoDecoder

namespace {

enum class Rotation { kNone, kClockwise, kHalf, kCounterClockwise };

// The ffmpeg CLI's autorotate rule (FFmpeg 5.1 fftools): the clockwise angle of the display
// matrix, rounded; 90, 180 and 270 (within a degree) are applied, anything else is not.
Rotation RotationOf(double rotation_deg_ccw) {
  double theta = -std::round(rotation_deg_ccw);
  theta -= 360 * std::floor(theta / 360 + 0.9 / 360);
  if (std::fabs(theta - 90) < 1.0) return Rotation::kClockwise;
  if (std::fabs(theta - 180) < 1.0) return Rotation::kHalf;
  if (std::fabs(theta - 270) < 1.0) return Rotation::kCounterClockwise;
  return Rotation::kNone;
}

}  // namespace

DisplayedSize DisplayedSizeOf(const pb::StreamIndex& stream, bool autorotate) {
  const Rotation r = autorotate ? RotationOf(stream.codec().rotation_deg()) : Rotation::kNone;
  const bool quarter = r == Rotation::kClockwise || r == Rotation::kCounterClockwise;
  DisplayedSize d;
  d.width = quarter ? stream.codec().height() : stream.codec().width();
  d.height = quarter ? stream.codec().width() : stream.codec().height();
  return d;
}

namespace {

// Whether `fmt` can be rotated plane by plane (as FFmpeg's transpose/flip filters do): planar,
// 1- or 2-byte samples, the same chroma subsampling both ways.
bool PlanewiseRotatable(AVPixelFormat fmt) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(fmt);
  if (d == nullptr) return false;
  if (d->flags & (AV_PIX_FMT_FLAG_BITSTREAM | AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_HWACCEL)) {
    return false;
  }
  if (d->log2_chroma_w != d->log2_chroma_h) return false;
  const int planes = av_pix_fmt_count_planes(fmt);
  if (planes != d->nb_components) return false;  // packed formats: one plane, several components
  for (int c = 0; c < d->nb_components; ++c) {
    if (d->comp[c].step != 1 && d->comp[c].step != 2) return false;
  }
  return true;
}

template <typename T>
void RotatePlane(const uint8_t* src, int src_linesize, int w, int h, uint8_t* dst,
                 int dst_linesize, Rotation r) {
  // (w, h): the source plane in elements. Destination is (h, w) for quarter turns.
  switch (r) {
    case Rotation::kClockwise:  // out[y][x] = in[h-1-x][y], out is h wide and w tall
      for (int y = 0; y < w; ++y) {
        T* out = reinterpret_cast<T*>(dst + static_cast<ptrdiff_t>(y) * dst_linesize);
        for (int x = 0; x < h; ++x) {
          out[x] = reinterpret_cast<const T*>(src + static_cast<ptrdiff_t>(h - 1 - x) *
                                                        src_linesize)[y];
        }
      }
      break;
    case Rotation::kCounterClockwise:  // out[y][x] = in[x][w-1-y]
      for (int y = 0; y < w; ++y) {
        T* out = reinterpret_cast<T*>(dst + static_cast<ptrdiff_t>(y) * dst_linesize);
        for (int x = 0; x < h; ++x) {
          out[x] = reinterpret_cast<const T*>(src + static_cast<ptrdiff_t>(x) * src_linesize)[w - 1 - y];
        }
      }
      break;
    case Rotation::kHalf:  // out[y][x] = in[h-1-y][w-1-x]
      for (int y = 0; y < h; ++y) {
        T* out = reinterpret_cast<T*>(dst + static_cast<ptrdiff_t>(y) * dst_linesize);
        const T* in = reinterpret_cast<const T*>(src + static_cast<ptrdiff_t>(h - 1 - y) * src_linesize);
        for (int x = 0; x < w; ++x) out[x] = in[w - 1 - x];
      }
      break;
    case Rotation::kNone:
      break;
  }
}

// Rotates an RGB24 image (for pixel formats that cannot be rotated plane by plane).
void RotateRgb(const RgbImage& in, Rotation r, RgbImage* out) {
  const int w = in.width, h = in.height;
  const bool quarter = r == Rotation::kClockwise || r == Rotation::kCounterClockwise;
  out->width = quarter ? h : w;
  out->height = quarter ? w : h;
  out->pixels.resize(in.pixels.size());
  for (int y = 0; y < out->height; ++y) {
    for (int x = 0; x < out->width; ++x) {
      int sx = x, sy = y;
      if (r == Rotation::kClockwise) { sx = y; sy = h - 1 - x; }
      else if (r == Rotation::kCounterClockwise) { sx = w - 1 - y; sy = x; }
      else if (r == Rotation::kHalf) { sx = w - 1 - x; sy = h - 1 - y; }
      std::memcpy(&out->pixels[(static_cast<size_t>(y) * out->width + x) * 3],
                  &in.pixels[(static_cast<size_t>(sy) * w + sx) * 3], 3);
    }
  }
}

// Whether `fmt`'s planes can be cut at a rectangle by moving their pointers: the formats the
// CLI's crop filter takes (FFmpeg 5.1 vf_crop query_formats): not hardware or bitstream formats,
// and chroma subsampling only in planar ones.
bool PlanewiseCroppable(AVPixelFormat fmt) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(fmt);
  if (d == nullptr) return false;
  if (d->flags & (AV_PIX_FMT_FLAG_HWACCEL | AV_PIX_FMT_FLAG_BITSTREAM)) return false;
  return !((d->log2_chroma_w != 0 || d->log2_chroma_h != 0) && !(d->flags & AV_PIX_FMT_FLAG_PLANAR));
}

// Plane pointers and strides of an image, and its size in pixels.
struct PlaneView {
  const uint8_t* data[4] = {nullptr, nullptr, nullptr, nullptr};
  int linesize[4] = {0, 0, 0, 0};
  int width = 0;
  int height = 0;
};

PlaneView WholeFrame(const AVFrame* f) {
  PlaneView v;
  for (int i = 0; i < 4; ++i) {
    v.data[i] = f->data[i];
    v.linesize[i] = f->linesize[i];
  }
  v.width = f->width;
  v.height = f->height;
  return v;
}

// `crop` rounded as the CLI's crop filter rounds it without `exact` (FFmpeg 5.1 vf_crop
// config_output): x, y, width and height down to the chroma grid, so that the chroma planes are
// cut on whole samples and cover the luma rectangle. A width or height of less than one chroma
// sample stays as it is (the filter would refuse it).
VideoCrop AlignCrop(VideoCrop crop, AVPixelFormat fmt) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(fmt);
  const int mw = ~((1 << d->log2_chroma_w) - 1), mh = ~((1 << d->log2_chroma_h) - 1);
  crop.x &= mw;
  crop.y &= mh;
  if ((crop.width & mw) > 0) crop.width &= mw;
  if ((crop.height & mh) > 0) crop.height &= mh;
  return crop;
}

// The rectangle `crop` (aligned: AlignCrop) of the planes `data`/`linesize` of format `fmt`,
// computed as vf_crop's filter_frame moves the pointers. REQUIRES: PlanewiseCroppable(fmt).
PlaneView CropPlanes(const uint8_t* const data[4], const int linesize[4], AVPixelFormat fmt,
                     const VideoCrop& crop) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(fmt);
  int max_step[4] = {0, 0, 0, 0};
  av_image_fill_max_pixsteps(max_step, nullptr, d);
  PlaneView v;
  for (int i = 0; i < 4; ++i) {
    v.data[i] = data[i];
    v.linesize[i] = linesize[i];
  }
  v.width = crop.width;
  v.height = crop.height;
  const ptrdiff_t x = crop.x, y = crop.y;
  v.data[0] += y * linesize[0] + x * max_step[0];
  if (!(d->flags & AV_PIX_FMT_FLAG_PAL)) {  // a palette is not an image plane
    for (int i = 1; i < 3; ++i) {
      if (v.data[i] == nullptr) continue;
      v.data[i] += (y >> d->log2_chroma_h) * linesize[i] + ((x * max_step[i]) >> d->log2_chroma_w);
    }
  }
  if (v.data[3] != nullptr) v.data[3] += y * linesize[3] + x * max_step[3];
  return v;
}

// Kept frames (State::recent): at most this many, and this many bytes.
constexpr size_t kRecentFrames = 8;
constexpr size_t kRecentBytes = 32u << 20;

// The request alone: how many frames, which ones, and the output size.
absl::Status CheckRequest(const FrameTable& table, std::span<const int64_t> frames,
                          const VideoOutput& output, const DecodeLimits& limits) {
  if (static_cast<int64_t>(frames.size()) > limits.max_frames_per_sample) {
    return absl::ResourceExhaustedError(
        StrCat(frames.size(), " frames requested, over the limit of ", limits.max_frames_per_sample,
               " (limits.max_frames_per_sample)"));
  }
  for (int64_t f : frames) {
    if (f < 0 || f >= static_cast<int64_t>(table.size())) {
      return absl::OutOfRangeError(
          StrCat("frame ", f, " requested; the stream has ", table.size(), " frames"));
    }
  }
  if (output.width < 0 || output.height < 0 ||
      static_cast<int64_t>(output.width) * output.height > limits.max_pixels) {
    return absl::InvalidArgumentError(
        StrCat("output size ", output.width, "x", output.height, " is invalid or over limits"));
  }
  return absl::OkStatus();
}

// Indices into `frames` sorted by frame (stable: repeats keep their order), so that each frame is
// decoded once, in presentation order.
std::vector<size_t> PresentationOrder(std::span<const int64_t> frames) {
  std::vector<size_t> order(frames.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return frames[a] < frames[b]; });
  return order;
}

// Copies `image` into the results of order[from..] that ask for frame k too (the order is by
// frame, so they are one run) and counts them delivered; returns the index past that run.
size_t DeliverRepeats(const RgbImage& image, int64_t k, std::span<const int64_t> frames,
                      const std::vector<size_t>& order, size_t from, std::vector<RgbImage>* out,
                      uint64_t* frames_delivered) {
  size_t oi = from;
  while (oi < order.size() && frames[order[oi]] == k) {
    (*out)[order[oi]] = image;
    ++*frames_delivered;
    ++oi;
  }
  return oi;
}

}  // namespace

struct VideoDecoder::State {
  av::UniqueCodecContext ctx;
  std::string params_key;      // serialized CodecParams the context was opened with
  uint64_t stream_key = 0;
  bool live = false;           // the context holds a decode chain for stream_key
  bool drained = false;        // end of stream was signalled
  bool used = false;           // packets were sent since the context was opened or flushed
  size_t next_packet = 0;      // next decode-order packet to send
  int64_t last_pts = std::numeric_limits<int64_t>::min();
  av::UniqueFrame frame = av::MakeFrame();
  av::UniqueFrame rotated = av::MakeFrame();
  av::UniquePacket pkt = av::MakePacket();
  std::string bytes;
  av::UniqueSws sws;
  std::vector<uint8_t> scratch;  // aligned-stride RGB rows (libswscale may write past a row)
  // The last frames delivered, so a window that starts before the decoder's position (a sample
  // asking for t - 0.1 s after the previous one got t) needs no seek back. Keyed by stream,
  // frame and output; a few frames and at most kRecentBytes.
  struct Recent {
    uint64_t stream_key;
    int64_t frame;
    int width, height, filter;
    bool autorotate;
    std::optional<VideoCrop> crop;
    RgbImage image;
  };
  std::deque<Recent> recent;
  size_t recent_bytes = 0;

  // (Re)opens the codec context when the parameters change; forgets the decode chain when the
  // stream (`key`, see Decode) changes.
  absl::Status UseCodecFor(uint64_t key, const pb::StreamIndex& stream, const DecodeLimits& limits,
                           FrameDecoderStats& stats);
  // Frame k of stream `key` as `output` asks for it, if it is kept; else null.
  const RgbImage* FindRecent(uint64_t key, int64_t k, const VideoOutput& output) const;
  // Restarts decoding at packet `start` unless the decode chain can go on forward to `target`.
  void SeekUnlessContinuing(uint64_t key, size_t start, int64_t target, FrameDecoderStats& stats);
  // Decodes forward until frame k comes out into `frame`.
  absl::Status DecodeFrame(int64_t k, const FrameTable& table, const pb::PacketTable& pk,
                           PacketReader read, FrameDecoderStats& stats);
  // Sends packet next_packet (for frame k), or signals the end of the stream after the last.
  absl::Status SendNextPacket(int64_t k, const pb::PacketTable& pk, PacketReader read,
                              FrameDecoderStats& stats);
  // Converts `frame` to RGB into `image` (rotated, cropped and resized as `output` asks).
  absl::Status ConvertFrame(Rotation rotation, const VideoOutput& output, RgbImage* image);
  // Crops `src` (displayed orientation, pixel format `fmt`) in its own pixel format and converts
  // the rectangle to the output size in one pass, with the colour matrix and range of `colour`
  // (null: libswscale's); output.crop is checked against the image. REQUIRES:
  // PlanewiseCroppable(fmt).
  absl::Status ConvertCrop(const PlaneView& src, AVPixelFormat fmt, const AVFrame* colour,
                           const VideoOutput& output, RgbImage* image);
  absl::Status RotatePlanes(const AVFrame* src, Rotation rotation);
  // A scaler from `src` (pixel format `fmt`) to rgb24 cw x ch with `flags`, reusing the cached
  // one when it fits; with the colour matrix and range of `colour` (null: libswscale's).
  absl::Status PrepareScaler(const PlaneView& src, AVPixelFormat fmt, const AVFrame* colour,
                             int cw, int ch, int flags);
  void Scale(const PlaneView& src, RgbImage* img);
  // Keeps a copy of `image` (frame k of stream `key`) for the next calls.
  void Remember(uint64_t key, int64_t k, const VideoOutput& output, const RgbImage& image);
};

VideoDecoder::VideoDecoder() : state_(std::make_unique<State>()) {}
VideoDecoder::~VideoDecoder() = default;

namespace {

absl::Status OpenCodec(const pb::StreamIndex& stream, const DecodeLimits& limits,
                       av::UniqueCodecContext* out) {
  av::QuietLogging();
  av::UniqueCodecParameters par(avcodec_parameters_alloc());
  if (par == nullptr) return absl::ResourceExhaustedError("allocating codec parameters");
  RETURN_IF_ERROR(av::CodecParamsToAv(stream.codec(), par.get()));
  if (par->codec_type != AVMEDIA_TYPE_VIDEO) {
    return absl::InvalidArgumentError(
        StrCat("codec '", stream.codec().codec(), "' is not a video codec"));
  }
  const int64_t pixels = static_cast<int64_t>(par->width) * par->height;
  if (par->width <= 0 || par->height <= 0) {
    return absl::DataLossError(StrCat("codec parameters give no frame size (", par->width, "x",
                                      par->height, ")"));
  }
  if (pixels > limits.max_pixels) {
    return absl::ResourceExhaustedError(
        StrCat("frames of ", par->width, "x", par->height, " = ", pixels,
               " pixels are over the limit of ", limits.max_pixels, " (limits.max_pixels)"));
  }
  const AVCodec* codec = avcodec_find_decoder(par->codec_id);
  if (codec == nullptr) {
    return absl::UnimplementedError(
        StrCat("this FFmpeg has no decoder for '", stream.codec().codec(), "'"));
  }
  av::UniqueCodecContext ctx(avcodec_alloc_context3(codec));
  if (ctx == nullptr) return absl::ResourceExhaustedError("allocating a codec context");
  int ret = avcodec_parameters_to_context(ctx.get(), par.get());
  if (ret < 0) return av::AvError(ret, "copying codec parameters");
  ctx->pkt_timebase = AVRational{stream.time_base_num(), stream.time_base_den()};
  ctx->thread_count = 1;  // no threads inside: parallelism is one decoder per worker
  ctx->max_pixels = limits.max_pixels;
  ctx->err_recognition |= AV_EF_EXPLODE;  // corrupt data is an error, not a concealed frame
  ret = avcodec_open2(ctx.get(), codec, nullptr);
  if (ret < 0) return av::AvError(ret, StrCat("opening the ", codec->name, " decoder"));
  *out = std::move(ctx);
  return absl::OkStatus();
}

}  // namespace

absl::Status VideoDecoder::State::UseCodecFor(uint64_t key, const pb::StreamIndex& stream,
                                              const DecodeLimits& limits,
                                              FrameDecoderStats& stats) {
  std::string params = stream.codec().SerializeAsString();
  if (ctx == nullptr || params != params_key) {
    ctx.reset();
    live = false;
    RETURN_IF_ERROR(OpenCodec(stream, limits, &ctx));
    params_key = std::move(params);
    used = false;
    ++stats.decoders_opened;
  }
  if (stream_key != key) live = false;
  return absl::OkStatus();
}

const RgbImage* VideoDecoder::State::FindRecent(uint64_t key, int64_t k,
                                                const VideoOutput& output) const {
  for (const Recent& r : recent) {
    const bool same_crop =
        r.crop.has_value() == output.crop.has_value() &&
        (!r.crop || (r.crop->x == output.crop->x && r.crop->y == output.crop->y &&
                     r.crop->width == output.crop->width && r.crop->height == output.crop->height));
    if (r.stream_key == key && r.frame == k && r.width == output.width &&
        r.height == output.height && r.filter == static_cast<int>(output.filter) &&
        r.autorotate == output.autorotate && same_crop) {
      return &r.image;
    }
  }
  return nullptr;
}

void VideoDecoder::State::SeekUnlessContinuing(uint64_t key, size_t start, int64_t target,
                                               FrameDecoderStats& stats) {
  // After a drain the decoder still holds the frames not yet received; EOF ends it.
  const bool can_continue = live && last_pts < target && start <= next_packet;
  if (can_continue) return;
  if (used) avcodec_flush_buffers(ctx.get());
  used = true;
  stream_key = key;
  live = true;
  drained = false;
  next_packet = start;
  last_pts = std::numeric_limits<int64_t>::min();
  ++stats.seeks;
}

absl::Status VideoDecoder::State::DecodeFrame(int64_t k, const FrameTable& table,
                                              const pb::PacketTable& pk, PacketReader read,
                                              FrameDecoderStats& stats) {
  const int64_t target = table.pts[k];
  while (true) {
    const int ret = avcodec_receive_frame(ctx.get(), frame.get());
    if (ret == 0) {
      ++stats.frames_decoded;
      const int64_t pts = frame->pts != AV_NOPTS_VALUE ? frame->pts : frame->best_effort_timestamp;
      if ((frame->flags & AV_FRAME_FLAG_CORRUPT) || frame->decode_error_flags != 0) {
        av_frame_unref(frame.get());
        live = false;
        return absl::DataLossError(StrCat("the decoder flagged the frame at pts ", pts,
                                          " as corrupt (decoding frame ", k, ", packet ",
                                          table.packet[k], ")"));
      }
      if (pts != AV_NOPTS_VALUE) last_pts = pts;
      if (pts == target) return absl::OkStatus();
      if (pts != AV_NOPTS_VALUE && pts > target) {
        av_frame_unref(frame.get());
        live = false;
        return absl::DataLossError(
            StrCat("frame ", k, " (pts ", target, ", packet ", table.packet[k],
                   ") never came out of the decoder; it went on to pts ", pts));
      }
      av_frame_unref(frame.get());
      continue;
    }
    if (ret == AVERROR(EAGAIN)) {
      RETURN_IF_ERROR(SendNextPacket(k, pk, read, stats));
      continue;
    }
    live = false;
    if (ret == AVERROR_EOF) {
      return absl::DataLossError(StrCat("the stream ended before frame ", k, " (pts ", target,
                                        ", packet ", table.packet[k], ") came out"));
    }
    return av::AvError(ret, StrCat("decoding frame ", k, " (packet ", table.packet[k], ")"));
  }
}

absl::Status VideoDecoder::State::SendNextPacket(int64_t k, const pb::PacketTable& pk,
                                                 PacketReader read, FrameDecoderStats& stats) {
  const size_t num_packets = static_cast<size_t>(pk.pts_size());
  if (next_packet >= num_packets) {
    const int ret = avcodec_send_packet(ctx.get(), nullptr);
    drained = true;
    if (ret < 0 && ret != AVERROR_EOF) {
      live = false;
      return av::AvError(ret, "draining the decoder");
    }
    return absl::OkStatus();
  }
  const size_t p = next_packet++;
  absl::Status st = read(p, &bytes);
  if (!st.ok()) {
    live = false;
    return st;
  }
  av_packet_unref(pkt.get());
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max() / 2)) {
    live = false;
    return absl::DataLossError(StrCat("packet ", p, " is ", bytes.size(), " bytes"));
  }
  int ret = av_new_packet(pkt.get(), static_cast<int>(bytes.size()));
  if (ret < 0) return av::AvError(ret, "allocating a packet");
  if (!bytes.empty()) std::memcpy(pkt->data, bytes.data(), bytes.size());
  const int pi = static_cast<int>(p);
  pkt->pts = pk.pts(pi);
  pkt->dts = pk.dts(pi);
  pkt->duration = pk.duration(pi);
  if (pk.flags(pi) & format::kPacketKey) pkt->flags |= AV_PKT_FLAG_KEY;
  ret = avcodec_send_packet(ctx.get(), pkt.get());
  ++stats.packets_sent;
  if (ret < 0) {
    live = false;
    return av::AvError(
        ret, StrCat("the ", ctx->codec->name, " decoder rejected packet ", p, " (", bytes.size(),
                    " bytes, pts ", pk.pts(pi), ") while decoding frame ", k));
  }
  return absl::OkStatus();
}

absl::Status VideoDecoder::State::ConvertFrame(Rotation rotation, const VideoOutput& output,
                                               RgbImage* image) {
  // Rotate first, on the planes, as the CLI's transpose filters do.
  AVFrame* src = frame.get();
  bool rgb_rotate = false;
  if (rotation != Rotation::kNone) {
    if (PlanewiseRotatable(static_cast<AVPixelFormat>(src->format))) {
      RETURN_IF_ERROR(RotatePlanes(src, rotation));
      src = rotated.get();
    } else {
      rgb_rotate = true;
    }
  }
  if (output.crop && !rgb_rotate && PlanewiseCroppable(static_cast<AVPixelFormat>(src->format))) {
    const absl::Status st =
        ConvertCrop(WholeFrame(src), static_cast<AVPixelFormat>(src->format), src, output, image);
    av_frame_unref(frame.get());
    return st;
  }
  const bool quarter_after = rgb_rotate && rotation != Rotation::kHalf;
  if (output.crop) {
    // The planes cannot be cut where the crop asks: full size in RGB first, then cropped there.
    VideoOutput full = output;
    full.width = full.height = 0;
    full.crop.reset();
    RgbImage rgb;
    RETURN_IF_ERROR(ConvertFrame(rotation, full, &rgb));
    PlaneView view;
    view.data[0] = rgb.pixels.data();
    view.linesize[0] = rgb.width * 3;
    view.width = rgb.width;
    view.height = rgb.height;
    return ConvertCrop(view, AV_PIX_FMT_RGB24, nullptr, output, image);
  }
  const int ow = output.width > 0 ? output.width : (quarter_after ? src->height : src->width);
  const int oh = output.height > 0 ? output.height : (quarter_after ? src->width : src->height);
  // With an RGB rotation afterwards, convert to the pre-rotation size.
  const int cw = quarter_after ? oh : ow;
  const int ch = quarter_after ? ow : oh;
  const bool scaling = cw != src->width || ch != src->height;
  const PlaneView whole = WholeFrame(src);
  RETURN_IF_ERROR(PrepareScaler(whole, static_cast<AVPixelFormat>(src->format), src, cw, ch,
                                scaling ? SwsFlagsFor(output.filter) : SWS_BICUBIC));
  RgbImage converted;
  RgbImage& img = rgb_rotate ? converted : *image;
  img.width = cw;
  img.height = ch;
  img.pixels.resize(static_cast<size_t>(cw) * ch * 3);
  Scale(whole, &img);
  av_frame_unref(frame.get());
  if (rgb_rotate) RotateRgb(converted, rotation, image);
  return absl::OkStatus();
}

absl::Status VideoDecoder::State::ConvertCrop(const PlaneView& src, AVPixelFormat fmt,
                                              const AVFrame* colour, const VideoOutput& output,
                                              RgbImage* image) {
  const VideoCrop& want = *output.crop;
  if (want.x < 0 || want.y < 0 || want.width <= 0 || want.height <= 0 ||
      want.x > src.width - want.width || want.y > src.height - want.height) {
    return absl::InvalidArgumentError(
        StrCat("crop ", want.width, "x", want.height, " at (", want.x, ", ", want.y,
               ") is not inside the ", src.width, "x", src.height, " frame"));
  }
  const VideoCrop crop = AlignCrop(want, fmt);
  const PlaneView view = CropPlanes(src.data, src.linesize, fmt, crop);
  const int ow = output.width > 0 ? output.width : crop.width;
  const int oh = output.height > 0 ? output.height : crop.height;
  const bool scaling = ow != crop.width || oh != crop.height;
  int flags = scaling ? SwsFlagsFor(output.filter) : SWS_BICUBIC;
  // From RGB (the fallback), keep chroma at full resolution through libswscale's internal YUV.
  const bool from_rgb = fmt == AV_PIX_FMT_RGB24;
  if (from_rgb) flags |= SWS_FULL_CHR_H_INP | SWS_FULL_CHR_H_INT;
  RETURN_IF_ERROR(PrepareScaler(view, fmt, colour, ow, oh, flags));
  image->width = ow;
  image->height = oh;
  image->pixels.resize(static_cast<size_t>(ow) * oh * 3);
  Scale(view, image);
  return absl::OkStatus();
}

// Rotates `src` plane by plane into `rotated`. REQUIRES: PlanewiseRotatable(src's format).
absl::Status VideoDecoder::State::RotatePlanes(const AVFrame* src, Rotation rotation) {
  const AVPixelFormat fmt = static_cast<AVPixelFormat>(src->format);
  const bool quarter = rotation != Rotation::kHalf;
  av_frame_unref(rotated.get());
  rotated->format = src->format;
  rotated->width = quarter ? src->height : src->width;
  rotated->height = quarter ? src->width : src->height;
  int ret = av_frame_get_buffer(rotated.get(), 0);
  if (ret < 0) return av::AvError(ret, "allocating a rotated frame");
  av_frame_copy_props(rotated.get(), src);
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(fmt);
  for (int c = 0; c < d->nb_components; ++c) {
    const int plane = d->comp[c].plane;
    const bool chroma = (plane == 1 || plane == 2);
    const int pw = chroma ? AV_CEIL_RSHIFT(src->width, d->log2_chroma_w) : src->width;
    const int ph = chroma ? AV_CEIL_RSHIFT(src->height, d->log2_chroma_h) : src->height;
    if (d->comp[c].step == 1) {
      RotatePlane<uint8_t>(src->data[plane], src->linesize[plane], pw, ph, rotated->data[plane],
                           rotated->linesize[plane], rotation);
    } else {
      RotatePlane<uint16_t>(src->data[plane], src->linesize[plane], pw, ph, rotated->data[plane],
                            rotated->linesize[plane], rotation);
    }
  }
  return absl::OkStatus();
}

absl::Status VideoDecoder::State::PrepareScaler(const PlaneView& src, AVPixelFormat fmt,
                                                const AVFrame* colour, int cw, int ch,
                                                int flags) {
  sws.reset(sws_getCachedContext(sws.release(), src.width, src.height, fmt, cw, ch,
                                 AV_PIX_FMT_RGB24, flags, nullptr, nullptr, nullptr));
  if (sws == nullptr) {
    return absl::UnimplementedError(StrCat("libswscale cannot convert ", av_get_pix_fmt_name(fmt),
                                           " ", src.width, "x", src.height, " to rgb24 ", cw, "x",
                                           ch));
  }
  if (colour == nullptr) return absl::OkStatus();
  const AVFrame* src_frame = colour;
  // The CLI's scale filter (colour matrix "auto"): the frame's matrix and range.
  int *inv_table = nullptr, *table_out = nullptr;
  int src_range = 0, dst_range = 0, brightness = 0, contrast = 0, saturation = 0;
  if (sws_getColorspaceDetails(sws.get(), &inv_table, &src_range, &table_out, &dst_range,
                               &brightness, &contrast, &saturation) >= 0) {
    // Read the enums as ints: a broken stream can carry values outside the enum's range.
    int colorspace = 0, color_range = 0;
    std::memcpy(&colorspace, &src_frame->colorspace, sizeof(colorspace));
    std::memcpy(&color_range, &src_frame->color_range, sizeof(color_range));
    if (colorspace < 0 || colorspace >= AVCOL_SPC_NB) colorspace = SWS_CS_DEFAULT;
    const int* in_coeffs = sws_getCoefficients(colorspace);
    if (color_range == AVCOL_RANGE_MPEG || color_range == AVCOL_RANGE_JPEG) {
      src_range = color_range == AVCOL_RANGE_JPEG;
    }
    sws_setColorspaceDetails(sws.get(), in_coeffs, src_range, table_out, dst_range, brightness,
                             contrast, saturation);
  }
  return absl::OkStatus();
}

// Converts `src` into `img` (sized already) with the scaler PrepareScaler set up.
void VideoDecoder::State::Scale(const PlaneView& src, RgbImage* img) {
  const int cw = img->width, ch = img->height;
  if (cw % 16 == 0) {
    // Rows of a multiple of 16 pixels: libswscale's vector code writes whole rows only, so it
    // can write straight into the image (rows 16-byte aligned), saving a copy per frame.
    uint8_t* dst_data[4] = {img->pixels.data(), nullptr, nullptr, nullptr};
    int dst_linesize[4] = {cw * 3, 0, 0, 0};
    sws_scale(sws.get(), src.data, src.linesize, 0, src.height, dst_data, dst_linesize);
  } else {
    // Other widths: libswscale may write past a row's end; convert into padded rows.
    const int stride = FFALIGN(cw * 3, 64);
    scratch.resize(static_cast<size_t>(stride) * ch + 64);
    uint8_t* dst_data[4] = {scratch.data(), nullptr, nullptr, nullptr};
    int dst_linesize[4] = {stride, 0, 0, 0};
    sws_scale(sws.get(), src.data, src.linesize, 0, src.height, dst_data, dst_linesize);
    for (int y = 0; y < ch; ++y) {
      std::memcpy(&img->pixels[static_cast<size_t>(y) * cw * 3],
                  &scratch[static_cast<size_t>(y) * stride], static_cast<size_t>(cw) * 3);
    }
  }
}

void VideoDecoder::State::Remember(uint64_t key, int64_t k, const VideoOutput& output,
                                   const RgbImage& image) {
  if (!output.keep_recent || image.pixels.size() > kRecentBytes) return;
  recent.push_back(Recent{key, k, output.width, output.height, static_cast<int>(output.filter),
                          output.autorotate, output.crop, image});
  recent_bytes += image.pixels.size();
  while (recent.size() > kRecentFrames || recent_bytes > kRecentBytes) {
    recent_bytes -= recent.front().image.pixels.size();
    recent.pop_front();
  }
}

absl::Status VideoDecoder::Decode(uint64_t stream_key, const pb::StreamIndex& stream,
                                  const FrameTable& table, PacketReader read,
                                  std::span<const int64_t> frames, const VideoOutput& output,
                                  const DecodeLimits& limits, std::vector<RgbImage>* out) {
  State& s = *state_;
  if (s.frame == nullptr || s.pkt == nullptr || s.rotated == nullptr) {
    return absl::ResourceExhaustedError("allocating FFmpeg frames");
  }
  RETURN_IF_ERROR(CheckRequest(table, frames, output, limits));
  RETURN_IF_ERROR(s.UseCodecFor(stream_key, stream, limits, stats_));
  const Rotation rotation =
      output.autorotate ? RotationOf(stream.codec().rotation_deg()) : Rotation::kNone;

  // Unique targets in presentation order, and where each result goes.
  const std::vector<size_t> order = PresentationOrder(frames);
  out->resize(frames.size());
  size_t oi = 0;
  while (oi < order.size()) {
    const int64_t k = frames[order[oi]];
    if (const RgbImage* r = s.FindRecent(stream_key, k, output)) {
      // Delivered again without decoding (and without moving the decoder).
      oi = DeliverRepeats(*r, k, frames, order, oi, out, &stats_.frames_delivered);
      continue;
    }
    s.SeekUnlessContinuing(stream_key, table.start_packet[k], table.pts[k], stats_);
    RETURN_IF_ERROR(s.DecodeFrame(k, table, stream.packets(), read, stats_));
    RgbImage& first = (*out)[order[oi]];
    RETURN_IF_ERROR(s.ConvertFrame(rotation, output, &first));
    // Remember it for the next call (see State::recent).
    s.Remember(stream_key, k, output, first);
    ++stats_.frames_delivered;
    // Repeats of the same frame.
    oi = DeliverRepeats(first, k, frames, order, oi + 1, out, &stats_.frames_delivered);
  }
  return absl::OkStatus();
}

}  // namespace conveyor
