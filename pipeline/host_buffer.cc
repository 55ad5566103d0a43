// HostBuffer (pipeline/batch.h): pinned memory when CUDA is built in and a GPU is present, 4096-byte
// aligned ordinary memory otherwise.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "pipeline/batch.h"
#include "spdlog/spdlog.h"

#if CONVEYOR_HAVE_CUDA
#include "pipeline/internal/upload_cuda.h"
#endif

namespace conveyor {

namespace {

constexpr size_t kAlignment = 4096;
constexpr size_t kPoolMinBytes = 1 << 20;
constexpr size_t kPoolMaxBlocks = 8;

struct Pooled {
  uint8_t* data;
  size_t capacity;
  bool pinned;
};

struct Pool {
  std::mutex mu;
  std::vector<Pooled> blocks;
  size_t bytes = 0;
  size_t max_bytes = size_t{2} << 30;  // SetPoolLimit
};

// Never destroyed: buffers may be released during static destruction.
Pool& GetPool() {
  static Pool* pool = new Pool();
  return *pool;
}

void FreeBlock(uint8_t* data, bool pinned) {
#if CONVEYOR_HAVE_CUDA
  if (pinned) {
    cuda::PinnedMemoryDeleter()(data);
    return;
  }
#endif
  (void)pinned;
  std::free(data);
}

// A pooled block of at least `rounded` bytes (and at most twice that), or {nullptr}.
Pooled TakePooled(size_t rounded, bool pinned) {
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  size_t best = pool.blocks.size();
  for (size_t i = 0; i < pool.blocks.size(); ++i) {
    const Pooled& b = pool.blocks[i];
    if (b.pinned != pinned || b.capacity < rounded || b.capacity > 2 * rounded) continue;
    if (best == pool.blocks.size() || b.capacity < pool.blocks[best].capacity) best = i;
  }
  if (best == pool.blocks.size()) return Pooled{nullptr, 0, false};
  Pooled b = pool.blocks[best];
  pool.blocks.erase(pool.blocks.begin() + static_cast<ptrdiff_t>(best));
  pool.bytes -= b.capacity;
  return b;
}

// Keeps the block for reuse when the pool has room; false: the caller frees it.
bool GivePooled(uint8_t* data, size_t capacity, bool pinned) {
  if (capacity < kPoolMinBytes) return false;
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  if (pool.blocks.size() >= kPoolMaxBlocks || pool.bytes + capacity > pool.max_bytes) return false;
  pool.blocks.push_back(Pooled{data, capacity, pinned});
  pool.bytes += capacity;
  return true;
}

}  // namespace

void HostBuffer::SetPoolLimit(size_t bytes) {
  Pool& pool = GetPool();
  std::vector<Pooled> freed;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.max_bytes = bytes;
    while (pool.bytes > pool.max_bytes && !pool.blocks.empty()) {
      freed.push_back(pool.blocks.back());
      pool.bytes -= pool.blocks.back().capacity;
      pool.blocks.pop_back();
    }
  }
  for (const Pooled& b : freed) FreeBlock(b.data, b.pinned);
}

// Allocation failure throws std::bad_alloc, as the shared_ptr's own allocation here would:
// running out of host memory is not something a caller can recover from batch by batch.
std::shared_ptr<HostBuffer> HostBuffer::Allocate(size_t bytes, bool pinned) {
  std::shared_ptr<HostBuffer> buffer(new HostBuffer());
  buffer->size_ = bytes;
  // aligned_alloc wants a multiple of the alignment; 0 bytes still gets a (one-page) block so
  // data() is never null.
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  bool want_pinned = false;
#if CONVEYOR_HAVE_CUDA
  want_pinned = pinned && cuda::ProbeGpus().devices > 0;
#endif
  if (rounded >= kPoolMinBytes) {
    const Pooled reused = TakePooled(rounded, want_pinned);
    if (reused.data != nullptr) {
      buffer->data_ = reused.data;
      buffer->capacity_ = reused.capacity;
      buffer->pinned_ = reused.pinned;
      return buffer;
    }
  }
  buffer->capacity_ = rounded;
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
  if (data_ != nullptr && GivePooled(data_, capacity_, pinned_)) return;
  FreeBlock(data_, pinned_);
}

}  // namespace conveyor
