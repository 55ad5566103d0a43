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
    return std::string();
  }();
  return reason;
}

}  // namespace conveyor
