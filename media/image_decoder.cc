#include "media/image_decoder.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status_macros.h"
#include "base/strings.h"
#include "media/internal/av_util.h"

extern "C" {
#include <libavutil/pixdesc.h>
}

namespace conveyor {
namespace {

struct TjDeleter {
  void operator()(void* handle) const {
    if (handle != nullptr) tjDestroy(handle);
  }
};
using UniqueTj = std::unique_ptr<void, TjDeleter>;

// STOPONWARNING: libjpeg-turbo calls a truncated file or a bad Huffman code a *warning* and fills
// the rest with grey; a training sample must not silently be half grey. LIMITSCANS: refuses
// progressive files with an absurd number of scans (a CPU-time bomb of a few KB).
constexpr int kTjFlags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;

// A PNG's compressed text and ICC chunks: FFmpeg inflates them with no size bound (a 1 KB chunk
// can become 1 MB), and nothing in the pixels depends on them.
bool IsUnboundedPngChunk(std::string_view type) {
  return type == "zTXt" || type == "iTXt" || type == "iCCP";
}

uint32_t LoadBigEndian32(std::string_view b, size_t pos) {
  return (uint32_t{static_cast<uint8_t>(b[pos])} << 24) |
         (uint32_t{static_cast<uint8_t>(b[pos + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(b[pos + 2])} << 8) |
         uint32_t{static_cast<uint8_t>(b[pos + 3])};
}

constexpr std::string_view kPngSignature("\x89PNG\r\n\x1a\n", 8);

// A chunk for messages: "the IDAT chunk", or a placeholder when the type is not four letters.
std::string PngChunkName(std::string_view type) {
  for (char c : type) {
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) return "a chunk of corrupt type";
  }
  return StrCat("the ", type, " chunk");
}

// Header sizes are at most 32 bits a side (PNG), so the product fits in 64 unsigned bits.
bool OverPixelLimit(uint32_t width, uint32_t height, const DecodeLimits& limits) {
  return uint64_t{width} * height > static_cast<uint64_t>(std::max<int64_t>(limits.max_pixels, 0));
}

absl::Status OverPixelLimitError(std::string_view what, uint32_t width, uint32_t height,
                                 const DecodeLimits& limits) {
  return absl::ResourceExhaustedError(
      StrCat(what, " header says ", width, "x", height, " = ", uint64_t{width} * height,
             " pixels, over the limit of ", limits.max_pixels, " (limits.max_pixels)"));
}

// Reads a PNG's chunk list before FFmpeg does: FFmpeg reports a bad signature or a truncated
// file only as "Invalid data", an oversized image only as "Invalid argument", and accepts a file
// cut right before IEND. Returns the bytes to decode: `bytes`, or, when it has chunks FFmpeg
// would inflate without bound, a copy without them in `*scratch`.
absl::StatusOr<std::string_view> PreparePng(std::string_view bytes, const DecodeLimits& limits,
                                            std::string* scratch) {
  if (bytes.size() < kPngSignature.size() || bytes.substr(0, 8) != kPngSignature) {
    return absl::DataLossError("png: not a PNG file (the first 8 bytes are not its signature)");
  }
  if (bytes.size() < 8 + 12 + 13 || bytes.substr(12, 4) != "IHDR") {
    return absl::DataLossError(
        StrCat("png: truncated or corrupt PNG: no IHDR chunk after the signature (", bytes.size(),
               " bytes)"));
  }
  const uint32_t w = LoadBigEndian32(bytes, 16), h = LoadBigEndian32(bytes, 20);
  if (OverPixelLimit(w, h, limits)) return OverPixelLimitError("PNG", w, h, limits);

  bool strip = false;
  size_t pos = 8;
  for (bool end = false; !end;) {
    if (bytes.size() - pos < 12) {
      return absl::DataLossError(
          StrCat("png: truncated PNG: ", bytes.size(), " bytes and no IEND chunk"));
    }
    const size_t chunk = size_t{LoadBigEndian32(bytes, pos)} + 12;
    const std::string_view type = bytes.substr(pos + 4, 4);
    if (chunk > bytes.size() - pos) {
      return absl::DataLossError(StrCat("png: truncated PNG: ", PngChunkName(type), " at byte ",
                                        pos, " needs ", chunk, " bytes, ", bytes.size() - pos,
                                        " are left"));
    }
    if (IsUnboundedPngChunk(type)) {
      if (!strip) scratch->assign(bytes.substr(0, pos));
      strip = true;
    } else if (strip) {
      scratch->append(bytes.substr(pos, chunk));
    }
    end = type == "IEND";
    pos += chunk;
  }
  if (strip) return std::string_view(*scratch);
  return bytes;
}

std::string_view PixFmtName(AVPixelFormat format) {
  const char* name = av_get_pix_fmt_name(format);
  return name != nullptr ? name : "(unknown)";
}

// Adobe CMYK as libjpeg stores it (inverted: 255 = no ink) to RGB, as djpeg's PPM writer does:
// R = round(C * K / 255), and so on.
void InvertedCmykToRgb(const uint8_t* cmyk, size_t pixels, uint8_t* rgb) {
  for (size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const unsigned k = cmyk[3];
    rgb[0] = static_cast<uint8_t>((cmyk[0] * k + 127) / 255);
    rgb[1] = static_cast<uint8_t>((cmyk[1] * k + 127) / 255);
    rgb[2] = static_cast<uint8_t>((cmyk[2] * k + 127) / 255);
  }
}

// A binary PPM (P6) with maxval 255 is already packed RGB24: the samples are copied as they are,
// a memcpy instead of libavcodec's PPM decoder plus libswscale, with the same bytes as ffmpeg's
// decode of the file (`ffmpeg -i x.ppm -f rawvideo -pix_fmt rgb24 -`; tests/image_decoder_test.cc).
// A binary PGM (P5, maxval 255) is grey: each sample becomes R = G = B, as libswscale's gray to
// rgb24 conversion gives. HDF5 episodes serve raw camera arrays this way (datasets/hdf5/).
// Returns the offset of the samples when `bytes` is such a file (magic P`kind`) holding exactly
// width x height x `channels` samples, else 0 (then libavcodec decodes it, and reports what is
// wrong).
size_t RawPnmSamples(std::string_view bytes, char kind, uint64_t channels, uint32_t* width,
                     uint32_t* height) {
  if (bytes.size() < 3 || bytes[0] != 'P' || bytes[1] != kind) return 0;
  size_t pos = 2;
  uint64_t fields[3] = {0, 0, 0};
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f'; };
  for (uint64_t& field : fields) {
    while (pos < bytes.size() && (space(bytes[pos]) || bytes[pos] == '#')) {
      if (bytes[pos] == '#') {
        while (pos < bytes.size() && bytes[pos] != '\n' && bytes[pos] != '\r') ++pos;
      } else {
        ++pos;
      }
    }
    size_t digits = 0;
    while (pos < bytes.size() && bytes[pos] >= '0' && bytes[pos] <= '9' && digits < 9) {
      field = field * 10 + static_cast<uint64_t>(bytes[pos] - '0');
      ++pos;
      ++digits;
    }
    if (digits == 0) return 0;
  }
  // One whitespace byte ends the header.
  if (pos >= bytes.size() || !space(bytes[pos]) || fields[2] != 255) return 0;
  ++pos;
  if (fields[0] == 0 || fields[1] == 0 || bytes.size() - pos != fields[0] * fields[1] * channels) {
    return 0;
  }
  *width = static_cast<uint32_t>(fields[0]);
  *height = static_cast<uint32_t>(fields[1]);
  return pos;
}

}  // namespace

class ImageDecoder::Impl {
 public:
  Impl() { av::QuietLogging(); }

