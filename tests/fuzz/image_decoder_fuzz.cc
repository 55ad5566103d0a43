// libFuzzer target for ImageDecoder (media/image_decoder.h). The first input byte picks the
// codec (even: "mjpeg" through TurboJPEG, odd: "png" through libavcodec) and a minimum size for a
// second, scaled decode; the rest is the image file. One decoder is reused across all inputs, as
// a pipeline worker reuses it, so state left behind by a failed decode is exercised too. The
// pixel limit is small so that headers claiming huge images are refused before allocation.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "media/image_decoder.h"

extern "C" {
#include <libavutil/log.h>
}

namespace {

// A broken promise of the API: crash so that libFuzzer saves the input.
void Check(bool condition) {
  if (!condition) __builtin_trap();
}

void CheckImage(const conveyor::RgbImage& img, const conveyor::DecodeLimits& limits) {
  Check(img.width > 0 && img.height > 0);
  Check(int64_t{img.width} * img.height <= limits.max_pixels);
  Check(img.pixels.size() == size_t(img.width) * size_t(img.height) * 3);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  av_log_set_level(AV_LOG_QUIET);  // corrupt input is the norm here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static conveyor::ImageDecoder* decoder = new conveyor::ImageDecoder;
  conveyor::DecodeLimits limits;
  limits.max_pixels = 4 << 20;
  const std::string_view codec = data[0] % 2 == 0 ? "mjpeg" : "png";
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);

  conveyor::RgbImage full;
  const bool full_ok = decoder->Decode(codec, bytes, 0, 0, limits, &full).ok();
  if (full_ok) CheckImage(full, limits);

  // Minimum sizes from 1 to 64 per side, one of them sometimes unconstrained.
  const int min_w = (data[0] >> 1) % 8 == 0 ? 0 : 1 + ((data[0] >> 1) & 63);
  const int min_h = (data[0] >> 4) % 8 == 0 ? 0 : 1 + ((data[0] >> 2) & 63);
  conveyor::RgbImage scaled;
  if (decoder->Decode(codec, bytes, min_w, min_h, limits, &scaled).ok()) {
    CheckImage(scaled, limits);
    if (full_ok) {
      Check(scaled.width <= full.width && scaled.height <= full.height);
      // Never below the minimum, unless the image itself is smaller.
      Check(scaled.width >= std::min(min_w, full.width));
      Check(scaled.height >= std::min(min_h, full.height));
      if (codec == "png") Check(scaled.width == full.width && scaled.height == full.height);
    }
  }
  return 0;
}
