// What a received batch's views point into (client/internal/payload_source.h): its block of the
// client's pool, or its place in a carrier's memory.
#include <algorithm>
#include <cstdlib>

#include "client/internal/payload_source.h"
#include "device/gpu.h"

namespace conveyor::client {

// A fresh block of tens or hundreds of MB per batch costs a page fault per 4 KiB, which halved
// the throughput of large batches: blocks are kept (base/block_pool.h). With device delivery
// they are pinned, so each batch's copy to the GPU is asynchronous and needs no staging copy.
void FreeBlock(uint8_t* p, int kind) {
  if (kind == kPinnedBlock) {
    FreePinned(p);
  } else {
    std::free(p);
  }
}

BlockPool::Block TakeBlock(BlockPool& pool, size_t bytes, int pinned_for_device) {
  if (pinned_for_device >= 0) {
    BlockPool::Block b = pool.Take(bytes, kPinnedBlock);
    if (b.data != nullptr) return b;
    b.capacity = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    // Pinned memory is limited (RLIMIT_MEMLOCK in containers): pageable memory still works, its
    // copies are only synchronous (Uploader::Stats::pageable_batches counts them).
    absl::StatusOr<void*> memory = AllocatePinned(b.capacity, pinned_for_device);
    if (memory.ok()) {
      b.data = static_cast<uint8_t*>(*memory);
      b.kind = kPinnedBlock;
      return b;
    }
  }
  BlockPool::Block b = pool.Take(bytes, 0);
  if (b.data != nullptr) return b;
  b.capacity = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  b.data = static_cast<uint8_t*>(std::aligned_alloc(64, b.capacity));
  return b;
}

BatchStorage::~BatchStorage() {
  device.reset();  // waits for the copy out of the block, then frees the device buffer
  if (source) source->Release(source_position);
  if (block.data != nullptr) pool->Give(block);
}

}  // namespace conveyor::client
