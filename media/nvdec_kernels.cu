// NV12 -> RGB with resize, crop and normalisation, one thread per output pixel (docs/nvdec.md).
// The arithmetic is media/internal/nvdec_pixel.h's, which the host runs too (tests/nvdec_test.cc).
#include <cuda_runtime.h>

#include <cstdint>

#include "media/internal/nvdec_kernels.h"
#include "media/internal/nvdec_pixel.h"

namespace conveyor::nvdec {
namespace {

__global__ void ConvertKernel(ConvertParams p) {
  const int ox = blockIdx.x * blockDim.x + threadIdx.x;
  const int oy = blockIdx.y * blockDim.y + threadIdx.y;
  if (ox >= p.out_width || oy >= p.out_height) return;
  ConvertPixel(p, ox, oy);
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
