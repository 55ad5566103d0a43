#include "pipeline/upload.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "spdlog/spdlog.h"

#if CONVEYOR_HAVE_CUDA
#include "pipeline/internal/upload_cuda.h"
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

  // Blocks until a buffer is free, takes it and returns its index.
  int AcquireSlot() ABSL_LOCKS_EXCLUDED(mu_) {
    const auto start = std::chrono::steady_clock::now();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::vector<bool>* busy) {
          return std::find(busy->begin(), busy->end(), false) != busy->end();
        },
        &busy_));
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
  const UploadOptions options_;
  mutable absl::Mutex mu_;
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);  // per buffer: owned by a live DeviceBatch
  Uploader::Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace upload_internal

using upload_internal::UploaderState;

DeviceBatch::DeviceBatch(std::shared_ptr<UploaderState> state, int slot, Batch batch)
    : state_(std::move(state)), slot_(slot), batch_(std::move(batch)) {}

DeviceBatch::~DeviceBatch() {
  if (on_device_ && !waited_) {
    // The copy may still be reading the host buffer this object is about to release.
    const absl::Status s = Wait();
    if (!s.ok()) spdlog::error("Uploader: dropping a batch whose copy failed: {}", s.ToString());
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
    wait_status_ = Annotate(seconds.status(), StrCat("upload of batch (epoch ", batch_.cursor.epoch,
                                                     ", step ", batch_.cursor.step, ")"));
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
    const cuda::GpuProbe& probe = cuda::ProbeGpus();
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
    state->cpu_reason = "built without CUDA (CONVEYOR_CUDA=OFF or no toolkit at build time)";
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

absl::StatusOr<std::unique_ptr<DeviceBatch>> Uploader::Upload(Batch batch) {
  const std::string what =
      StrCat("Uploader: batch (epoch ", batch.cursor.epoch, ", step ", batch.cursor.step, ")");
  if (batch.buffer == nullptr) return absl::InvalidArgumentError(StrCat(what, " has no buffer"));
  // Only [0, end) is copied: a buffer sized for the largest batch need not be copied whole.
  size_t end = 0;
  for (const TensorView& t : batch.tensors) {
    if (t.offset > batch.buffer->size() || t.bytes > batch.buffer->size() - t.offset) {
      return absl::InvalidArgumentError(
          StrCat(what, ": tensor ", t.name, " at offset ", t.offset, " of ", t.bytes,
                 " bytes lies outside its buffer of ", batch.buffer->size(), " bytes"));
    }
    end = std::max(end, t.offset + t.bytes);
  }

  const int slot = state_->AcquireSlot();
  // From here on the DeviceBatch owns the slot: any error return gives it back.
  std::unique_ptr<DeviceBatch> out(new DeviceBatch(state_, slot, std::move(batch)));
  const Batch& b = out->batch_;
  uint8_t* base = b.buffer->data();
  bool pageable = false;
#if CONVEYOR_HAVE_CUDA
  if (state_->engine != nullptr) {
    ASSIGN_OR_RETURN(void* device, state_->engine->Copy(slot, b.buffer->data(), end));
    base = static_cast<uint8_t*>(device);
    out->on_device_ = true;
    out->device_ = state_->engine->device();
    pageable = !b.buffer->pinned();
  }
#endif
  out->tensors_.reserve(b.tensors.size());
  for (const TensorView& t : b.tensors) {
    out->tensors_.push_back(DeviceTensor{.name = t.name,
                                         .dtype = t.dtype,
                                         .shape = t.shape,
                                         .data = base == nullptr ? nullptr : base + t.offset,
                                         .bytes = t.bytes});
  }
  state_->CountUpload(end, pageable);
  return out;
}

}  // namespace conveyor
