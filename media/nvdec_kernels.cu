// NV12 -> RGB with resize, crop and normalisation, one thread per output pixel (docs/nvdec.md).
//
// Resizing is a triangle (bilinear) filter whose support grows with the downscale factor, so a
// 1280x720 frame shrunk to 224 averages every source pixel instead of sampling a few (what
// libswscale's bilinear does too); at scale 1 it is the identity on luma. Chroma sits as H.264 and
// HEVC put it by default (4:2:0, left: co-sited horizontally with even luma columns, centred
// between luma rows) and is interpolated with the same filter at its own resolution. Y'CbCr to
// R'G'B' uses the stream's matrix and range, as libswscale does on the CPU path.
#include <cuda_runtime.h>

#include <cstdint>

#include "media/internal/nvdec_kernels.h"

namespace conveyor::nvdec {
namespace {

// The filtered value of one plane at (cx, cy) (plane coordinates of the sample centre), support
// (sx, sy) in plane pixels; `step` is 1 for luma, 2 for interleaved chroma (offset 0 Cb, 1 Cr).
__device__ float Sample(const uint8_t* plane, int pitch, int w, int h, int step, int offset,
                        float cx, float cy, float sx, float sy) {
  const int x0 = static_cast<int>(floorf(cx - sx)) + 1;
  const int x1 = static_cast<int>(floorf(cx + sx));
  const int y0 = static_cast<int>(floorf(cy - sy)) + 1;
  const int y1 = static_cast<int>(floorf(cy + sy));
  float sum = 0.f, wsum = 0.f;
  for (int y = y0; y <= y1; ++y) {
    const float wy = 1.f - fabsf(static_cast<float>(y) - cy) / sy;
    if (wy <= 0.f) continue;
    const int yy = min(max(y, 0), h - 1);
    const uint8_t* row = plane + static_cast<size_t>(yy) * pitch;
    for (int x = x0; x <= x1; ++x) {
      const float wx = 1.f - fabsf(static_cast<float>(x) - cx) / sx;
      if (wx <= 0.f) continue;
      const int xx = min(max(x, 0), w - 1);
      const float wgt = wx * wy;
      sum += wgt * static_cast<float>(row[xx * step + offset]);
      wsum += wgt;
    }
  }
  return wsum > 0.f ? sum / wsum : 0.f;
}

__global__ void ConvertKernel(ConvertParams p) {
  const int ox = blockIdx.x * blockDim.x + threadIdx.x;
  const int oy = blockIdx.y * blockDim.y + threadIdx.y;
  if (ox >= p.out_width || oy >= p.out_height) return;
  const float scale_x = static_cast<float>(p.src_width) / p.resize_width;
  const float scale_y = static_cast<float>(p.src_height) / p.resize_height;
  // The output pixel's centre in luma coordinates.
  const float cx = (static_cast<float>(ox + p.crop_x) + 0.5f) * scale_x - 0.5f;
  const float cy = (static_cast<float>(oy + p.crop_y) + 0.5f) * scale_y - 0.5f;
  const float luma = Sample(reinterpret_cast<const uint8_t*>(p.luma), p.pitch, p.src_width,
                            p.src_height, 1, 0, cx, cy, fmaxf(scale_x, 1.f), fmaxf(scale_y, 1.f));
  const int cw = (p.src_width + 1) / 2, ch = (p.src_height + 1) / 2;
  const float ccx = cx * 0.5f, ccy = (cy - 0.5f) * 0.5f;
  const float csx = fmaxf(scale_x * 0.5f, 1.f), csy = fmaxf(scale_y * 0.5f, 1.f);
  const uint8_t* chroma = reinterpret_cast<const uint8_t*>(p.chroma);
  const float cb = Sample(chroma, p.pitch, cw, ch, 2, 0, ccx, ccy, csx, csy) - 128.f;
  const float cr = Sample(chroma, p.pitch, cw, ch, 2, 1, ccx, ccy, csx, csy) - 128.f;
  float yv, u, v;
  if (p.full_range) {
    yv = luma; u = cb; v = cr;
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
  if (p.layout == 0) {
    uint8_t* out = static_cast<uint8_t*>(p.dst) + (static_cast<size_t>(oy) * p.out_width + ox) * 3;
    for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(fminf(fmaxf(rgb[c], 0.f), 255.f) + 0.5f);
  } else {
    float* out = static_cast<float*>(p.dst);
    const size_t plane = static_cast<size_t>(p.out_width) * p.out_height;
    const size_t at = static_cast<size_t>(oy) * p.out_width + ox;
    for (int c = 0; c < 3; ++c) {
      // Rounded to the 8-bit value first, so a float batch equals the uint8 one normalised.
      const float v8 = floorf(fminf(fmaxf(rgb[c], 0.f), 255.f) + 0.5f);
      out[c * plane + at] = (v8 * (1.f / 255.f) - p.mean[c]) * p.inv_std[c];
    }
  }
}

}  // namespace

const char* LaunchConvert(const ConvertParams& p, void* stream) {
  const dim3 block(32, 8);
  const dim3 grid((p.out_width + block.x - 1) / block.x, (p.out_height + block.y - 1) / block.y);
  ConvertKernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(p);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorName(err);
}

}  // namespace conveyor::nvdec