  // Returns whether the JPEG was decoded below full size.
  absl::StatusOr<bool> DecodeJpeg(std::string_view bytes, int min_width, int min_height,
                                  const DecodeLimits& limits, RgbImage* out);
  absl::Status DecodeWithFfmpeg(std::string_view codec, std::string_view bytes,
                                const DecodeLimits& limits, RgbImage* out);

 private:
  // DATA_LOSS with TurboJPEG's message. Drops the handle: a failed call can leave it broken.
  absl::Status JpegError(std::string_view what);
  absl::StatusOr<AVCodecContext*> FfmpegContext(std::string_view codec);
  absl::Status FrameToRgb(const AVFrame& frame, std::string_view codec, RgbImage* out);

  UniqueTj tj_;

  std::map<std::string, av::UniqueCodecContext, std::less<>> contexts_;  // by codec name
  av::UniquePacket packet_;
  av::UniqueFrame frame_;
  av::UniqueSws sws_;
};

absl::Status ImageDecoder::Impl::JpegError(std::string_view what) {
  const bool warning = tjGetErrorCode(tj_.get()) == TJERR_WARNING;
  absl::Status status =
      absl::DataLossError(StrCat("mjpeg: ", what, ": ", tjGetErrorStr2(tj_.get()),
                                 warning ? " (a libjpeg-turbo warning, treated as an error)" : ""));
  // tjDecompressHeader3 does not reset libjpeg's state when it fails (a bad DHT in the header
  // makes every later call on the handle fail the same way), so start afresh after any error.
  tj_.reset();
  return status;
}

absl::StatusOr<bool> ImageDecoder::Impl::DecodeJpeg(std::string_view bytes, int min_width,
                                                    int min_height, const DecodeLimits& limits,
                                                    RgbImage* out) {
  if (bytes.empty()) return absl::DataLossError("mjpeg: empty image (0 bytes)");
  if (tj_ == nullptr) {
    tj_.reset(tjInitDecompress());
    if (tj_ == nullptr) {
      return absl::ResourceExhaustedError(
          StrCat("mjpeg: tjInitDecompress failed: ", tjGetErrorStr2(nullptr)));
    }
  }
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj_.get(), data, bytes.size(), &width, &height, &subsamp, &colorspace) !=
      0) {
    return JpegError("bad JPEG header");
  }
  if (width <= 0 || height <= 0) {
    return absl::DataLossError(StrCat("mjpeg: JPEG header says ", width, "x", height));
  }
  if (OverPixelLimit(width, height, limits)) {
    return OverPixelLimitError("JPEG", width, height, limits);
  }

