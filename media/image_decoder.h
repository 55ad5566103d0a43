// Decoding of one stored IMAGE frame (one packet = one whole JPEG or PNG file) to packed RGB24.
//
// JPEG ("mjpeg") goes through libjpeg-turbo's TurboJPEG API, which can scale in the DCT domain
// while decoding: when the caller will shrink the image anyway, asking for a minimum size makes the
// decode several times cheaper and loses nothing the later resize would keep. Everything else
// ("png", and any other still-image codec FFmpeg has a decoder for) goes through libavcodec and
// libswscale, converted as the ffmpeg CLI's auto-inserted scaler does, so a PNG equals
// `ffmpeg -i x.png -pix_fmt rgb24 -f rawvideo -` byte for byte; a JPEG equals `djpeg -ppm` (at
// full size) or `djpeg -scale M/N -ppm` (scaled).
//
// No EXIF orientation is applied (neither djpeg nor the ffmpeg CLI applies it to stills).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "media/decode_common.h"

namespace conveyor {

// What an encoded image's header says, read without decoding the image: "mjpeg" (TurboJPEG's
// header parse) or "png" (its IHDR chunk), and the size. For checking that every image of a
// stream has the size and codec of the one probed (datasets/rlds/), at a few microseconds each.
struct ImageHeader {
  std::string codec;
  int width = 0;
  int height = 0;
};
// INVALID_ARGUMENT for bytes that are neither a JPEG nor a PNG; DATA_LOSS for a damaged header.
absl::StatusOr<ImageHeader> PeekImageHeader(std::string_view bytes);

// Not thread-safe: synchronous, no threads inside; one thread at a time uses it (it may move
// between threads between calls). Meant to be held by one worker and reused for many images: the
// TurboJPEG handle and the FFmpeg decoder contexts (one per codec seen) are created on first use
// and kept.
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Decodes the image in `bytes` (a whole file; only read during the call) into `out`: RGB24,
  // rows top to bottom, stride 3 * width. `out`'s buffer is reused when it is large enough.
  //
  // `codec` is the stream's codec name from the manifest: "mjpeg" (TurboJPEG), or the name of an
  // FFmpeg video decoder such as "png" (libavcodec, one packet in, one frame out).
  //
  // `min_width` / `min_height` (pixels; <= 0 = no constraint on that side; both <= 0 = full
  // size): a JPEG larger than that is decoded at the smallest TurboJPEG scaling factor M/8
  // (tjGetScalingFactors, never above 1) whose output is still at least min_width x min_height,
  // so out->width/height may be smaller than the file's but never below the minimum (unless the
  // file itself is). Other codecs are always decoded at full size.
  //
  // The size in the file's header is checked against limits.max_pixels before any pixel buffer
  // is allocated (the full size, also when scaling: decode time follows the full size). JPEG and
  // PNG headers are read here; for other codecs FFmpeg's max_pixels (set to limits.max_pixels)
  // refuses the image, with that decoder's own error code (often DATA_LOSS).
  //
  // Grey JPEGs come out as R = G = B; CMYK and YCCK JPEGs (Adobe's inverted CMYK, as
  // Photoshop writes them) are converted as djpeg's PPM writer does, R = C * K / 255, and so on.
  // PNG alpha is dropped (not blended), 16-bit samples are reduced to 8 by libswscale.
  //
  // Errors name the codec and what is wrong; the caller adds dataset, episode, stream and frame.
  //   DATA_LOSS: empty, truncated or corrupt data (libjpeg-turbo warnings count as errors, and
  //              libavcodec runs with AV_EF_EXPLODE and chunk CRC checks), or no image out.
  //   RESOURCE_EXHAUSTED: the JPEG or PNG header's width x height is over limits.max_pixels.
  //   INVALID_ARGUMENT: a codec name that is neither "mjpeg" nor an FFmpeg video decoder.
  //   UNIMPLEMENTED: an FFmpeg pixel format libswscale cannot turn into RGB24.
  // On error *out holds unspecified pixels; the decoder stays usable.
  absl::Status Decode(std::string_view codec, std::string_view bytes, int min_width, int min_height,
                      const DecodeLimits& limits, RgbImage* out);

  // Counters since construction: successful decodes, and those of them done at a JPEG scaling
  // factor below 1.
  uint64_t images_decoded() const { return images_decoded_; }
  uint64_t scaled_decodes() const { return scaled_decodes_; }

 private:
  class Impl;  // the TurboJPEG and FFmpeg handles (kept out of this header)
  std::unique_ptr<Impl> impl_;
  uint64_t images_decoded_ = 0;
  uint64_t scaled_decodes_ = 0;
};

}  // namespace conveyor
