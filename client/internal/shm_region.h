// The client's side of the same-host transport (base/shm_layout.h): the region the server created
// for one stream, received over the stream's handoff socket and mapped (writable: a trainer may
// change its batch in place, and the server never reads the ring back). Batches view their
// tensors in place; releasing a batch (in any order) frees its bytes, and the region publishes how
// far, in order, everything is released. The stream's PayloadSource over it, and the carrier's
// offer and acceptance (client/internal/carrier.h), are in client/shm_region.cc.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace conveyor::v1 {
class StreamBatchesRequest;
class StreamStart;
}  // namespace conveyor::v1

namespace conveyor::client {

struct CarrierStream;
struct ClientOptions;
class PayloadSource;

class ShmRegion {
 public:
  // Connects to the server's handoff `socket` (StreamStart.shared_memory_socket), proves itself
  // with `token`, receives the region's descriptor and maps it: a sealed memfd (it can neither
  // shrink nor grow under this process) holding a ring of `ring` bytes, at most `max_ring` (what
  // this client offered). Tells the server whether it took it. UNAVAILABLE naming the step that
  // failed otherwise: the stream's payloads then come in messages.
  static absl::StatusOr<std::shared_ptr<ShmRegion>> Receive(const std::string& socket, const std::string& token,
                                                           uint64_t ring, uint64_t max_ring);
  ~ShmRegion();  // unmaps
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint64_t ring() const { return ring_; }
  // Tells the server that Next() waits with nothing received (the trainer keeps every batch it
  // got): a full ring then sends batches in messages instead of waiting for releases.
  void SetStarved(bool starved);

  // A payload of `n` bytes the server placed at `pos`: checked to be where a next payload may be
  // (a page at or after the last one's end, within one lap of what is released, not wrapping)
  // and registered as in use. DATA_LOSS naming what is wrong otherwise. Called by the receiving
  // thread, in order.
  absl::StatusOr<const uint8_t*> Accept(uint64_t pos, uint64_t n);
  // The payload accepted at `pos` is no longer viewed (any thread, any order).
  void Release(uint64_t pos);
  uint64_t released() const;

 private:
  ShmRegion() = default;
  uint64_t ring_ = 0;
  uint8_t* header_ = nullptr;     // the header page, read-write
  uint8_t* data_ = nullptr;       // the ring
  size_t data_mapped_ = 0;

  mutable absl::Mutex mu_;
  struct InUse {
    uint64_t pos, end;
    bool released;
  };
  std::deque<InUse> in_use_ ABSL_GUARDED_BY(mu_);  // accepted payloads, in placement order
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;      // end of the last accepted payload
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;  // what the header says
};

// The carrier's row in kCarriers (client/internal/carrier.h): offered when the options ask
// for shared memory and this host has a /dev/shm; accepted by receiving and mapping the region the
// stream start names, or refused saying why (ClientStats::shared_memory_refused).
bool OfferSharedMemory(const ClientOptions& o, v1::StreamBatchesRequest* request, std::string* refused);
absl::StatusOr<std::shared_ptr<PayloadSource>> AcceptSharedMemory(const CarrierStream& stream,
                                                                  const v1::StreamStart& start, std::string* refused);

}  // namespace conveyor::client