  // The smallest factor <= 1 that keeps both sides at or above the minimum; 1/1 is always one
  // of TurboJPEG's factors, so the search starts there.
  tjscalingfactor scale = {1, 1};
  if (min_width > 0 || min_height > 0) {
    int n = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&n);
    int64_t best_pixels = int64_t{width} * height;
    for (int i = 0; factors != nullptr && i < n; ++i) {
      const tjscalingfactor f = factors[i];
      if (f.num > f.denom) continue;
      const int w = TJSCALED(width, f), h = TJSCALED(height, f);
      if ((min_width > 0 && w < min_width) || (min_height > 0 && h < min_height)) continue;
      if (int64_t{w} * h < best_pixels) {
        best_pixels = int64_t{w} * h;
        scale = f;
      }
    }
  }
  const int out_w = TJSCALED(width, scale), out_h = TJSCALED(height, scale);
  const size_t pixels = size_t(out_w) * size_t(out_h);
  out->width = out_w;
  out->height = out_h;
  out->pixels.resize(pixels * 3);

  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    // libjpeg-turbo has no CMYK -> RGB conversion ("Unsupported color conversion request"), so
    // decode to CMYK and convert here. CMYK is rare: the buffer is not kept.
    std::vector<uint8_t> cmyk(pixels * 4);
    if (tjDecompress2(tj_.get(), data, bytes.size(), cmyk.data(), out_w, out_w * 4, out_h,
                      TJPF_CMYK, kTjFlags) != 0) {
      return JpegError("corrupt or truncated JPEG data");
    }
    InvertedCmykToRgb(cmyk.data(), pixels, out->pixels.data());
  } else if (tjDecompress2(tj_.get(), data, bytes.size(), out->pixels.data(), out_w, out_w * 3,
                           out_h, TJPF_RGB, kTjFlags) != 0) {
    return JpegError("corrupt or truncated JPEG data");
  }
  return scale.num != scale.denom;
}

