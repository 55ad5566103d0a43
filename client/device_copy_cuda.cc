// Device delivery through the CUDA runtime API (host code only: no kernels).
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/device_copy.h"

namespace conveyor::client {
namespace {

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

// Owns one batch's device memory, pinned staging and event. Frees them once the copy is done.
struct DeviceBatch {
  int device = 0;
  void* staging = nullptr;
  void* dev = nullptr;
  cudaEvent_t event = nullptr;
  ~DeviceBatch() {
    cudaSetDevice(device);
    if (event) {
      cudaEventSynchronize(event);
      cudaEventDestroy(event);
    }
    if (dev) cudaFree(dev);
    if (staging) cudaFreeHost(staging);
  }
};

class CudaCopier final : public DeviceCopier {
 public:
  explicit CudaCopier(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaCopier() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  absl::Status Copy(Batch* batch, std::shared_ptr<void>* keep) override {
    cudaError_t e = cudaSetDevice(device_);
    if (e != cudaSuccess) return Check(e, "cudaSetDevice");
    size_t total = 0;
    for (const Tensor& t : batch->tensors) total += (t.bytes + 255) / 256 * 256;
    auto db = std::make_shared<DeviceBatch>();
    db->device = device_;
    if (total == 0) total = 256;
    absl::Status s = Check(cudaMallocHost(&db->staging, total), "cudaMallocHost (pinned staging)");
    if (!s.ok()) return s;
    s = Check(cudaMalloc(&db->dev, total), "cudaMalloc");
    if (!s.ok()) return s;
    size_t off = 0;
    for (Tensor& t : batch->tensors) {
      std::memcpy(static_cast<char*>(db->staging) + off, t.data, t.bytes);
      t.device_data = static_cast<char*>(db->dev) + off;
      off += (t.bytes + 255) / 256 * 256;
    }
    s = Check(cudaMemcpyAsync(db->dev, db->staging, off, cudaMemcpyHostToDevice, stream_),
              "cudaMemcpyAsync");
    if (!s.ok()) return s;
    s = Check(cudaEventCreateWithFlags(&db->event, cudaEventDisableTiming), "cudaEventCreate");
    if (!s.ok()) return s;
    s = Check(cudaEventRecord(db->event, stream_), "cudaEventRecord");
    if (!s.ok()) return s;
    batch->ready_event = db->event;
    *keep = std::move(db);
    return absl::OkStatus();
  }

 private:
  int device_;
  cudaStream_t stream_;
};

}  // namespace

bool DeviceCopySupported() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::Create(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device delivery asked for, but no CUDA device is usable: ",
        e == cudaSuccess ? "no device" : cudaGetErrorString(e)));
  }
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " of ", n));
  }
  absl::Status s = Check(cudaSetDevice(device), "cudaSetDevice");
  if (!s.ok()) return s;
  cudaStream_t stream = nullptr;
  s = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (!s.ok()) return s;
  return std::unique_ptr<DeviceCopier>(new CudaCopier(device, stream));
}

}  // namespace conveyor::client
