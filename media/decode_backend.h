// Where a video stream is decoded: the per-stream `decode` key of a sample spec
// (sample/sample_spec.h, docs/sampling.md "Where video is decoded").
//
// Served batches decode a stream on NVDEC (media/nvdec_decoder.h: H.264 and HEVC through NVCUVID,
// copied back to the batch) only when its spec says `gpu`; `auto` and `cpu` decode on the CPU
// with libavcodec, so the batches are the same bits on every server whatever GPUs it has.
// DeviceFrames (pipeline/device_frames.h), which decodes in the trainer's process straight into
// its device batch, takes `auto` and `gpu` as NVDEC.
#pragma once

#include <string>
#include <string_view>

namespace conveyor {

enum class DecodeBackend {
  // Served batches: the CPU, the same bits on every server (said once per process on the log).
  // DeviceFrames: NVDEC. The default.
  kAuto,
  // libavcodec on the CPU: the frames every release so far produced, bit for bit.
  kCpu,
  // NVDEC, or nothing: a stream that asks for it where it cannot be decoded on this host's GPU
  // (no GPU or NVDEC, a codec, pixel format or size its decoder lacks, a resize other than
  // bilinear) fails when its spec is read, naming the stream and why. Its pixels are NVDEC's and
  // the kernel's (docs/nvdec.md "Pixel tolerance"), not libswscale's.
  kGpu,
};

std::string_view DecodeBackendName(DecodeBackend backend);  // "auto", "cpu", "gpu"

// Why video cannot be decoded on the GPU in this process; empty when it can (a GPU, its driver
// and libnvcuvid: device/gpu.h, NvdecUnavailable()). Asked once and remembered; thread-safe.
const std::string& GpuDecodeUnavailable();

}  // namespace conveyor
