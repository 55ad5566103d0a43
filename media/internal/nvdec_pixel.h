// The per-pixel arithmetic of the NVDEC conversion kernel (media/nvdec_kernels.cu), shared with
// the host so that it is tested without a GPU (tests/nvdec_test.cc checks ConvertOnHost against
// the ffmpeg CLI's libswscale). NV12 in (luma plane, interleaved CbCr plane at half resolution),
// one RGB pixel out, resized by a triangle (bilinear) filter whose support grows with the
// downscale factor, cropped, as uint8 HWC or normalised float32 CHW. INTERNAL: media/ and tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "media/internal/nvdec_kernels.h"

#ifdef __CUDACC__
#define CONVEYOR_HD __host__ __device__
#else
#define CONVEYOR_HD
#endif

namespace conveyor::nvdec {

// The filtered value of one plane at (cx, cy) (plane coordinates of the sample centre), support
// (sx, sy) in plane pixels; `step` is 1 for luma, 2 for interleaved chroma (offset 0 Cb, 1 Cr).
CONVEYOR_HD inline float SamplePlane(const uint8_t* plane, int pitch, int w, int h, int step,
                                     int offset, float cx, float cy, float sx, float sy) {
  const int x0 = static_cast<int>(floorf(cx - sx)) + 1;
  const int x1 = static_cast<int>(floorf(cx + sx));
  const int y0 = static_cast<int>(floorf(cy - sy)) + 1;
  const int y1 = static_cast<int>(floorf(cy + sy));
  float sum = 0.f, wsum = 0.f;
  for (int y = y0; y <= y1; ++y) {
    const float wy = 1.f - fabsf(static_cast<float>(y) - cy) / sy;
    if (wy <= 0.f) continue;
    const int yy = y < 0 ? 0 : (y > h - 1 ? h - 1 : y);
    const uint8_t* row = plane + static_cast<size_t>(yy) * pitch;
    for (int x = x0; x <= x1; ++x) {
      const float wx = 1.f - fabsf(static_cast<float>(x) - cx) / sx;
      if (wx <= 0.f) continue;
      const int xx = x < 0 ? 0 : (x > w - 1 ? w - 1 : x);
      const float wgt = wx * wy;
      sum += wgt * static_cast<float>(row[xx * step + offset]);
      wsum += wgt;
    }
  }
  return wsum > 0.f ? sum / wsum : 0.f;
}

// Output pixel (ox, oy) of `p`, written to p.dst.
CONVEYOR_HD inline void ConvertPixel(const ConvertParams& p, int ox, int oy) {
  const float scale_x = static_cast<float>(p.src_width) / static_cast<float>(p.resize_width);
  const float scale_y = static_cast<float>(p.src_height) / static_cast<float>(p.resize_height);
  // The output pixel's centre in luma coordinates.
  const float cx = (static_cast<float>(ox + p.crop_x) + 0.5f) * scale_x - 0.5f;
  const float cy = (static_cast<float>(oy + p.crop_y) + 0.5f) * scale_y - 0.5f;
  const uint8_t* luma_plane = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(p.luma));
  const uint8_t* chroma = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(p.chroma));
  float luma, cb, cr;
  if (p.resize_width == p.src_width && p.resize_height == p.src_height) {
    // No resize: what libswscale's unscaled converter (the ffmpeg CLI's, so the CPU path's) does,
    // each chroma sample shared by its 2x2 luma pixels.
    const int x = ox + p.crop_x, y = oy + p.crop_y;
    luma = static_cast<float>(luma_plane[static_cast<size_t>(y) * p.pitch + x]);
    const uint8_t* c = chroma + static_cast<size_t>(y / 2) * p.pitch + (x / 2) * 2;
    cb = static_cast<float>(c[0]) - 128.f;
    cr = static_cast<float>(c[1]) - 128.f;
  } else {
    luma = SamplePlane(luma_plane, p.pitch, p.src_width, p.src_height, 1, 0, cx, cy,
                       scale_x > 1.f ? scale_x : 1.f, scale_y > 1.f ? scale_y : 1.f);
    // Chroma as libswscale scales it: the chroma plane resized by the same factor at its own
    // resolution, each resized chroma sample then shared by its 2x2 output pixels.
    const int cw = (p.src_width + 1) / 2, ch = (p.src_height + 1) / 2;
    const int jx = (ox + p.crop_x) / 2, jy = (oy + p.crop_y) / 2;
    const float ccx = (static_cast<float>(jx) + 0.5f) * scale_x - 0.5f;
    const float ccy = (static_cast<float>(jy) + 0.5f) * scale_y - 0.5f;
    const float csx = scale_x > 1.f ? scale_x : 1.f;
    const float csy = scale_y > 1.f ? scale_y : 1.f;
    cb = SamplePlane(chroma, p.pitch, cw, ch, 2, 0, ccx, ccy, csx, csy) - 128.f;
    cr = SamplePlane(chroma, p.pitch, cw, ch, 2, 1, ccx, ccy, csx, csy) - 128.f;
  }
  float yv, u, v;
  if (p.full_range) {
    yv = luma;
    u = cb;
    v = cr;
  } else {
    yv = (luma - 16.f) * (255.f / 219.f);
    u = cb * (255.f / 224.f);
    v = cr * (255.f / 224.f);
  }
  const float kg = 1.f - p.kr - p.kb;
  float rgb[3];
  rgb[0] = yv + 2.f * (1.f - p.kr) * v;
  rgb[1] = yv - (2.f * p.kb * (1.f - p.kb) / kg) * u - (2.f * p.kr * (1.f - p.kr) / kg) * v;
  rgb[2] = yv + 2.f * (1.f - p.kb) * u;
  for (int c = 0; c < 3; ++c) {
    const float clamped = rgb[c] < 0.f ? 0.f : (rgb[c] > 255.f ? 255.f : rgb[c]);
    rgb[c] = floorf(clamped + 0.5f);  // the 8-bit value; the float layout normalises it
  }
  const size_t at = static_cast<size_t>(oy) * p.out_width + ox;
  if (p.layout == 0) {
    uint8_t* out = static_cast<uint8_t*>(p.dst) + at * 3;
    for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(rgb[c]);
  } else {
    float* out = static_cast<float*>(p.dst);
    const size_t plane = static_cast<size_t>(p.out_width) * p.out_height;
    for (int c = 0; c < 3; ++c) out[c * plane + at] = (rgb[c] * (1.f / 255.f) - p.mean[c]) * p.inv_std[c];
  }
}

// Every pixel of `p` on the host (p.luma, p.chroma and p.dst host addresses): what the kernel
// computes, for tests and for checking a frame without a GPU.
inline void ConvertOnHost(const ConvertParams& p) {
  for (int y = 0; y < p.out_height; ++y) {
    for (int x = 0; x < p.out_width; ++x) ConvertPixel(p, x, y);
  }
}

}  // namespace conveyor::nvdec
