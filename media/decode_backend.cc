#include "media/decode_backend.h"

#include <mutex>

#include "base/strings.h"
#include "device/gpu.h"
#include "media/nvdec_decoder.h"
#include "spdlog/spdlog.h"

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

DecodeBackend ChooseDecodeBackend(DecodeBackend asked, DecodeSite site) {
  if (asked != DecodeBackend::kAuto) return asked;
  // Host batches must be the same bits on every server of a job, and NVDEC's frames are not
  // libswscale's: the host a stream lands on never picks the GPU for it. In the trainer's own
  // process nothing is compared across machines, and NVDEC is what DeviceFrames is for.
  return site == DecodeSite::kHostBatches ? DecodeBackend::kCpu : DecodeBackend::kGpu;
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

void LogAutoDecodeOnce(std::string_view stream, std::string_view where) {
  static std::once_flag logged;
  std::call_once(logged, [&] {
    const std::string& unavailable = GpuDecodeUnavailable();
    if (unavailable.empty()) {
      spdlog::info("decode: auto: served batches decode video on the CPU, the same bits on every "
                   "server; decode: gpu puts a stream on NVDEC (its own bits, docs/nvdec.md); "
                   "first asked for by {} at {}", stream, where);
    } else {
      spdlog::info("decode: auto: video streams decode on the CPU here ({}); first asked for by {} at {}",
                   unavailable, stream, where);
    }
  });
}

}  // namespace conveyor
