#include "device/upload.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "device/gpu.h"

#if CONVEYOR_HAVE_CUDA
#include "device/internal/cuda.h"
#endif

namespace conveyor {
namespace upload_internal {

// Shared by an Uploader and every DeviceBatch it made, so batches may outlive the uploader: the
// last owner releases the device buffers and the stream.
class UploaderState {
 public:
  explicit UploaderState(const UploadOptions& options)
      : options_(options), busy_(options.buffers, false) {}

  const UploadOptions& options() const { return options_; }

  // Blocks until a buffer is free, takes it and returns its index; -1 once cancelled.
  int AcquireSlot() ABSL_LOCKS_EXCLUDED(mu_) {
    const auto start = std::chrono::steady_clock::now();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &UploaderState::FreeOrCancelled));
    if (cancelled_) return -1;
    const int slot = static_cast<int>(std::find(busy_.begin(), busy_.end(), false) - busy_.begin());
    busy_[slot] = true;
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return slot;
  }

  void ReleaseSlot(int slot) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    busy_[slot] = false;
  }

  int FreeSlots() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count(busy_.begin(), busy_.end(), false));
  }

  void Cancel() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  void CountUpload(uint64_t bytes, bool pageable) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++stats_.batches;
    stats_.bytes += bytes;
    if (pageable) ++stats_.pageable_batches;
  }

  void CountCopyTime(double seconds) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stats_.copy_seconds += seconds;
  }

  Uploader::Stats stats() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  // Set once in Uploader::Create, read-only afterwards.
  std::string cpu_reason;
#if CONVEYOR_HAVE_CUDA
  std::unique_ptr<cuda::CopyEngine> engine;  // null on the CPU path
#endif

 private:
  bool FreeOrCancelled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || std::find(busy_.begin(), busy_.end(), false) != busy_.end();
  }

  const UploadOptions options_;
  mutable absl::Mutex mu_;
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);  // per buffer: owned by a live DeviceBatch
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  Uploader::Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace upload_internal

using upload_internal::UploaderState;

DeviceBatch::DeviceBatch(std::shared_ptr<UploaderState> state, int slot, std::string label,
                         std::shared_ptr<const void> owner)
    : state_(std::move(state)), slot_(slot), label_(std::move(label)), owner_(std::move(owner)) {}

DeviceBatch::~DeviceBatch() {
  if (on_device_ && !waited_) {
    // The copy may still be reading the host buffer this object is about to release.
    const absl::Status s = Wait();
    // A destructor has nobody to return the error to; this library has no logger of its own.
    if (!s.ok()) std::fprintf(stderr, "Uploader: dropping %s: %s\n", label_.c_str(), s.ToString().c_str());
  }
  state_->ReleaseSlot(slot_);
}

