#include "media/decode_backend.h"

#include "base/strings.h"
#include "device/gpu.h"

namespace conveyor {

std::string_view DecodeBackendName(DecodeBackend backend) {
  switch (backend) {
    case DecodeBackend::kAuto:
      return "auto";
    case DecodeBackend::kCpu:
      return "cpu";
    case DecodeBackend::kGpu:
      return "gpu";
  }
  return "auto";
}

const std::string& GpuDecodeUnavailable() {
  static const std::string reason = [] {
    const GpuProbe& probe = ProbeGpus();
    if (probe.devices == 0) return StrCat("no usable GPU: ", probe.reason);
    // A GPU is there, but nothing decodes on it yet: NVDEC through FFmpeg's cuda hwaccel is to be
    // written and tested on a GPU machine (issue 19 item 3).
    return std::string("this release has no NVDEC decoder yet (video decodes on the CPU)");
  }();
  return reason;
}

}  // namespace conveyor
