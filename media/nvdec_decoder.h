// NVDEC: frame-exact decoding of a stored H.264 or HEVC stream on an NVIDIA GPU's video engines,
// with the colour conversion, resize, crop and normalisation done by one CUDA kernel per frame that
// writes straight into device memory the caller owns (a slot of the device batch). No frame goes
// through host memory.
//
// NVCUVID is used directly (as torchcodec and SPDL do): the driver's libnvcuvid.so.1 and
// libcuda.so.1 are loaded at run time through FFmpeg's nv-codec-headers loader (Debian's
// libffmpeg-nvenc-dev), so this compiles and links without a driver and a process that never asks
// for NVDEC never loads them. Without CUDA or those headers at build time, or without a GPU, a
// driver or libnvcuvid at run time, NvdecUnavailable() says why and Create fails with that reason.
//
// Frame selection is the CPU path's (media/video_decoder.h): frame k of a FrameTable is the k-th
// shown frame in presentation order; packets are read with the same PacketReader, starting at the
// keyframe the table names; shown frames are matched by presentation timestamp. Pixels differ from
// libswscale's by the tolerance docs/nvdec.md states (measured by bench/nvdec_bench).
//
// The GPU backend of FrameDecoder (media/frame_decoder.h): its Decode copies the frames back to host
// memory for batches assembled there; DecodeToDevice writes them into the caller's device memory
// (DeviceFrames). What NVDEC cannot do is refused here, by the decoder, as FAILED_PRECONDITION
// naming it: codecs other than H.264 and HEVC, anything but 8-bit 4:2:0, a crop before the resize,
// a resize other than bilinear, a display rotation to apply. Whether a stream may be placed here
// at all (the GPU's decoder caps and sizes) is media/decode_placement.h's.
//
// One NvdecDecoder per thread (a decode session), like VideoDecoder; sessions on one GPU spread over
// its NVDEC engines (the driver places each session). docs/nvdec.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/format_fwd.h"
#include "media/decode_common.h"
#include "media/frame_decoder.h"

namespace conveyor {

// What one decoded frame becomes in device memory: the frame (display area, WxH) is resized to
// resize_width x resize_height (0: its own size) with an antialiased bilinear (triangle) filter,
// the window [crop_x, crop_x + width) x [crop_y, crop_y + height) of that is kept, and written as
// kHwcU8 (RGB, H x W x 3 bytes, what VideoDecoder returns) or kChwF32 ((v / 255 - mean) / std per
// channel, 3 x H x W float32: what a model takes).
struct GpuFrameOutput {
  enum class Layout { kHwcU8, kChwF32 };
  int width = 0;   // 0: the resized width (no crop)
  int height = 0;  // 0: the resized height
  int resize_width = 0;
  int resize_height = 0;
  int crop_x = 0;
  int crop_y = 0;
  Layout layout = Layout::kHwcU8;
  std::array<float, 3> mean = {0.f, 0.f, 0.f};
  std::array<float, 3> std = {1.f, 1.f, 1.f};
  // The stream's display rotation is to be applied (VideoOutput::autorotate): a stream shown
  // turned by a multiple of 90 degrees is then FAILED_PRECONDITION, since the kernel does not
  // rotate.
  bool autorotate = true;
};

// The kernel's output for a FrameDecoder request of `stream` (what NvdecDecoder::Decode decodes
// to): uint8 RGB HWC at `output`'s size, or FAILED_PRECONDITION naming what the kernel cannot do:
// a crop before the resize (VideoOutput::crop, the CPU backend's), a resize other than bilinear, a
// display rotation to apply. Pure: no GPU needed.
absl::StatusOr<GpuFrameOutput> NvdecOutputFor(const format::v1::StreamIndex& stream,
                                              const VideoOutput& output);

// What the GPU's decoder supports for one codec (cuvidGetDecoderCaps), 8-bit 4:2:0.
struct NvdecCaps {
  bool supported = false;
  int engines = 0;  // NVDEC engines that can decode it (nNumNVDECs)
  int min_width = 0, min_height = 0, max_width = 0, max_height = 0;
};

// Why NVDEC cannot be used on `device` in this process; empty when it can. Asked once per process
// and remembered; thread-safe. "built without CUDA", "built without nv-codec-headers", the CUDA
// driver's error, "libnvcuvid.so.1 could not be loaded", or no such device.
const std::string& NvdecUnavailable(int device = 0);

// The decoder's capabilities for `codec` ("h264", "hevc", "av1", FFmpeg names) on `device`;
// FAILED_PRECONDITION with NvdecUnavailable()'s reason; a codec NVCUVID has no name for is
// reported unsupported.
absl::StatusOr<NvdecCaps> QueryNvdecCaps(const std::string& codec, int device = 0);

class NvdecDecoder final : public FrameDecoder {
 public:
  // A session on `device`: retains its primary CUDA context (the one the CUDA runtime and PyTorch
  // use, so device pointers are shared) and creates its own CUDA stream.
  static absl::StatusOr<std::unique_ptr<NvdecDecoder>> Create(int device = 0);
  ~NvdecDecoder() override;
  NvdecDecoder(const NvdecDecoder&) = delete;
  NvdecDecoder& operator=(const NvdecDecoder&) = delete;

  // Decodes `frames` (indices into `table`, any order, repeats allowed) of `stream` and writes
  // entry i as described by `output` at `dst` + i * `dst_stride` bytes of device memory (on this
  // decoder's device). Work is ordered on stream(); the call returns when every frame is written.
  // Only 8-bit 4:2:0 H.264 and HEVC; anything else, or a rotation `output` would have applied, is
  // FAILED_PRECONDITION naming it (placement sends such streams to the CPU). `stream_key` lets
  // decoding continue without a seek when the next call asks for frames after the last one shown
  // (as VideoDecoder does). Errors name the frame or packet and why (a picture the engine flagged
  // corrupt is DATA_LOSS).
  absl::Status DecodeToDevice(uint64_t stream_key, const format::v1::StreamIndex& stream,
                              const FrameTable& table, PacketReader read,
                              std::span<const int64_t> frames, const GpuFrameOutput& output,
                              const DecodeLimits& limits, void* dst, size_t dst_stride);

  // FrameDecoder::Decode, for host batches (`decode: gpu`): DecodeToDevice's frames, as
  // NvdecOutputFor(stream, output) makes them, copied to host memory; entry i of `out` is frame
  // frames[i], uint8 RGB HWC, the layout VideoDecoder returns. The decoder keeps a device buffer
  // of the largest request.
  absl::Status Decode(uint64_t stream_key, const format::v1::StreamIndex& stream,
                      const FrameTable& table, PacketReader read, std::span<const int64_t> frames,
                      const VideoOutput& output, const DecodeLimits& limits,
                      std::vector<RgbImage>* out) override;
  // Bytes of one frame as `output` lays it out for a stream of width x height.
  static size_t FrameBytes(const GpuFrameOutput& output, int width, int height);

  void* stream() const;  // the CUDA stream (cudaStream_t / CUstream) the kernels run on
  int device() const;
  const FrameDecoderStats& stats() const override;

 private:
  struct Impl;
  explicit NvdecDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor
