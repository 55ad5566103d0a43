// device/gpu.h: through the CUDA runtime when the build has it, else the answers of a machine
// without a GPU.
#include "device/gpu.h"

#include "base/strings.h"

#if CONVEYOR_HAVE_CUDA
#include "device/internal/cuda.h"
#endif

namespace conveyor {

const GpuProbe& ProbeGpus() {
  // Function-local static: asked once, thread-safe, and never before the first use.
  static const GpuProbe probe = [] {
    GpuProbe p;
#if CONVEYOR_HAVE_CUDA
    p = cuda::ProbeRuntime();
#else
    p.reason = "built without CUDA (CONVEYOR_CUDA=OFF, or no CUDA toolkit when it was built)";
#endif
    return p;
  }();
  return probe;
}

absl::StatusOr<void*> AllocatePinned(size_t bytes, int device) {
  const GpuProbe& probe = ProbeGpus();
  if (probe.devices == 0) {
    return absl::FailedPreconditionError(
        StrCat("pinned host memory of ", bytes, " bytes: no usable GPU: ", probe.reason));
  }
#if CONVEYOR_HAVE_CUDA
  cuda::ScopedDevice scoped;
  if (device >= 0) {
    if (absl::Status s = scoped.Set(device); !s.ok()) return s;
  }
  absl::StatusOr<cuda::UniquePinnedMemory> memory = cuda::AllocPinned(bytes);
  if (!memory.ok()) return memory.status();
  return memory->release();
#else
  (void)device;
  return nullptr;  // unreachable: without CUDA the probe finds no device
#endif
}

void FreePinned(void* p) {
#if CONVEYOR_HAVE_CUDA
  cuda::PinnedMemoryDeleter()(p);
#else
  (void)p;
#endif
}

}  // namespace conveyor