absl::StatusOr<AVCodecContext*> ImageDecoder::Impl::FfmpegContext(std::string_view codec) {
  if (auto it = contexts_.find(codec); it != contexts_.end()) return it->second.get();
  const std::string name(codec);
  const AVCodec* decoder = avcodec_find_decoder_by_name(name.c_str());
  if (decoder == nullptr || decoder->type != AVMEDIA_TYPE_VIDEO) {
    return absl::InvalidArgumentError(
        StrCat("unknown image codec '", codec,
               "': neither mjpeg nor the name of an FFmpeg video decoder"));
  }
  av::UniqueCodecContext ctx(avcodec_alloc_context3(decoder));
  if (ctx == nullptr) return absl::ResourceExhaustedError(StrCat(codec, ": out of memory"));
  ctx->thread_count = 1;  // no threads inside a decoder (the pipeline owns concurrency)
  // Corrupt data must be an error, not a picture with grey or stale rows: EXPLODE makes
  // decoders fail where they would conceal damage, CRCCHECK verifies PNG chunk checksums.
  ctx->err_recognition |= AV_EF_EXPLODE | AV_EF_CRCCHECK;
  if (int err = avcodec_open2(ctx.get(), decoder, nullptr); err < 0) {
    return av::AvError(err, StrCat(codec, ": opening the decoder"));
  }
  AVCodecContext* raw = ctx.get();
  contexts_.emplace(name, std::move(ctx));
  return raw;
}

absl::Status ImageDecoder::Impl::DecodeWithFfmpeg(std::string_view codec, std::string_view bytes,
                                                  const DecodeLimits& limits, RgbImage* out) {
  ASSIGN_OR_RETURN(AVCodecContext * ctx, FfmpegContext(codec));
  if (bytes.empty()) return absl::DataLossError(StrCat(codec, ": empty image (0 bytes)"));
  if (bytes.size() > size_t{std::numeric_limits<int>::max()} - AV_INPUT_BUFFER_PADDING_SIZE) {
    return absl::ResourceExhaustedError(
        StrCat(codec, ": image of ", bytes.size(), " bytes, over FFmpeg's packet size limit"));
  }

  std::string stripped_png;  // rarely used (see PreparePng), so not kept
  if (codec == "png") {
    ASSIGN_OR_RETURN(bytes, PreparePng(bytes, limits, &stripped_png));
  }

  if (packet_ == nullptr) packet_ = av::MakePacket();
  if (frame_ == nullptr) frame_ = av::MakeFrame();
  if (packet_ == nullptr || frame_ == nullptr) {
    return absl::ResourceExhaustedError(StrCat(codec, ": out of memory"));
  }
  ctx->max_pixels = limits.max_pixels;
  av_packet_unref(packet_.get());
  if (int err = av_new_packet(packet_.get(), static_cast<int>(bytes.size())); err < 0) {
    return av::AvError(err, StrCat(codec, ": allocating the packet"));
  }
  std::memcpy(packet_->data, bytes.data(), bytes.size());
  packet_->flags |= AV_PKT_FLAG_KEY;

  // One packet in, then drain, so a decoder with delay gives its frame too; flushing afterwards
  // (also after errors) leaves the context ready for the next image.
  struct FlushOnExit {
    AVCodecContext* ctx;
    AVFrame* frame;
    ~FlushOnExit() {
      avcodec_flush_buffers(ctx);
      av_frame_unref(frame);
    }
  } flush{ctx, frame_.get()};
  int err = avcodec_send_packet(ctx, packet_.get());
  av_packet_unref(packet_.get());
  if (err < 0) return av::AvError(err, StrCat(codec, ": decoder rejected the image"));
  if (err = avcodec_send_packet(ctx, nullptr); err < 0) {
    return av::AvError(err, StrCat(codec, ": draining the decoder"));
  }
  err = avcodec_receive_frame(ctx, frame_.get());
  if (err == AVERROR_EOF) {
    return absl::DataLossError(
        StrCat(codec, ": the decoder produced no image from ", bytes.size(), " bytes"));
  }
  if (err < 0) return av::AvError(err, StrCat(codec, ": decoding the image"));
  if (frame_->decode_error_flags != 0 || (frame_->flags & AV_FRAME_FLAG_CORRUPT)) {
    return absl::DataLossError(StrCat(codec, ": the decoder flagged the image as corrupt"));
  }
  return FrameToRgb(*frame_, codec, out);
}

