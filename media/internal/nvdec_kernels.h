// The CUDA kernel behind NvdecDecoder (media/nvdec_kernels.cu): one NV12 surface in, one frame of
// the device batch out. Plain types only, so media/nvdec_decoder.cc includes it without the CUDA
// toolkit's headers. INTERNAL: only media/'s files include it.
#pragma once

#include <cstdint>

namespace conveyor::nvdec {

struct ConvertParams {
  uint64_t luma = 0;    // device address of the NV12 luma plane
  uint64_t chroma = 0;  // device address of the interleaved CbCr plane (half height)
  int pitch = 0;        // bytes per row of both planes
  int src_width = 0, src_height = 0;        // the displayed frame
  int resize_width = 0, resize_height = 0;  // the frame resized to this (before the crop)
  int crop_x = 0, crop_y = 0;
  int out_width = 0, out_height = 0;
  int layout = 0;  // 0: RGB HWC uint8; 1: CHW float32, (v / 255 - mean) * inv_std
  float mean[3] = {0, 0, 0};
  float inv_std[3] = {1, 1, 1};
  // Y'CbCr -> R'G'B': the matrix's Kr and Kb, and whether the samples use the full 0-255 range.
  float kr = 0.299f, kb = 0.114f;
  bool full_range = false;
  void* dst = nullptr;
};

// Enqueues the conversion on `stream` (a cudaStream_t); returns the CUDA error's name, or nullptr.
const char* LaunchConvert(const ConvertParams& p, void* stream);

}  // namespace conveyor::nvdec
