// Large memory blocks kept for reuse. A fresh block of tens or hundreds of MB costs a page fault
// per 4 KiB on first touch, which halved the throughput of large batches; a kept block costs none.
// One pool type for the pipeline's batch buffers (pipeline/batch.h HostBuffer: pinned or pageable
// memory) and the client's receive blocks, each with its own bounds.
//
// Thread-safe. The pool never allocates: callers allocate on a miss and Give() blocks back when
// done; the pool frees, with the free function it was made with, what it cannot keep and what it
// holds when destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class BlockPool {
 public:
  struct Block {
    uint8_t* data = nullptr;
    size_t capacity = 0;
    int kind = 0;  // blocks are reused only for the same kind (e.g. pinned or pageable memory)
  };
  using FreeFn = void (*)(uint8_t* data, int kind);

  // Keeps at most `max_blocks` blocks and `max_bytes` bytes, of at least `min_bytes` each.
  BlockPool(size_t max_blocks, size_t max_bytes, size_t min_bytes, FreeFn free);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // The smallest kept block of `kind` whose capacity is in [bytes, 2 * bytes + 4096] (so a small
  // batch never pins a huge block), removed from the pool; {nullptr} when none fits.
  Block Take(size_t bytes, int kind);
  // Keeps `b` for reuse when it is large enough and the bounds allow; frees it otherwise.
  void Give(Block b);
  // Lowers (or raises) the byte bound; kept blocks over a lower bound are freed.
  void SetMaxBytes(size_t bytes);
  size_t bytes() const;
  size_t blocks() const;

 private:
  const size_t max_blocks_;
  const size_t min_bytes_;
  const FreeFn free_;
  mutable absl::Mutex mu_;
  std::vector<Block> kept_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t max_bytes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor
