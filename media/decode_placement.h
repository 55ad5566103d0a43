// Where one video stream's frames are decoded when its spec says `decode: auto` (or `gpu`): NVDEC
// or the CPU, by codec, pixel format, frame size and this host's measured throughput of both
// (issue 32 item 3). A pure function of what it is given, so it is tested without a GPU; the
// facts about this process come from ProbeNvdecHost().
//
// The order of the rules, first match wins:
//   `decode: cpu`                                            -> CPU
//   NVDEC unusable here (no GPU, driver, libnvcuvid)          -> CPU, with that reason
//   the GPU's decoder lacks the codec (AV1 on Hopper), or the NVDEC path has no decoder for it
//                                                            -> CPU
//   not 8-bit 4:2:0 (yuv420p, yuvj420p, nv12)                 -> CPU
//   frames outside the decoder's sizes (under 48x16 for H.264, 144x144 for HEVC on the H200)
//                                                            -> CPU
//   both rates measured at this size and NVDEC's not higher  -> CPU
//   otherwise                                                -> NVDEC
// Host batches under `decode: auto` stay on the CPU (ChooseDecodeBackend, media/decode_backend.h);
// a `decode: gpu` stream is checked against these rules where its pipeline opens (NvdecRefusal);
// nvdec_bench reports the placement it measures. docs/nvdec.md "Placement".
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "media/decode_backend.h"
#include "media/frame_decoder.h"
#include "media/nvdec_decoder.h"

namespace conveyor {

struct VideoStreamInfo {
  std::string codec;    // FFmpeg's name: "h264", "hevc", "av1", ...
  std::string pix_fmt;  // FFmpeg's name: "yuv420p", "yuv420p10le", ...
  int width = 0;
  int height = 0;
};

struct NvdecHost {
  std::string unavailable;                // why NVDEC cannot be used; empty when it can
  std::map<std::string, NvdecCaps> caps;  // by codec, from cuvidGetDecoderCaps
  // Decoded frames/s of this host at the stream's size (0: not measured): every CPU core, and
  // every NVDEC engine of the GPU.
  double cpu_frames_per_s = 0;
  double nvdec_frames_per_s = 0;
};

struct Placement {
  DecodeBackend where = DecodeBackend::kCpu;  // kCpu or kGpu
  std::string reason;                          // one line, for the log and errors
};

Placement PlaceVideoStream(const VideoStreamInfo& stream, DecodeBackend asked, const NvdecHost& host);

// This process's NVDEC on `device`: NvdecUnavailable()'s reason and the caps of h264, hevc, av1
// and vp9; no rates. Asked once and remembered; thread-safe.
const NvdecHost& ProbeNvdecHost(int device = 0);

// Whether a stream that asks for NVDEC (`decode: gpu`) can be decoded on it in this process:
// OK, or FAILED_PRECONDITION saying why and what to write instead: NVDEC unusable here
// (GpuDecodeUnavailable), a rule of PlaceVideoStream on this host's decoder caps (codec, pixel
// format, size), or a resize (`resized`: the spec gives an output size) with a filter other than
// bilinear, the kernel's only one. Probes the GPU once per process, so it is asked where a
// pipeline opens, never while a config is parsed.
absl::Status NvdecRefusal(const VideoStreamInfo& stream, bool resized, ResizeFilter filter);

// Logs `placement` for `stream_name` at info level, once per process for each distinct
// (codec, pixel format, size, where, reason). Thread-safe.
void LogPlacementOnce(std::string_view stream_name, const VideoStreamInfo& stream,
                      const Placement& placement);

}  // namespace conveyor
