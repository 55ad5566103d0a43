// Where a video stream is decoded: the per-stream `decode` key of a sample spec
// (sample/sample_spec.h, docs/sampling.md "Where video is decoded").
//
// This is the seam for NVDEC (H.264 and HEVC through FFmpeg's cuda hwaccel, issue 19 item 3): the
// choice is parsed, checked and resolved here, while every video stream is still decoded on the
// CPU by libavcodec (media/video_decoder.h). No NVDEC code exists yet: it is to be written and
// tested on a GPU machine.
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
// reason (device/gpu.h: built without CUDA, or the CUDA runtime's error), and with one it says
// that the NVDEC path is not in this release.
const std::string& GpuDecodeUnavailable();

}  // namespace conveyor
