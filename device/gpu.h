// What this process's CUDA runtime offers, and page-locked (pinned) host memory, without CUDA
// types: whoever includes this needs no toolkit on its include path. Built without CUDA, there is
// never a GPU and the reason says so. CUDA itself is behind device/internal/cuda.h.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace conveyor {

struct GpuProbe {
  // Usable CUDA devices: 0 when the build has no CUDA, or the machine no driver or no GPU.
  int devices = 0;
  // Why devices == 0: "built without CUDA (...)", or the CUDA runtime's own error
  // ("cudaGetDeviceCount: cudaErrorNoDevice: ..."). Empty when there is a device.
  std::string reason;
};

// Asked once per process (cudaGetDeviceCount) and remembered; never fails. A program that never
// calls it (nor allocates pinned memory nor uploads) never initializes the CUDA runtime.
// Thread-safe.
const GpuProbe& ProbeGpus();

// `bytes` of page-locked host memory, pinned for every device (cudaHostAlloc, portable), so that
// copies from it to a GPU run asynchronously. `device` >= 0 is made current for the call (and the
// caller's restored), so a thread that never chose a device does not create a context on device 0;
// -1 allocates on the caller's current device. FAILED_PRECONDITION without a usable GPU (the
// probe's reason); RESOURCE_EXHAUSTED (with CUDA's message) when the driver refuses, as it does
// past RLIMIT_MEMLOCK in many containers. Free with FreePinned. Thread-safe.
absl::StatusOr<void*> AllocatePinned(size_t bytes, int device = -1);
void FreePinned(void* p);

}  // namespace conveyor
