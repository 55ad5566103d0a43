// Deterministic image augmentation: random resized crop, horizontal flip, colour jitter, resize,
// normalize. Every random number of a sample comes from SampleRng(seed, epoch, sample index,
// stream), so a sample's bits are the same at any thread count, in any order, on any server.
// The arithmetic is plain C++ (no SIMD dispatch, no FMA contraction on x86-64), so the results
// do not depend on which CPU features a server has. See docs/sampling.md.
#pragma once

#include <cstdint>

#include "media/decode_common.h"
#include "sample/sample_spec.h"

namespace conveyor {

// A counter-based generator: its stream is a pure function of its four keys (splitmix64
// finalizers chained over them), independent of how many other samples were drawn before.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t sample, uint64_t stream);
  uint64_t Next();
  double Uniform();                       // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi]

 private:
  uint64_t state_;
};

// What was drawn for one camera of one sample; applied to every frame of that camera.
struct ImageDraw {
  bool crop = false;
  int x = 0, y = 0, w = 0, h = 0;  // crop box in source pixels
  bool flip = false;
  float brightness = 1, contrast = 1, saturation = 1;
};

// torchvision's RandomResizedCrop.get_params algorithm (10 tries, then a centre crop with the
// ratio clamped), then flip, then jitter factors (brightness, contrast, saturation in this fixed
// order), drawing nothing for disabled parts.
ImageDraw DrawImageAugment(const ImageAugment& aug, int src_width, int src_height, SampleRng* rng);

// Resamples the box (x, y, w, h) of `in` to out_w x out_h with a triangle (bilinear) filter
// whose support widens when shrinking (antialiased, as PIL and torchvision's antialias=True),
// mirrored left-right when `flip`. Rounds to nearest.
void ResizeRgb(const RgbImage& in, int x, int y, int w, int h, bool flip, int out_w, int out_h,
               RgbImage* out);

// Mirrors left-right in place.
void FlipRgb(RgbImage* image);

// brightness: x * b; contrast: blend with the image's mean grey (ITU-R 601 luma) by c;
// saturation: blend with each pixel's grey by s; clamped to [0, 255] and rounded once at the end.
void ApplyColorJitter(const ImageDraw& draw, RgbImage* image);

// Writes `image` as the stream's output element: uint8 or float32 ((x / 255 - mean) / std),
// HWC or CHW. `dst` holds height * width * 3 elements of the output dtype.
void WriteImage(const RgbImage& image, const StreamSpec& spec, void* dst);

}  // namespace conveyor
