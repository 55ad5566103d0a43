#include "media/decode_backend.h"

#include "base/strings.h"
#include "device/gpu.h"
#include "media/nvdec_decoder.h"

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
    if (const std::string& why = NvdecUnavailable(0); !why.empty()) return StrCat("NVDEC: ", why);
    // NVDEC decodes here (media/nvdec_decoder.h, bench/nvdec_bench), but the sample pipeline does
    // not yet place device frames into served batches (issue 32 items 3 and 4).
    return std::string("NVDEC works on this machine, but served batches do not take GPU-decoded "
                       "frames in this release (video decodes on the CPU)");
  }();
  return reason;
}

}  // namespace conveyor
