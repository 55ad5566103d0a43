// A batch as the pipeline hands it out: the cursor it belongs to, the ids of its samples, and its
// tensors, all in one aligned host buffer (pinned when CUDA is present, so it can be copied to
// the GPU asynchronously; see device/host_buffer.h and device/upload.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor_desc.h"
#include "base/types.h"
#include "device/host_buffer.h"

namespace conveyor {

// A tensor of a batch: a view of `bytes` bytes at `offset` in the batch's buffer, valid while the
// Batch (its buffer) lives.
struct TensorView : TensorDesc {
  size_t offset = 0;  // into the batch buffer, 64-byte aligned
  size_t bytes = 0;
};

struct Batch {
  Cursor cursor;  // with its position (base/types.h)
  Cursor next;    // the cursor of the batch after it: resumes right after this one
  uint32_t consumer = 0;
  uint32_t consumers = 1;
  std::vector<SampleId> ids;  // in batch order
  std::vector<TensorView> tensors;
  std::shared_ptr<HostBuffer> buffer;

  const TensorView* Find(std::string_view name) const;
  const uint8_t* data(const TensorView& t) const { return buffer->data() + t.offset; }
  size_t bytes() const;  // sum of tensor bytes
};

// Where batches are built: a buffer of at least `bytes` bytes (a server's same-host region,
// server/internal/shm_sink.h). Unset, the pipeline allocates HostBuffers of its own. An error ends the
// batch (CANCELLED when its stream is over).
using BatchBuffers = std::function<absl::StatusOr<std::shared_ptr<HostBuffer>>(size_t bytes)>;

}  // namespace conveyor
