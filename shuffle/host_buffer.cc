// HostBuffer (shuffle/batch.h): pinned memory when CUDA is built in and a GPU is present, 4096-byte
// aligned ordinary memory otherwise.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>

#include "shuffle/batch.h"
#include "spdlog/spdlog.h"

#if CONVEYOR_HAVE_CUDA
#include "shuffle/upload_cuda.h"
#endif

namespace conveyor {

namespace {

constexpr size_t kAlignment = 4096;

}  // namespace

// Allocation failure throws std::bad_alloc, as the shared_ptr's own allocation here would:
// running out of host memory is not something a caller can recover from batch by batch.
std::shared_ptr<HostBuffer> HostBuffer::Allocate(size_t bytes, bool pinned) {
  std::shared_ptr<HostBuffer> buffer(new HostBuffer());
  buffer->size_ = bytes;
  // aligned_alloc wants a multiple of the alignment; 0 bytes still gets a (one-page) block so
  // data() is never null.
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
#if CONVEYOR_HAVE_CUDA
  // The probe asks the runtime once per process: a build with CUDA on a machine without a driver
  // or GPU takes the aligned path below from then on, without calling CUDA again.
  if (pinned && cuda::ProbeGpus().devices > 0) {
    absl::StatusOr<cuda::UniquePinnedMemory> memory = cuda::AllocPinned(rounded);
    // cudaHostAlloc hands out whole pages; the check keeps the 4096 promise regardless.
    if (memory.ok() && reinterpret_cast<uintptr_t>(memory->get()) % kAlignment == 0) {
      buffer->data_ = static_cast<uint8_t*>(memory->release());
      buffer->pinned_ = true;
      return buffer;
    }
    // Pinned memory is a limited resource (RLIMIT_MEMLOCK in containers, the driver's own
    // limits); pageable memory still works, only its copies are synchronous.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      spdlog::warn("HostBuffer: pinned allocation of {} bytes failed ({}); using pageable memory",
                   rounded,
                   memory.ok() ? "not 4096-aligned" : std::string(memory.status().message()));
    });
  }
#endif
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  buffer->data_ = static_cast<uint8_t*>(p);
  return buffer;
}

HostBuffer::~HostBuffer() {
#if CONVEYOR_HAVE_CUDA
  if (pinned_) {
    cuda::PinnedMemoryDeleter()(data_);
    return;
  }
#endif
  std::free(data_);
}

}  // namespace conveyor