absl::Status ImageDecoder::Impl::FrameToRgb(const AVFrame& frame, std::string_view codec,
                                            RgbImage* out) {
  const int w = frame.width, h = frame.height;
  const auto format = static_cast<AVPixelFormat>(frame.format);
  if (w <= 0 || h <= 0 || format == AV_PIX_FMT_NONE) {
    return absl::DataLossError(StrCat(codec, ": decoded image is ", w, "x", h));
  }
  out->width = w;
  out->height = h;
  const size_t row = size_t(w) * 3;
  if (format == AV_PIX_FMT_RGB24) {  // the CLI does no conversion either
    out->pixels.resize(row * h);
    for (int y = 0; y < h; ++y) {
      std::memcpy(out->pixels.data() + y * row, frame.data[0] + ptrdiff_t{y} * frame.linesize[0],
                  row);
    }
    return absl::OkStatus();
  }
  // The ffmpeg CLI's auto-inserted scaler uses flags=bicubic. At the same size they pick no
  // filter, but they do pick libswscale's conversion path (some go through YUV internally), so
  // the same flags give the CLI's bytes.
  sws_.reset(sws_getCachedContext(sws_.release(), w, h, format, w, h, AV_PIX_FMT_RGB24, SWS_BICUBIC,
                                  nullptr, nullptr, nullptr));
  if (sws_ == nullptr) {
    return absl::UnimplementedError(StrCat(codec, ": libswscale cannot convert pixel format ",
                                           PixFmtName(format), " to rgb24"));
  }
  // As the CLI's scale filter does (colour matrix "auto"): the frame's matrix and range. Only
  // YUV sources (not PNG's RGB or grey) depend on them.
  int *inv_table = nullptr, *table = nullptr;
  int src_range = 0, dst_range = 0, brightness = 0, contrast = 0, saturation = 0;
  if (sws_getColorspaceDetails(sws_.get(), &inv_table, &src_range, &table, &dst_range, &brightness,
                               &contrast, &saturation) >= 0) {
    // Read the enums as ints: a broken file can carry values outside the enum's range.
    int colorspace = 0, color_range = 0;
    std::memcpy(&colorspace, &frame.colorspace, sizeof(colorspace));
    std::memcpy(&color_range, &frame.color_range, sizeof(color_range));
    if (colorspace < 0 || colorspace >= AVCOL_SPC_NB) colorspace = SWS_CS_DEFAULT;
    if (color_range == AVCOL_RANGE_MPEG || color_range == AVCOL_RANGE_JPEG) {
      src_range = color_range == AVCOL_RANGE_JPEG;
    }
    sws_setColorspaceDetails(sws_.get(), sws_getCoefficients(colorspace), src_range, table,
                             dst_range, brightness, contrast, saturation);
  }
  // libswscale's SIMD paths may write a few pixels past the last one of a row; the slack keeps
  // that inside the vector. Shrinking afterwards keeps the allocation.
  constexpr size_t kSlack = 64;
  out->pixels.resize(row * h + kSlack);
  uint8_t* dst[4] = {out->pixels.data(), nullptr, nullptr, nullptr};
  int dst_stride[4] = {static_cast<int>(row), 0, 0, 0};
  const int rows = sws_scale(sws_.get(), frame.data, frame.linesize, 0, h, dst, dst_stride);
  out->pixels.resize(row * h);
  if (rows != h) {
    return absl::InternalError(StrCat(codec, ": libswscale converted ", rows, " of ", h,
                                      " rows from ", PixFmtName(format)));
  }
  return absl::OkStatus();
}