const DeviceTensor* DeviceBatch::Find(std::string_view name) const {
  for (const DeviceTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::Status DeviceBatch::Wait() {
  if (!on_device_ || waited_) return wait_status_;
  waited_ = true;
#if CONVEYOR_HAVE_CUDA
  absl::StatusOr<double> seconds = state_->engine->Wait(slot_);
  if (seconds.ok()) {
    state_->CountCopyTime(*seconds);
  } else {
    wait_status_ = Annotate(seconds.status(), StrCat("upload of ", label_));
  }
#endif
  return wait_status_;
}

void* DeviceBatch::ready_event() const {
#if CONVEYOR_HAVE_CUDA
  if (on_device_) return state_->engine->ready_event(slot_);
#endif
  return nullptr;
}

absl::Status DeviceBatch::WaitOnStream(void* cuda_stream) {
#if CONVEYOR_HAVE_CUDA
  if (on_device_) {
    RETURN_IF_ERROR(state_->engine->OrderAfterCopy(slot_, static_cast<cudaStream_t>(cuda_stream)));
  }
#endif
  return absl::OkStatus();
}

absl::Status DeviceBatch::RecordUse(void* cuda_stream) {
#if CONVEYOR_HAVE_CUDA
  if (on_device_) {
    return state_->engine->RecordUse(slot_, static_cast<cudaStream_t>(cuda_stream));
  }
#endif
  return absl::OkStatus();
}

Uploader::Uploader(std::shared_ptr<UploaderState> state) : state_(std::move(state)) {}

Uploader::~Uploader() = default;

absl::StatusOr<std::unique_ptr<Uploader>> Uploader::Create(const UploadOptions& options) {
  if (options.buffers < 1) {
    return absl::InvalidArgumentError(
        StrCat("Uploader: buffers must be at least 1, got ", options.buffers));
  }
  if (options.device < -1) {
    return absl::InvalidArgumentError(
        StrCat("Uploader: device must be a CUDA ordinal or -1 (CPU), got ", options.device));
  }
  if (options.device == -1 && options.require_gpu) {
    return absl::InvalidArgumentError("Uploader: require_gpu contradicts device -1 (the CPU path)");
  }
  auto state = std::make_shared<UploaderState>(options);
  if (options.device == -1) {
    state->cpu_reason = "device -1 asks for the CPU path";
  } else {
#if CONVEYOR_HAVE_CUDA
    const GpuProbe& probe = ProbeGpus();
    if (probe.devices == 0) {
      state->cpu_reason = probe.reason;
    } else if (options.device >= probe.devices) {
      return absl::InvalidArgumentError(StrCat("Uploader: CUDA device ", options.device,
                                               " does not exist; there are ", probe.devices));
    } else {
      absl::StatusOr<std::unique_ptr<cuda::CopyEngine>> engine =
          cuda::CopyEngine::Create(options.device, options.buffers);
      if (!engine.ok()) {
        return Annotate(engine.status(), StrCat("Uploader on CUDA device ", options.device));
      }
      state->engine = *std::move(engine);
    }
#else
    state->cpu_reason = ProbeGpus().reason;  // "built without CUDA ..."
#endif
    if (!state->cpu_reason.empty() && options.require_gpu) {
      return absl::FailedPreconditionError(
          StrCat("Uploader: require_gpu is set but there is no usable GPU: ", state->cpu_reason));
    }
  }
  return std::unique_ptr<Uploader>(new Uploader(std::move(state)));
}

bool Uploader::gpu() const { return state_->cpu_reason.empty(); }

const std::string& Uploader::cpu_reason() const { return state_->cpu_reason; }

Uploader::Stats Uploader::stats() const { return state_->stats(); }

int Uploader::device() const {
#if CONVEYOR_HAVE_CUDA
  if (state_->engine != nullptr) return state_->engine->device();
#endif
  return -1;
}

int Uploader::free_buffers() const { return state_->FreeSlots(); }

void Uploader::Cancel() { state_->Cancel(); }

absl::StatusOr<std::unique_ptr<DeviceBatch>> Uploader::Upload(HostBatch batch) {
  const std::string what = StrCat("Uploader: ", batch.label);
  if (batch.data == nullptr) return absl::InvalidArgumentError(StrCat(what, " has no host block"));
  // Only [0, end) is copied: a block sized for the largest batch need not be copied whole.
  size_t end = 0;
  for (const HostTensor& t : batch.tensors) {
    if (t.offset > batch.size || t.bytes > batch.size - t.offset) {
      return absl::InvalidArgumentError(
          StrCat(what, ": tensor ", t.name, " at offset ", t.offset, " of ", t.bytes,
                 " bytes lies outside its block of ", batch.size, " bytes"));
    }
    end = std::max(end, t.offset + t.bytes);
  }

  const int slot = state_->AcquireSlot();
  if (slot < 0) return absl::CancelledError(StrCat(what, ": the uploader was cancelled"));
  // From here on the DeviceBatch owns the slot: any error return gives it back.
  std::unique_ptr<DeviceBatch> out(
      new DeviceBatch(state_, slot, std::move(batch.label), std::move(batch.owner)));
  // The CPU path hands out views of the caller's block; the consumer may write to it (the block
  // belongs to this batch alone), hence the non-const view.
  uint8_t* base = const_cast<uint8_t*>(batch.data);
  bool pageable = false;
#if CONVEYOR_HAVE_CUDA
  if (state_->engine != nullptr) {
    ASSIGN_OR_RETURN(void* device, state_->engine->Copy(slot, batch.data, end));
    base = static_cast<uint8_t*>(device);
    out->on_device_ = true;
    out->device_ = state_->engine->device();
    pageable = !batch.pinned;
  }
#endif
  out->tensors_.reserve(batch.tensors.size());
  for (HostTensor& t : batch.tensors) {
    out->tensors_.push_back(DeviceTensor{std::move(static_cast<TensorDesc&>(t)),
                                         base == nullptr ? nullptr : base + t.offset, t.bytes});
  }
  state_->CountUpload(end, pageable);
  return out;
}

}  // namespace conveyor
