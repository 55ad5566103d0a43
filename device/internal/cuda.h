// CUDA plumbing for device/'s own files: RAII owners for every CUDA handle, one function that
// turns a cudaError_t into an absl::Status, the runtime's answer for the GPU probe, and the copy
// engine behind Uploader. Implemented in device/upload_cuda.cc, every call through the runtime
// device/internal/cudart.h loads at run time.
//
// INTERNAL header: it includes <cuda_runtime_api.h>. Include it only from device/'s .cc files (and
// the GPU tests and benchmarks), under `#if CONVEYOR_HAVE_CUDA`, never from a public header
// (device/upload.h and device/gpu.h hide all of it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/gpu.h"
#include "device/internal/cudart.h"

namespace conveyor::cuda {

// "<call>: <cudaGetErrorName>: <cudaGetErrorString>", with a code that fits: out of memory ->
// RESOURCE_EXHAUSTED; no device, no or old driver -> FAILED_PRECONDITION; invalid value or device
// -> INVALID_ARGUMENT; anything else INTERNAL. Also clears CUDA's last-error state.
absl::Status CudaError(cudaError_t error, std::string_view call);

// Returns from the current function with CudaError naming the call's source text.
#define CONVEYOR_CUDA_RETURN_IF_ERROR(call) CONVEYOR_CUDA_RETURN_IF_ERROR_AS(call, #call)

// The same for a call through the loaded runtime (device/internal/cudart.h), written without its
// prefix and named as CUDA spells it: CONVEYOR_CUDART_RETURN_IF_ERROR(Malloc(&p, n)) calls
// LoadedRuntime().Malloc and names "cudaMalloc(&p, n)".
#define CONVEYOR_CUDART_RETURN_IF_ERROR(call) \
  CONVEYOR_CUDA_RETURN_IF_ERROR_AS(::conveyor::cuda::LoadedRuntime().call, "cuda" #call)

#define CONVEYOR_CUDA_RETURN_IF_ERROR_AS(call, text)                  \
  do {                                                                 \
    const cudaError_t conveyor_cuda_error_ = (call);                   \
    if (conveyor_cuda_error_ != cudaSuccess) {                         \
      return ::conveyor::cuda::CudaError(conveyor_cuda_error_, text);  \
    }                                                                  \
  } while (0)

// Deleters ignore errors: they run in destructors, where there is nobody to tell. A handle was
// made through the loaded runtime, so they may use it.
struct StreamDeleter {
  void operator()(cudaStream_t s) const { LoadedRuntime().StreamDestroy(s); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const { LoadedRuntime().EventDestroy(e); }
};
struct DeviceMemoryDeleter {
  void operator()(void* p) const { LoadedRuntime().Free(p); }
};
struct PinnedMemoryDeleter {
  void operator()(void* p) const { LoadedRuntime().FreeHost(p); }
};

using UniqueStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using UniqueEvent = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
using UniqueDeviceMemory = std::unique_ptr<void, DeviceMemoryDeleter>;
using UniquePinnedMemory = std::unique_ptr<void, PinnedMemoryDeleter>;

// On the current device.
absl::StatusOr<UniqueStream> MakeStream(unsigned int flags);   // cudaStreamCreateWithFlags
absl::StatusOr<UniqueEvent> MakeEvent(unsigned int flags);     // cudaEventCreateWithFlags
absl::StatusOr<UniqueDeviceMemory> AllocDevice(size_t bytes);  // cudaMalloc
// cudaHostAlloc(cudaHostAllocPortable): pinned for every device.
absl::StatusOr<UniquePinnedMemory> AllocPinned(size_t bytes);

// What the CUDA runtime sees now (cudaGetDeviceCount), for device/gpu.h's ProbeGpus, which asks
// once and remembers; the first call loads the runtime. Never fails: no runtime library, no
// driver or no GPU gives devices = 0 and the reason (naming the library when it is absent).
GpuProbe ProbeRuntime();

// Makes a device current for its lifetime and then restores the caller's, so that library calls
// on the caller's thread leave the trainer's current device as it was.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  absl::Status Set(int device);

 private:
  int previous_ = -1;
};

// The GPU half of an Uploader: one device, one non-blocking stream, and per buffer slot a device
// allocation (grown as needed) and its events. The Uploader hands each slot to one owner at a
// time; calls for different slots may run concurrently (they share only the stream, and CUDA's
// stream calls are thread-safe).
class CopyEngine {
 public:
  static absl::StatusOr<std::unique_ptr<CopyEngine>> Create(int device, int slots);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  int device() const { return device_; }

  // Enqueues the copy of host[0, bytes) into the slot's device buffer (grown to fit first),
  // behind any use recorded with RecordUse, and returns the device buffer (nullptr when bytes is
  // 0) without waiting for the copy.
  absl::StatusOr<void*> Copy(int slot, const void* host, size_t bytes);
  // Blocks until the slot's last copy has finished; returns its GPU time in seconds.
  absl::StatusOr<double> Wait(int slot);
  // Recorded after the slot's last copy.
  cudaEvent_t ready_event(int slot) const { return slots_[slot].ready.get(); }
  // The next Copy into the slot waits (on the GPU) for the work enqueued on `stream` so far.
  absl::Status RecordUse(int slot, cudaStream_t stream);
  // Work enqueued on `stream` from now on waits (on the GPU) for the slot's last copy
  // (cudaStreamWaitEvent); the host does not wait.
  absl::Status OrderAfterCopy(int slot, cudaStream_t stream);

 private:
  struct Slot {
    UniqueDeviceMemory memory;
    size_t capacity = 0;
    UniqueEvent start;              // timing: recorded before the copy
    UniqueEvent ready;              // timing, blocking sync: recorded after the copy
    std::vector<UniqueEvent> uses;  // RecordUse events; uses_pending of them are live
    size_t uses_pending = 0;
  };
  explicit CopyEngine(int device) : device_(device) {}

  int device_;
  UniqueStream stream_;
  std::vector<Slot> slots_;
};

}  // namespace conveyor::cuda