ImageDecoder::ImageDecoder() : impl_(std::make_unique<Impl>()) {}
ImageDecoder::~ImageDecoder() = default;

absl::Status ImageDecoder::Decode(std::string_view codec, std::string_view bytes, int min_width,
                                  int min_height, const DecodeLimits& limits, RgbImage* out) {
  if (codec == "mjpeg") {
    ASSIGN_OR_RETURN(const bool scaled,
                     impl_->DecodeJpeg(bytes, min_width, min_height, limits, out));
    ++images_decoded_;
    if (scaled) ++scaled_decodes_;
    return absl::OkStatus();
  }
  if (codec == "ppm" || codec == "pgm") {
    const bool grey = codec == "pgm";
    uint32_t w = 0, h = 0;
    if (const size_t start = RawPnmSamples(bytes, grey ? '5' : '6', grey ? 1 : 3, &w, &h);
        start != 0) {
      if (OverPixelLimit(w, h, limits)) return OverPixelLimitError(grey ? "PGM" : "PPM", w, h, limits);
      out->width = static_cast<int>(w);
      out->height = static_cast<int>(h);
      const size_t pixels = size_t{w} * h;
      out->pixels.resize(pixels * 3);
      const auto* src = reinterpret_cast<const uint8_t*>(bytes.data() + start);
      if (grey) {
        for (size_t i = 0; i < pixels; ++i) {
          out->pixels[3 * i] = out->pixels[3 * i + 1] = out->pixels[3 * i + 2] = src[i];
        }
      } else {
        std::memcpy(out->pixels.data(), src, pixels * 3);
      }
      ++images_decoded_;
      return absl::OkStatus();
    }
  }
  RETURN_IF_ERROR(impl_->DecodeWithFfmpeg(codec, bytes, limits, out));
  ++images_decoded_;
  return absl::OkStatus();
}

absl::StatusOr<ImageHeader> PeekImageHeader(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  ImageHeader h;
  if (bytes.size() >= 24 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) {
    if (std::memcmp(p + 12, "IHDR", 4) != 0) return absl::DataLossError("png: no IHDR chunk first");
    h.codec = "png";
    h.width = static_cast<int>((uint32_t{p[16]} << 24) | (uint32_t{p[17]} << 16) | (uint32_t{p[18]} << 8) | p[19]);
    h.height = static_cast<int>((uint32_t{p[20]} << 24) | (uint32_t{p[21]} << 16) | (uint32_t{p[22]} << 8) | p[23]);
    if (h.width <= 0 || h.height <= 0) return absl::DataLossError("png: IHDR says a size of 0 or over 2^31");
    return h;
  }
  if (bytes.size() >= 3 && std::memcmp(p, "\xff\xd8\xff", 3) == 0) {
    struct Free {
      void operator()(void* t) const { tjDestroy(t); }
    };
    thread_local std::unique_ptr<void, Free> tj;
    if (tj == nullptr) tj.reset(tjInitDecompress());
    if (tj == nullptr) return absl::ResourceExhaustedError("mjpeg: tjInitDecompress failed");
    int subsamp = 0, colorspace = 0;
    h.codec = "mjpeg";
    if (tjDecompressHeader3(tj.get(), p, bytes.size(), &h.width, &h.height, &subsamp, &colorspace) != 0) {
      const std::string why = tjGetErrorStr2(tj.get());
      tj.reset();  // a failed header parse leaves the handle's state behind (see JpegError)
      return absl::DataLossError(StrCat("mjpeg: bad JPEG header: ", why));
    }
    return h;
  }
  return absl::InvalidArgumentError("not a JPEG or PNG image");
}

}  // namespace conveyor
