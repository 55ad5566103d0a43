// The client's side of the transport seam (server/internal/payload_sink.h): where a stream's batch
// payloads lie when they do not come in its gRPC messages. A stream has at most one source, made
// from its StreamStart; batches whose header says their payload lies outside the messages are
// viewed in it. The same-host region (client/internal/shm_region.h) is the one source today; a
// CUDA IPC or RDMA reader would be another.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace conveyor::client {

class PayloadSource {
 public:
  virtual ~PayloadSource() = default;
  // The ClientStats transport label ("shared_memory").
  virtual std::string_view transport() const = 0;
  // The payload of `n` bytes the server says it put at `pos`, checked and registered as viewed:
  // DATA_LOSS naming what is wrong when it cannot be there (the server is not trusted). Called by
  // the receiving thread, in stream order.
  virtual absl::StatusOr<const uint8_t*> Accept(uint64_t pos, uint64_t n) = 0;
  // The payload accepted at `pos` is no longer viewed (any thread, any order).
  virtual void Release(uint64_t pos) = 0;
  // Next() waits with nothing received (the trainer keeps every batch it got): the server should
  // send rather than wait for room.
  virtual void SetStarved(bool starved) = 0;
};

}  // namespace conveyor::client
