// HostBuffer (device/host_buffer.h): pinned memory when CUDA is built in and a GPU is present,
// 4096-byte aligned ordinary memory otherwise.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "base/block_pool.h"
#include "device/gpu.h"
#include "device/host_buffer.h"

namespace conveyor {

namespace {

constexpr size_t kAlignment = 4096;
constexpr size_t kPoolMinBytes = 1 << 20;
constexpr size_t kPoolMaxBlocks = 8;

void FreeBlock(uint8_t* data, bool pinned) {
  if (pinned) {
    FreePinned(data);
  } else {
    std::free(data);
  }
}

// Released buffers kept for reuse (base/block_pool.h); kind 1 is pinned memory. Never destroyed:
// buffers may be released during static destruction.
BlockPool& Pool() {
  static BlockPool* pool = new BlockPool(kPoolMaxBlocks, size_t{2} << 30, kPoolMinBytes,
                                         [](uint8_t* data, int kind) { FreeBlock(data, kind == 1); });
  return *pool;
}

}  // namespace

void HostBuffer::SetPoolLimit(size_t bytes) { Pool().SetMaxBytes(bytes); }

// Allocation failure throws std::bad_alloc, as the shared_ptr's own allocation here would:
// running out of host memory is not something a caller can recover from batch by batch.
std::shared_ptr<HostBuffer> HostBuffer::Allocate(size_t bytes, bool pinned) {
  std::shared_ptr<HostBuffer> buffer(new HostBuffer());
  buffer->size_ = bytes;
  // aligned_alloc wants a multiple of the alignment; 0 bytes still gets a (one-page) block so
  // data() is never null.
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  // The probe asks the runtime once per process: a build with CUDA on a machine without a driver
  // or GPU takes the aligned path below from then on, without calling CUDA again.
  const bool want_pinned = pinned && ProbeGpus().devices > 0;
  if (rounded >= kPoolMinBytes) {
    const BlockPool::Block reused = Pool().Take(rounded, want_pinned ? 1 : 0);
    if (reused.data != nullptr) {
      buffer->data_ = reused.data;
      buffer->capacity_ = reused.capacity;
      buffer->pinned_ = reused.kind == 1;
      return buffer;
    }
  }
  buffer->capacity_ = rounded;
  if (want_pinned) {
    absl::StatusOr<void*> memory = AllocatePinned(rounded);
    // cudaHostAlloc hands out whole pages; the check keeps the 4096 promise regardless.
    if (memory.ok() && reinterpret_cast<uintptr_t>(*memory) % kAlignment == 0) {
      buffer->data_ = static_cast<uint8_t*>(*memory);
      buffer->pinned_ = true;
      return buffer;
    }
    if (memory.ok()) FreePinned(*memory);
    // Pinned memory is a limited resource (RLIMIT_MEMLOCK in containers, the driver's own
    // limits); pageable memory still works, only its copies are synchronous.
    static std::once_flag warned;
    // Said once on stderr: device/ has no logger of its own (the client links it, and a trainer
    // that embeds the client should not need the pipeline's).
    std::call_once(warned, [&] {
      const std::string why =
          memory.ok() ? "not 4096-aligned" : std::string(memory.status().message());
      std::fprintf(stderr,
                   "conveyor: HostBuffer: pinned allocation of %zu bytes failed (%s); using "
                   "pageable memory\n",
                   rounded, why.c_str());
    });
  }
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  buffer->data_ = static_cast<uint8_t*>(p);
  return buffer;
}

std::shared_ptr<HostBuffer> HostBuffer::Borrow(uint8_t* data, size_t bytes, std::shared_ptr<const void> owner) {
  std::shared_ptr<HostBuffer> buffer(new HostBuffer());
  buffer->data_ = data;
  buffer->size_ = bytes;
  buffer->capacity_ = bytes;
  buffer->owner_ = std::move(owner);
  return buffer;
}

HostBuffer::~HostBuffer() {
  if (owner_ != nullptr) return;  // borrowed memory: its owner frees it
  if (data_ != nullptr) Pool().Give(BlockPool::Block{data_, capacity_, pinned_ ? 1 : 0});
}

}  // namespace conveyor
