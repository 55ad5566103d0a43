// GPU upload: the one path by which batches reach a GPU, used by the client (client/client.h,
// ClientOptions::device), and through it by the trainer and the Python Loader, and by
// bench/upload_bench. An Uploader copies each HostBatch (one contiguous host block holding every
// tensor; pinned when it comes from AllocatePinned or a pinned HostBuffer, device/gpu.h) to GPU
// memory with one asynchronous cudaMemcpyAsync on its own non-blocking stream, into one of
// `buffers` device buffers (grown to the largest batch, then reused), and returns at once. With two
// buffers the copy of batch k+1 runs while the consumer computes on batch k. A consumer orders its
// own stream after the copy (DeviceBatch::WaitOnStream) instead of blocking the host.
//
// The CPU path (built with CONVEYOR_CUDA=OFF, no driver or GPU at run time, or device = -1) goes
// through the same calls: a DeviceBatch's tensors then point into the host block, nothing is
// copied, and the same bound holds (at most `buffers` DeviceBatches alive).
//
// CUDA types stay out of this header (handles are passed as void*); the CUDA code is in
// device/upload_cuda.cu. Details and the consumer loop: docs/pipeline.md, "GPU upload".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/tensor_desc.h"
#include "base/types.h"

namespace conveyor {

struct UploadOptions {
  // The CUDA device ordinal batches go to (numbered as CUDA_VISIBLE_DEVICES shows them).
  // -1: the CPU path even when a GPU is present (for consumers on the host, such as a server).
  int device = 0;
  // Device buffers, i.e. how many DeviceBatches may be alive at once (>= 1). Each grows to the
  // largest batch uploaded into it, so device memory is about buffers x the largest batch.
  // 2 overlaps one copy with the consumer's work on the previous batch; more helps only when the
  // consumer holds several batches at a time. 1 serializes copy and consumption.
  int buffers = 2;
  // When there is no usable GPU (no CUDA in the build, no driver, no device): false falls back to
  // the CPU path (Uploader::gpu() says which); true makes Create fail with FAILED_PRECONDITION.
  bool require_gpu = false;
};

// One tensor of a host batch: its description and where it lies in the batch's block.
struct HostTensor : TensorDesc {
  size_t offset = 0;  // into the block
  size_t bytes = 0;
};

// What Upload copies: one contiguous host block holding every tensor at its offset. Only
// [0, end of the last tensor) is copied.
struct HostBatch {
  std::string label;              // names the batch in errors, e.g. "batch 0:12"
  // The block. REQUIRES: valid and unchanged until the DeviceBatch is destroyed (the copy reads
  // it asynchronously); `owner` may keep it alive.
  const uint8_t* data = nullptr;
  size_t size = 0;                // bytes of the block
  // Page-locked memory (AllocatePinned, a pinned HostBuffer): the copy is asynchronous. Pageable
  // memory works too, but cudaMemcpyAsync then copies before it returns.
  bool pinned = false;
  std::vector<HostTensor> tensors;
  std::shared_ptr<const void> owner;  // held by the DeviceBatch; may be null
};

// One tensor of an uploaded batch. A view: valid while its DeviceBatch is alive.
struct DeviceTensor : TensorDesc {
  void* data = nullptr;  // device memory when DeviceBatch::on_device(), else the host block
  size_t bytes = 0;
};

namespace upload_internal {
class UploaderState;
}  // namespace upload_internal

// A batch on its way to (or on) the GPU. It holds the HostBatch's owner, so the host memory lives
// as long as the DeviceBatch does, and one of the uploader's device buffers, which goes back to
// the uploader when the DeviceBatch is destroyed (its next Upload may then reuse it).
//
// Thread-safety: one thread at a time (it may be handed from thread to thread). A DeviceBatch may
// outlive its Uploader; the device buffer and stream stay alive until the last batch is gone.
//
// Destroying it first waits for its copy (so no copy ever reads freed host memory), then returns
// the buffer. REQUIRES: GPU work that reads the tensors has finished before the DeviceBatch is
// destroyed, or was declared with RecordUse: the uploader's stream does not otherwise wait for the
// consumer's streams before it overwrites the buffer.
class DeviceBatch {
 public:
  ~DeviceBatch();
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  const std::string& label() const { return label_; }
  // The HostBatch's owner (null when it had none).
  const std::shared_ptr<const void>& owner() const { return owner_; }
  // In the batch's tensor order.
  const std::vector<DeviceTensor>& tensors() const { return tensors_; }
  const DeviceTensor* Find(std::string_view name) const;
  // True when the tensors' data pointers are device memory (of device()).
  bool on_device() const { return on_device_; }
  int device() const { return device_; }  // -1 on the CPU path

  // Blocks until the copy has finished; OK at once on the CPU path. May be called again (it
  // returns the first result). An error is the failed CUDA call and its message; the tensors'
  // contents are then undefined.
  absl::Status Wait();

  // The cudaEvent_t (as void*) recorded on the uploader's stream after the copy, for
  // cudaStreamWaitEvent on the consumer's stream instead of blocking in Wait. nullptr on the CPU
  // path. Valid while this DeviceBatch is alive.
  void* ready_event() const;

  // Makes work enqueued on `cuda_stream` (a cudaStream_t as void*; nullptr is the legacy default
  // stream) from now on wait, on the GPU, for the copy (cudaStreamWaitEvent): the consumer's
  // kernels are ordered after it and the host never blocks. A no-op returning OK on the CPU path.
  absl::Status WaitOnStream(void* cuda_stream);

  // Declares that work enqueued so far on `cuda_stream` (a cudaStream_t as void*; nullptr is the
  // legacy default stream) reads the tensors: the next copy into this buffer waits for that work
  // on the GPU, so the DeviceBatch may be destroyed without synchronizing the host. May be called
  // for several streams. A no-op returning OK on the CPU path.
  absl::Status RecordUse(void* cuda_stream);

 private:
  friend class Uploader;
  DeviceBatch(std::shared_ptr<upload_internal::UploaderState> state, int slot, std::string label,
              std::shared_ptr<const void> owner);

  std::shared_ptr<upload_internal::UploaderState> state_;
  int slot_;
  std::string label_;
  std::shared_ptr<const void> owner_;
  std::vector<DeviceTensor> tensors_;
  bool on_device_ = false;
  int device_ = -1;
  bool waited_ = false;
  absl::Status wait_status_;
};

// Copies batches to one GPU, double-buffered. Thread-safe: Upload, stats and the accessors may be
// called from several threads (Upload calls then compete for the buffers).
class Uploader {
 public:
  // INVALID_ARGUMENT for buffers < 1, device < -1, a device ordinal that does not exist, or
  // require_gpu with device -1; FAILED_PRECONDITION when require_gpu is set and there is no
  // usable GPU (the message says why); a CUDA error when the stream or events cannot be made.
  static absl::StatusOr<std::unique_ptr<Uploader>> Create(const UploadOptions& options);
  // REQUIRES: no Upload call in progress.
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // True when copies really go to a GPU.
  bool gpu() const;
  // Why the CPU path is taken ("built without CUDA", the cudaGetDeviceCount error, "device -1");
  // empty when gpu().
  const std::string& cpu_reason() const;

  // The device ordinal copies go to; -1 on the CPU path.
  int device() const;

  // Starts the asynchronous copy of the batch's block (bytes [0, end of the last tensor)) into a
  // free device buffer, grown as needed, and returns at once; DeviceBatch::Wait, WaitOnStream or
  // ready_event say when the copy is done. Blocks while all `buffers` buffers belong to live
  // DeviceBatches. A block that is not pinned still works, but cudaMemcpyAsync then copies
  // synchronously (counted in Stats::pageable_batches).
  // INVALID_ARGUMENT when the batch has no block or a tensor lies outside it; CANCELLED after
  // Cancel(); a CUDA error (RESOURCE_EXHAUSTED for out of device memory) when the copy cannot be
  // started.
  // REQUIRES: the calling thread does not itself hold all `buffers` live DeviceBatches (it would
  // wait for itself forever; free_buffers() tells a caller that must not block).
  absl::StatusOr<std::unique_ptr<DeviceBatch>> Upload(HostBatch batch);

  // Buffers not held by a live DeviceBatch: when it is 0, the next Upload blocks.
  int free_buffers() const;

  // Thread-safe: an Upload blocked for a buffer, and every later one, returns CANCELLED. Live
  // DeviceBatches stay valid. For a consumer that shuts down while its uploading thread waits.
  void Cancel();

  // Monotonic counters since Create.
  struct Stats {
    uint64_t batches = 0;           // Upload calls that succeeded
    uint64_t bytes = 0;             // bytes handed over (copied, on the GPU path)
    double copy_seconds = 0;        // GPU time of the copies seen to finish (Wait or release),
                                    // from CUDA events; 0 on the CPU path
    double wait_seconds = 0;        // time Upload spent blocked waiting for a free buffer
    uint64_t pageable_batches = 0;  // GPU path: batches whose host buffer was not pinned
  };
  Stats stats() const;

 private:
  explicit Uploader(std::shared_ptr<upload_internal::UploaderState> state);
  std::shared_ptr<upload_internal::UploaderState> state_;
};

}  // namespace conveyor
