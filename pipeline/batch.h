// A batch as the pipeline hands it out: the cursor it belongs to, the ids of its samples, and its
// tensors, all in one aligned host buffer (pinned when CUDA is present, so it can be copied to
// the GPU asynchronously; see pipeline/upload.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

namespace conveyor {

// Host memory for a batch's tensors: one block aligned to 4096 bytes, pinned (page-locked) when
// built with CUDA and a GPU is present. Released blocks of 1 MiB and more are kept in a small
// process-wide pool (at most 8 blocks, 2 GiB) and handed out again: a fresh block of tens of MB per
// batch costs a page fault per 4 KiB (and pinning costs milliseconds), which made batching the
// pipeline's serial bottleneck.
class HostBuffer {
 public:
  // Pinned when `pinned` is asked for and possible; aligned host memory otherwise.
  static std::shared_ptr<HostBuffer> Allocate(size_t bytes, bool pinned);
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
};

struct TensorView {
  std::string name;
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;
  size_t offset = 0;  // into the batch buffer, 64-byte aligned
  size_t bytes = 0;
};

struct Batch {
  Cursor cursor;
  uint32_t consumer = 0;
  uint32_t consumers = 1;
  std::vector<SampleId> ids;  // in batch order
  std::vector<TensorView> tensors;
  std::shared_ptr<HostBuffer> buffer;

  const TensorView* Find(std::string_view name) const;
  const uint8_t* data(const TensorView& t) const { return buffer->data() + t.offset; }
  size_t bytes() const;  // sum of tensor bytes
};

}  // namespace conveyor
