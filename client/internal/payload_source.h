// The client's side of the transport seam (server/internal/payload_sink.h, server/internal/
// carrier.h): how a batch's payload reaches the client once its header arrived. Every carrier is
// a PayloadSource: payloads in the stream's own messages (client/internal/message_source.h, the
// fallback every stream has), in the same-host region (client/internal/shm_region.h), on stripe
// streams (client/internal/stripes.h). A stream's sources are made from its StreamStart by the
// carrier table (client/internal/carrier.h); the receive loop hands each batch's messages to the
// first source that carries it and knows nothing of any carrier.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/block_pool.h"
#include "client/internal/wire.h"
#include "device/upload.h"

namespace conveyor::client {

class PayloadSource;

// What a received batch's views point into: its block of the client's pool (back to the pool
// when the batch is released), or its place in a source's memory (released there).
struct BatchStorage {
  std::shared_ptr<BlockPool> pool;
  BlockPool::Block block;
  std::shared_ptr<PayloadSource> source;
  uint64_t source_position = 0;
  const uint8_t* source_data = nullptr;
  std::unique_ptr<DeviceBatch> device;  // device delivery: the batch's copy on the GPU
  const uint8_t* data() const { return source ? source_data : block.data; }
  ~BatchStorage();
};

// The client's pool of batch blocks (client/batch_storage.cc): one 64-byte aligned block per
// batch, kept for reuse; pinned (kind kPinnedBlock) under device delivery. FreeBlock is the pool's
// deleter; TakeBlock gives a kept block of at least `bytes`, or a new one, pinned (with that
// device current) when `pinned_for_device` >= 0 and possible; {nullptr} when allocation fails.
inline constexpr int kPinnedBlock = 1;
void FreeBlock(uint8_t* p, int kind);
BlockPool::Block TakeBlock(BlockPool& pool, size_t bytes, int pinned_for_device);

// A block of the client's pool for a payload of `bytes` (pinned under device delivery):
// RESOURCE_EXHAUSTED naming the batch and the server when it cannot be had.
using BlockAllocator = std::function<absl::StatusOr<std::shared_ptr<BatchStorage>>(uint64_t bytes)>;

// A batch being received: the size its header announced, where its bytes go, how many came.
struct InboundPayload {
  uint64_t index = 0;  // the batch's number on this stream (0 for its first)
  uint64_t bytes = 0;  // BatchHeader.payload_bytes, within the client's cap
  std::shared_ptr<BatchStorage> storage;  // set by the source at the header
  uint64_t filled = 0;
};

class PayloadSource {
 public:
  virtual ~PayloadSource() = default;
  // The ClientStats transport label ("grpc", "grpc_striped", "shared_memory").
  virtual std::string_view transport() const = 0;
  // Whether this source carries the batch whose first message (with its header) is `m`.
  virtual bool Carries(const wire::Message& m) const = 0;
  // One message of a batch this source carries, the first (with the header) included: its
  // payload placed, `p->storage` set at the header and `p->filled` counted. Called by the
  // receiving thread, in stream order. DATA_LOSS naming the server and what is wrong when the
  // message cannot be true (the server is not trusted); UNAVAILABLE when the carrier failed (the
  // stream reconnects); CANCELLED when the client stopped meanwhile.
  virtual absl::Status Take(wire::Message& m, InboundPayload* p) = 0;
  // The payload placed at `pos` in this source's memory is no longer viewed (any thread, any
  // order). Only sources that set BatchStorage::source get it.
  virtual void Release(uint64_t pos) {}
  // Next() waits with nothing received (the trainer keeps every batch it got): a source whose
  // server waits for the client to make room should send rather than wait.
  virtual void SetStarved(bool starved) {}
};

}  // namespace conveyor::client
