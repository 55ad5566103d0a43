// The CUDA half of device/upload.h and device/gpu.h (see device/internal/cuda.h). Host code only,
// no kernels: compiled as C++ against the toolkit's headers, every call through the runtime
// loaded at run time (device/internal/cudart.h), so nothing that links device/ needs libcudart.
// Compiled only when CONVEYOR_HAVE_CUDA.
#include "device/internal/cuda.h"

#include <utility>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::cuda {

namespace {

// Device buffers grow in steps of this, so batches whose sizes wobble a little (variable-length
// text, padding) do not reallocate each time.
constexpr size_t kDeviceGrowth = size_t{1} << 20;

size_t RoundUp(size_t n, size_t step) { return (n + step - 1) / step * step; }

}  // namespace

absl::Status CudaError(cudaError_t error, std::string_view call) {
  // Error strings come from the runtime itself, so they need no driver or device.
  const Runtime& rt = LoadedRuntime();
  const std::string message =
      StrCat(call, ": ", rt.GetErrorName(error), ": ", rt.GetErrorString(error));
  // Non-sticky errors would otherwise be reported again by the next cudaGetLastError.
  rt.GetLastError();
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<UniqueStream> MakeStream(unsigned int flags) {
  cudaStream_t stream = nullptr;
  CONVEYOR_CUDART_RETURN_IF_ERROR(StreamCreateWithFlags(&stream, flags));
  return UniqueStream(stream);
}

absl::StatusOr<UniqueEvent> MakeEvent(unsigned int flags) {
  cudaEvent_t event = nullptr;
  CONVEYOR_CUDART_RETURN_IF_ERROR(EventCreateWithFlags(&event, flags));
  return UniqueEvent(event);
}

absl::StatusOr<UniqueDeviceMemory> AllocDevice(size_t bytes) {
  void* p = nullptr;
  const cudaError_t error = LoadedRuntime().Malloc(&p, bytes);
  if (error != cudaSuccess) return CudaError(error, StrCat("cudaMalloc of ", bytes, " bytes"));
  return UniqueDeviceMemory(p);
}

absl::StatusOr<UniquePinnedMemory> AllocPinned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t error = LoadedRuntime().HostAlloc(&p, bytes, cudaHostAllocPortable);
  if (error != cudaSuccess) return CudaError(error, StrCat("cudaHostAlloc of ", bytes, " bytes"));
  return UniquePinnedMemory(p);
}

GpuProbe ProbeRuntime() {
  GpuProbe p;
  if (absl::StatusOr<const Runtime*> runtime = LoadRuntime(); !runtime.ok()) {
    p.reason = std::string(runtime.status().message());
    return p;
  }
  int count = 0;
  const cudaError_t error = LoadedRuntime().GetDeviceCount(&count);
  if (error != cudaSuccess) {
    p.reason = std::string(CudaError(error, "cudaGetDeviceCount").message());
    count = 0;
  } else if (count == 0) {
    p.reason = "cudaGetDeviceCount: no CUDA device";
  }
  p.devices = count;
  return p;
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) LoadedRuntime().SetDevice(previous_);
}

absl::Status ScopedDevice::Set(int device) {
  int current = 0;
  CONVEYOR_CUDART_RETURN_IF_ERROR(GetDevice(&current));
  if (current == device) return absl::OkStatus();
  const cudaError_t error = LoadedRuntime().SetDevice(device);
  if (error != cudaSuccess) return CudaError(error, StrCat("cudaSetDevice(", device, ")"));
  previous_ = current;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CopyEngine>> CopyEngine::Create(int device, int slots) {
  ScopedDevice scoped;
  RETURN_IF_ERROR(scoped.Set(device));
  std::unique_ptr<CopyEngine> engine(new CopyEngine(device));
  // Non-blocking: the copies never wait for, nor hold up, work on the legacy default stream.
  ASSIGN_OR_RETURN(engine->stream_, MakeStream(cudaStreamNonBlocking));
  engine->slots_.resize(slots);
  for (Slot& slot : engine->slots_) {
    ASSIGN_OR_RETURN(slot.start, MakeEvent(cudaEventDefault));
    // Blocking sync: a consumer waiting in DeviceBatch::Wait sleeps instead of spinning a core
    // that the decoders could use.
    ASSIGN_OR_RETURN(slot.ready, MakeEvent(cudaEventBlockingSync));
  }
  return engine;
}

CopyEngine::~CopyEngine() {
  // The device must be current while its memory, events and stream are released, so they are
  // released here rather than by the members' destructors after this scope ends.
  ScopedDevice scoped;
  (void)scoped.Set(device_).ok();
  if (stream_ != nullptr) LoadedRuntime().StreamSynchronize(stream_.get());
  slots_.clear();
  stream_.reset();
}

absl::StatusOr<void*> CopyEngine::Copy(int slot_index, const void* host, size_t bytes) {
  Slot& slot = slots_[slot_index];
  ScopedDevice scoped;
  RETURN_IF_ERROR(scoped.Set(device_));
  if (bytes > slot.capacity) {
    // The old buffer may still be read by the consumer's recorded work or by the previous copy
    // into it (if its batch was dropped without waiting): let those finish before freeing it.
    for (size_t i = 0; i < slot.uses_pending; ++i) {
      CONVEYOR_CUDART_RETURN_IF_ERROR(EventSynchronize(slot.uses[i].get()));
    }
    slot.uses_pending = 0;
    CONVEYOR_CUDART_RETURN_IF_ERROR(StreamSynchronize(stream_.get()));
    slot.memory.reset();
    slot.capacity = 0;
    const size_t capacity = RoundUp(bytes, kDeviceGrowth);
    absl::StatusOr<UniqueDeviceMemory> memory = AllocDevice(capacity);
    if (!memory.ok()) {
      return Annotate(memory.status(),
                      StrCat("device buffer ", slot_index, " on device ", device_));
    }
    slot.memory = *std::move(memory);
    slot.capacity = capacity;
  }
  for (size_t i = 0; i < slot.uses_pending; ++i) {
    CONVEYOR_CUDART_RETURN_IF_ERROR(StreamWaitEvent(stream_.get(), slot.uses[i].get(), 0));
  }
  slot.uses_pending = 0;
  CONVEYOR_CUDART_RETURN_IF_ERROR(EventRecord(slot.start.get(), stream_.get()));
  if (bytes > 0) {
    const cudaError_t error = LoadedRuntime().MemcpyAsync(slot.memory.get(), host, bytes,
                                                          cudaMemcpyHostToDevice, stream_.get());
    if (error != cudaSuccess) {
      return CudaError(error, StrCat("cudaMemcpyAsync of ", bytes, " bytes to device ", device_));
    }
  }
  const cudaError_t error = LoadedRuntime().EventRecord(slot.ready.get(), stream_.get());
  if (error != cudaSuccess) {
    // The copy is enqueued but nobody could wait for it: finish it here, before the caller
    // releases the host memory it reads.
    LoadedRuntime().StreamSynchronize(stream_.get());
    return CudaError(error, "cudaEventRecord(ready)");
  }
  return bytes > 0 ? slot.memory.get() : nullptr;
}

absl::StatusOr<double> CopyEngine::Wait(int slot_index) {
  Slot& slot = slots_[slot_index];
  CONVEYOR_CUDART_RETURN_IF_ERROR(EventSynchronize(slot.ready.get()));
  float ms = 0;
  CONVEYOR_CUDART_RETURN_IF_ERROR(EventElapsedTime(&ms, slot.start.get(), slot.ready.get()));
  return ms / 1e3;
}

absl::Status CopyEngine::RecordUse(int slot_index, cudaStream_t stream) {
  Slot& slot = slots_[slot_index];
  ScopedDevice scoped;
  RETURN_IF_ERROR(scoped.Set(device_));
  if (slot.uses_pending == slot.uses.size()) {
    ASSIGN_OR_RETURN(UniqueEvent event, MakeEvent(cudaEventDisableTiming));
    slot.uses.push_back(std::move(event));
  }
  CONVEYOR_CUDART_RETURN_IF_ERROR(EventRecord(slot.uses[slot.uses_pending].get(), stream));
  ++slot.uses_pending;
  return absl::OkStatus();
}

absl::Status CopyEngine::OrderAfterCopy(int slot_index, cudaStream_t stream) {
  // A stream of any device may wait on this device's event, but the special handles
  // (cudaStreamLegacy, cudaStreamPerThread, which DLPack consumers pass as 1 and 2) name the
  // current device's stream: make it this one, as the consumer's tensors live here.
  ScopedDevice scoped;
  RETURN_IF_ERROR(scoped.Set(device_));
  CONVEYOR_CUDART_RETURN_IF_ERROR(StreamWaitEvent(stream, slots_[slot_index].ready.get(), 0));
  return absl::OkStatus();
}

}  // namespace conveyor::cuda
