// Host memory for a batch's tensors: one block aligned to 4096 bytes, pinned (page-locked) when
// built with CUDA and a GPU is present, so that device/upload.h copies it asynchronously. The
// pipeline's batches (pipeline/batch.h) live in one each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace conveyor {

// One block of host memory. Released blocks of 1 MiB and more are kept in a small process-wide
// pool (at most 8 blocks, 2 GiB) and handed out again: a fresh block of tens of MB per batch costs
// a page fault per 4 KiB (and pinning costs milliseconds), which made batching the pipeline's
// serial bottleneck. Thread-safe: Allocate and the destructor may run on any thread.
class HostBuffer {
 public:
  // Pinned when `pinned` is asked for and possible; aligned host memory otherwise.
  static std::shared_ptr<HostBuffer> Allocate(size_t bytes, bool pinned);
  // `bytes` at `data` in memory someone else owns (a server's shared region, server/internal/shm_sink.h):
  // `owner` is kept alive as long as the buffer, and nothing goes back to the pool.
  static std::shared_ptr<HostBuffer> Borrow(uint8_t* data, size_t bytes, std::shared_ptr<const void> owner);
  // Caps the process-wide pool of released blocks (default 2 GiB); frees what is over it. A
  // server sets it so that idle memory is part of its budget (server/server.h).
  static void SetPoolLimit(size_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_; }

 private:
  HostBuffer() = default;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;  // bytes allocated (>= size_): recycled buffers may be larger
  bool pinned_ = false;
  std::shared_ptr<const void> owner_;  // Borrow: the memory's owner; nothing to free here
};

}  // namespace conveyor
