#include "sample/augment.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/mix.h"

namespace conveyor {

namespace {

uint8_t ToByte(float v) {
  v = std::floor(v + 0.5f);
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Triangle-filter taps for one axis: output i covers source [start + i*scale, start + (i+1)*scale).
struct Taps {
  std::vector<int> first;
  std::vector<int> count;
  std::vector<float> weight;  // count[i] weights per output, at stride `max_taps`
  int max_taps = 0;
};

Taps MakeTaps(int src_limit, int start, int len, int out) {
  Taps t;
  const double scale = static_cast<double>(len) / out;
  const double support = std::max(1.0, scale);  // filter radius in source pixels
  t.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out);
  t.count.resize(out);
  t.weight.assign(static_cast<size_t>(out) * t.max_taps, 0.0f);
  for (int i = 0; i < out; ++i) {
    const double center = start + (i + 0.5) * scale;
    int lo = static_cast<int>(std::floor(center - support));
    int hi = static_cast<int>(std::ceil(center + support));
    lo = std::max(lo, 0);
    hi = std::min(hi, src_limit);
    double sum = 0;
    std::vector<double> w;
    for (int x = lo; x < hi; ++x) {
      const double d = std::fabs((x + 0.5 - center) / support);
      w.push_back(d < 1 ? 1 - d : 0);
      sum += w.back();
    }
    // Trim zero taps at both ends.
    int a = 0, b = static_cast<int>(w.size());
    while (a < b && w[a] == 0) ++a;
    while (b > a && w[b - 1] == 0) --b;
    if (a == b) {  // degenerate: nearest pixel
      const int x = std::clamp(static_cast<int>(center), 0, src_limit - 1);
      t.first[i] = x;
      t.count[i] = 1;
      t.weight[static_cast<size_t>(i) * t.max_taps] = 1.0f;
      continue;
    }
    t.first[i] = lo + a;
    t.count[i] = std::min(b - a, t.max_taps);
    for (int k = 0; k < t.count[i]; ++k) {
      t.weight[static_cast<size_t>(i) * t.max_taps + k] = static_cast<float>(w[a + k] / sum);
    }
  }
  return t;
}

}  // namespace

SampleRng::SampleRng(uint64_t seed, uint64_t epoch, uint64_t sample, uint64_t stream) {
  uint64_t h = Mix64(seed ^ 0x436f6e7665796f72ull);  // "Conveyor"
  h = Mix64(h ^ epoch);
  h = Mix64(h ^ sample);
  h = Mix64(h ^ stream);
  state_ = h;
}

uint64_t SampleRng::Next() {
  const uint64_t z = state_;
  state_ += 0x9e3779b97f4a7c15ull;
  return Mix64(z);  // splitmix64: Mix64 adds the same increment first
}

double SampleRng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int64_t SampleRng::UniformInt(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(Next() % span);  // bias < span / 2^64: negligible
}

ImageDraw DrawImageAugment(const ImageAugment& aug, int src_width, int src_height,
                           SampleRng* rng) {
  ImageDraw d;
  d.w = src_width;
  d.h = src_height;
  if (aug.crop) {
    const RandomResizedCrop& c = *aug.crop;
    d.crop = true;
    const double area = static_cast<double>(src_width) * src_height;
    const double log_lo = std::log(c.ratio_min), log_hi = std::log(c.ratio_max);
    bool found = false;
    for (int attempt = 0; attempt < 10 && !found; ++attempt) {
      const double target = area * rng->Uniform(c.scale_min, c.scale_max);
      const double ratio = std::exp(rng->Uniform(log_lo, log_hi));
      const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
      const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
      if (w > 0 && h > 0 && w <= src_width && h <= src_height) {
        d.y = static_cast<int>(rng->UniformInt(0, src_height - h));
        d.x = static_cast<int>(rng->UniformInt(0, src_width - w));
        d.w = w;
        d.h = h;
        found = true;
      }
    }
    if (!found) {  // centre crop at the nearest allowed ratio
      const double in_ratio = static_cast<double>(src_width) / src_height;
      int w = src_width, h = src_height;
      if (in_ratio < c.ratio_min) {
        h = static_cast<int>(std::lround(w / c.ratio_min));
      } else if (in_ratio > c.ratio_max) {
        w = static_cast<int>(std::lround(h * c.ratio_max));
      }
      d.w = std::clamp(w, 1, src_width);
      d.h = std::clamp(h, 1, src_height);
      d.x = (src_width - d.w) / 2;
      d.y = (src_height - d.h) / 2;
    }
  }
  if (aug.hflip > 0) d.flip = rng->Uniform() < aug.hflip;
  const ColorJitter& j = aug.jitter;
  if (j.brightness > 0) d.brightness = static_cast<float>(rng->Uniform(1 - j.brightness, 1 + j.brightness));
  if (j.contrast > 0) d.contrast = static_cast<float>(rng->Uniform(1 - j.contrast, 1 + j.contrast));
  if (j.saturation > 0) d.saturation = static_cast<float>(rng->Uniform(1 - j.saturation, 1 + j.saturation));
  return d;
}

void ResizeRgb(const RgbImage& in, int x, int y, int w, int h, bool flip, int out_w, int out_h,
               RgbImage* out) {
  const Taps tx = MakeTaps(in.width, x, w, out_w);
  const Taps ty = MakeTaps(in.height, y, h, out_h);
  // Rows of the source the vertical pass reads.
  int row_lo = in.height, row_hi = 0;
  for (int i = 0; i < out_h; ++i) {
    row_lo = std::min(row_lo, ty.first[i]);
    row_hi = std::max(row_hi, ty.first[i] + ty.count[i]);
  }
  const size_t row_floats = static_cast<size_t>(out_w) * 3;
  std::vector<float> tmp(static_cast<size_t>(std::max(0, row_hi - row_lo)) * row_floats);
  for (int r = row_lo; r < row_hi; ++r) {
    const uint8_t* src = &in.pixels[static_cast<size_t>(r) * in.width * 3];
    float* dst = &tmp[static_cast<size_t>(r - row_lo) * row_floats];
    for (int i = 0; i < out_w; ++i) {
      const float* wt = &tx.weight[static_cast<size_t>(i) * tx.max_taps];
      float acc[3] = {0, 0, 0};
      for (int k = 0; k < tx.count[i]; ++k) {
        const uint8_t* p = src + static_cast<size_t>(tx.first[i] + k) * 3;
        acc[0] += wt[k] * p[0];
        acc[1] += wt[k] * p[1];
        acc[2] += wt[k] * p[2];
      }
      const int o = flip ? out_w - 1 - i : i;
      dst[o * 3] = acc[0];
      dst[o * 3 + 1] = acc[1];
      dst[o * 3 + 2] = acc[2];
    }
  }
  out->width = out_w;
  out->height = out_h;
  out->pixels.resize(static_cast<size_t>(out_w) * out_h * 3);
  for (int j = 0; j < out_h; ++j) {
    const float* wt = &ty.weight[static_cast<size_t>(j) * ty.max_taps];
    uint8_t* dst = &out->pixels[static_cast<size_t>(j) * row_floats];
    for (size_t c = 0; c < row_floats; ++c) {
      float acc = 0;
      for (int k = 0; k < ty.count[j]; ++k) {
        acc += wt[k] * tmp[static_cast<size_t>(ty.first[j] + k - row_lo) * row_floats + c];
      }
      dst[c] = ToByte(acc);
    }
  }
}

void FlipRgb(RgbImage* image) {
  for (int y = 0; y < image->height; ++y) {
    uint8_t* row = &image->pixels[static_cast<size_t>(y) * image->width * 3];
    for (int a = 0, b = image->width - 1; a < b; ++a, --b) {
      std::swap(row[a * 3], row[b * 3]);
      std::swap(row[a * 3 + 1], row[b * 3 + 1]);
      std::swap(row[a * 3 + 2], row[b * 3 + 2]);
    }
  }
}

void ApplyColorJitter(const ImageDraw& d, RgbImage* image) {
  if (d.brightness == 1 && d.contrast == 1 && d.saturation == 1) return;
  const size_t n = static_cast<size_t>(image->width) * image->height;
  std::vector<float> px(n * 3);
  for (size_t i = 0; i < n * 3; ++i) px[i] = image->pixels[i] * d.brightness;
  auto clamp = [](float v) { return v < 0 ? 0.f : (v > 255 ? 255.f : v); };
  for (float& v : px) v = clamp(v);
  if (d.contrast != 1) {
    double sum = 0;  // mean grey of the (brightened) image
    for (size_t i = 0; i < n; ++i) {
      sum += 0.299f * px[i * 3] + 0.587f * px[i * 3 + 1] + 0.114f * px[i * 3 + 2];
    }
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    for (float& v : px) v = clamp(d.contrast * v + (1 - d.contrast) * mean);
  }
  if (d.saturation != 1) {
    for (size_t i = 0; i < n; ++i) {
      float* p = &px[i * 3];
      const float grey = 0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2];
      for (int c = 0; c < 3; ++c) p[c] = clamp(d.saturation * p[c] + (1 - d.saturation) * grey);
    }
  }
  for (size_t i = 0; i < n * 3; ++i) image->pixels[i] = ToByte(px[i]);
}

void WriteImage(const RgbImage& image, const StreamSpec& spec, void* dst) {
  const size_t hw = static_cast<size_t>(image.width) * image.height;
  const uint8_t* src = image.pixels.data();
  if (spec.dtype == ImageDType::kUint8) {
    uint8_t* out = static_cast<uint8_t*>(dst);
    if (spec.layout == ImageLayout::kHWC) {
      std::memcpy(out, src, hw * 3);
    } else {
      for (size_t i = 0; i < hw; ++i) {
        out[i] = src[i * 3];
        out[hw + i] = src[i * 3 + 1];
        out[2 * hw + i] = src[i * 3 + 2];
      }
    }
    return;
  }
  float* out = static_cast<float*>(dst);
  float scale[3], bias[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * spec.std[c]);
    bias[c] = -spec.mean[c] / spec.std[c];
  }
  for (size_t i = 0; i < hw; ++i) {
    for (int c = 0; c < 3; ++c) {
      const float v = src[i * 3 + c] * scale[c] + bias[c];
      if (spec.layout == ImageLayout::kHWC) {
        out[i * 3 + c] = v;
      } else {
        out[c * hw + i] = v;
      }
    }
  }
}

}  // namespace conveyor
