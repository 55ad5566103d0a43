// The client's side of striped payloads (server/internal/stripes.h, docs/serving.md "Striped
// payloads"): the stripe streams of one stream, each on a channel (a connection) of its own,
// writing the payload messages they carry into the batch the stream is filling. The stream's
// receiving thread reads each header on the stream, then waits here until its payload arrived.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/worker_pool.h"

namespace conveyor::v1 {
class StreamBatchesRequest;
class StreamStart;
}  // namespace conveyor::v1

namespace conveyor::client {
namespace wire {
class SliceReader;
}
struct CarrierStream;
struct ClientOptions;
class PayloadSource;

class StripeReceiver {
 public:
  // Opens `streams` stripe streams with `request` (a StreamBatchesRequest already carrying the
  // token; the index is set here), stream i on channel(i); `prepare` adds each call's metadata.
  StripeReceiver(uint32_t streams, std::string request, const std::function<std::shared_ptr<grpc::Channel>(uint32_t)>& channel,
                 const std::function<void(grpc::ClientContext*)>& prepare);
  ~StripeReceiver();  // cancels the stripe streams and joins their threads
  StripeReceiver(const StripeReceiver&) = delete;
  StripeReceiver& operator=(const StripeReceiver&) = delete;

  // Batch `n` of the stream (0 for its first): its `size` payload bytes into `dst`, waiting until
  // every byte came. DATA_LOSS when a stripe sends bytes outside the payload, twice, or for a
  // batch already done; UNAVAILABLE when a stripe stream failed (the stream reconnects);
  // CANCELLED once stop() says so.
  absl::Status Fill(uint64_t n, uint8_t* dst, uint64_t size, const std::function<bool()>& stop);

 private:
  // A stripe's message for batch `n`: waits until the stream fills that batch, then copies it in.
  absl::Status Deliver(uint32_t i, uint64_t n, uint64_t offset, uint64_t size, wire::SliceReader* data);

  const uint32_t streams_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // The batch being filled.
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;  // batches completed: the next one Fill takes
  bool filling_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t batch_ ABSL_GUARDED_BY(mu_) = 0;
  uint8_t* dst_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t size_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t filled_ ABSL_GUARDED_BY(mu_) = 0;
  int copying_ ABSL_GUARDED_BY(mu_) = 0;                  // copies in flight outside the lock
  std::map<uint64_t, uint64_t> received_ ABSL_GUARDED_BY(mu_);  // offset -> end, this batch
  std::unique_ptr<WorkerPool> readers_;
};

// The carrier's row in kCarriers (client/internal/carrier.h): offered with payload_streams > 1;
// accepted by opening the stripe streams the stream start grants (DATA_LOSS for more than asked).
bool OfferStripes(const ClientOptions& o, v1::StreamBatchesRequest* request, std::string* refused);
absl::StatusOr<std::shared_ptr<PayloadSource>> AcceptStripes(const CarrierStream& stream, const v1::StreamStart& start,
                                                             std::string* refused);

}  // namespace conveyor::client
