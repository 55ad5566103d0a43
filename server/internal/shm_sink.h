// The server's side of the same-host transport (base/shm_layout.h, docs/serving.md "Same-host
// transport"): a region this server creates for one stream, a sealed memfd, in which the stream's
// pipeline builds each batch (Pipeline::SetBatchBuffers) and which the client maps read-only.
// Each batch is written once, by the pipeline, where the trainer reads it; the handler thread
// sends only its header. One per stream; used by the stream's handler thread only.
//
// The client is not trusted: it can neither shrink nor grow the region (the seals), so no write
// here can fault; the counters it writes in the header are read as claims, clamped to what was
// placed.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/internal/payload_sink.h"

namespace conveyor {

struct CarrierRequest;
struct CarrierServer;
class CarrierGrant;

class SharedMemorySink final : public PayloadSink {
 public:
  // A region with a ring of `ring` bytes (rounded down to pages; at least one page), of which at
  // most `batches_ahead` (at least 1) placed batches may be unreleased, and the Unix socket under
  // /dev/shm that hands it over. Payloads that do not go in the region go in messages of at most
  // `max_message` bytes. FAILED_PRECONDITION naming the call that failed (memfd_create, the
  // socket) otherwise: the stream then uses messages.
  static absl::StatusOr<std::unique_ptr<SharedMemorySink>> Create(uint64_t ring, uint32_t batches_ahead,
                                                                  uint64_t max_message);
  ~SharedMemorySink() override;  // closes the socket; the mapping lives while batches borrow it
  SharedMemorySink(const SharedMemorySink&) = delete;
  SharedMemorySink& operator=(const SharedMemorySink&) = delete;

  const std::string& socket_path() const { return socket_path_; }
  const std::string& token() const { return token_; }
  uint64_t ring() const { return ring_; }

  // Hands the region to the client: waits until a connection on the socket sends the token, gives
  // it the descriptor and waits for its answer that it mapped the region. At most `timeout`, and
  // not past stop(). An error says why (the stream then sends payloads in messages); a peer with
  // a wrong token is turned away and the wait goes on. The socket is removed either way.
  absl::Status Handoff(absl::Duration timeout, const StopFn& stop);
  bool handed_over() const { return handed_; }

  std::string_view transport() const override { return "shared_memory"; }
  // Buffers in the ring: each waits until the client released enough and fewer than
  // batches_ahead batches are unreleased (polling its counter, as gRPC flow control would make
  // the stream wait), until `stop` (CANCELLED). Ordinary memory, so that the batch goes in
  // messages, before the handoff, for a batch larger than the ring, and while the client is
  // starved (it keeps every batch it was given and would wait for this one forever).
  BatchBuffers buffers(StopFn stop) override;
  // A batch built in the ring: its header, with its position. Any other: messages.
  absl::Status Send(const Batch& batch, const Cursor& next, const MessageWriter& write) override;
  double wait_seconds() const override { return wait_seconds_; }
  uint64_t full_batches() const { return full_batches_; }  // built outside while starved
  uint64_t region_batches() const { return region_batches_; }

 private:
  struct Region;
  SharedMemorySink() = default;
  absl::StatusOr<std::shared_ptr<HostBuffer>> Allocate(size_t bytes, const StopFn& stop);
  uint64_t Released() const;
  bool Starved() const;
  void CloseSocket();

  std::shared_ptr<Region> region_;
  uint8_t* data_ = nullptr;  // the ring's first byte in the mapping
  uint64_t ring_ = 0;
  uint32_t batches_ahead_ = 1;
  uint64_t max_message_ = 0;
  int listen_fd_ = -1;
  std::string socket_path_, token_;
  bool handed_ = false;
  uint64_t head_ = 0;                // end of the last buffer placed (monotonic)
  std::deque<uint64_t> unreleased_;  // ends of the placed buffers not yet released
  struct Placed {
    const uint8_t* data;
    uint64_t pos;
  };
  std::optional<Placed> last_;  // the buffer placed last, until its batch is sent
  double wait_seconds_ = 0;
  uint64_t full_batches_ = 0;
  uint64_t region_batches_ = 0;
};

// The carrier's row in kCarriers (server/internal/carrier.h): asked by a request's
// shared_memory offer; granted with a ring sized from the stream's batches, reserved in the
// server's budget, or refused saying why (StreamStart.shared_memory_refused).
bool AsksSharedMemory(const v1::StreamBatchesRequest& request);
std::unique_ptr<CarrierGrant> GrantSharedMemory(const CarrierRequest& request, CarrierServer& server,
                                                v1::StreamStart* start);

}  // namespace conveyor
