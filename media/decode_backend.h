// Where a video stream is decoded: the per-stream `decode` key of a sample spec
// (sample/sample_spec.h, docs/sampling.md "Where video is decoded").
//
// This is the seam for NVDEC (media/nvdec_decoder.h: H.264 and HEVC through NVCUVID): the choice
// is parsed, checked and resolved here, while every video stream of a served batch is still
// decoded on the CPU by libavcodec (media/video_decoder.h): placing NVDEC frames into the batch is
// issue 32 items 3 and 4.
#pragma once

#include <string>
#include <string_view>

namespace conveyor {

enum class DecodeBackend {
  // The GPU for what it can decode (H.264, HEVC), the CPU for the rest and wherever there is no
  // GPU decoder, said once per process on the log. The default.
  kAuto,
  // libavcodec on the CPU: the frames every release so far produced, bit for bit.
  kCpu,
  // The GPU or nothing: a stream that asks for it where video cannot be decoded on the GPU fails
  // when its spec is read (at the start of a stream or run), naming the stream and why.
  kGpu,
};

std::string_view DecodeBackendName(DecodeBackend backend);  // "auto", "cpu", "gpu"

// Why video cannot be decoded on the GPU in this process; empty when it can. Asked once and
// remembered; thread-safe. In this release it is never empty: without a usable GPU it is that
// reason (device/gpu.h: built without CUDA, or the CUDA runtime's error), without NVDEC
// NvdecUnavailable()'s, and with both it says that served batches do not take NVDEC frames yet.
const std::string& GpuDecodeUnavailable();

}  // namespace conveyor
