// The client's carriers (client/internal/payload_source.h), as a table (kCarriers in
// client/carriers.cc) mirroring the server's (server/internal/carrier.h): each offers itself in
// the StreamBatchesRequest when the options ask for it, and takes the server's grant from the
// StreamStart, yielding the stream's PayloadSource. The first carrier granted carries the
// stream's batches that say so; every other batch comes in messages (MessageSource).
//
// A new carrier is a file pair here (its PayloadSource, its Offer and Accept), its fields in
// proto/conveyor/v1/service.proto (and, when batch messages carry a flag of its own, that field
// in the hand parser client/wire.cc), and a row in kCarriers (its two functions declared in its
// own header, as AcceptSharedMemory is in shm_region.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/internal/payload_source.h"
#include "conveyor/v1/service.pb.h"

namespace conveyor::client {

// One stream, as its carriers see it. Valid while the stream lasts.
struct CarrierStream {
  const ClientOptions* options = nullptr;
  std::string target;  // the server
  // A channel to the server on a connection of its own (index i), and the metadata each call
  // carries (token, job secret).
  std::function<std::shared_ptr<grpc::Channel>(uint32_t i)> channel;
  std::function<void(grpc::ClientContext*)> prepare;
  BlockAllocator allocate;
  std::function<bool()> stopped;  // the client is stopping
};

struct Carrier {
  // Adds the offer to `request` when the options ask for this carrier; false when it is not
  // offered, with *refused saying why where the client can tell (ClientStats).
  bool (*offer)(const ClientOptions& o, v1::StreamBatchesRequest* request, std::string* refused);
  // The server's answer in `start` to the offer: the source when granted, null when not (with
  // *refused saying why where there is a reason to report). An error (a grant that cannot be
  // true) is final for the client.
  absl::StatusOr<std::shared_ptr<PayloadSource>> (*accept)(const CarrierStream& stream, const v1::StreamStart& start,
                                                           std::string* refused);
};

// The offers `o` asks for, added to `request`; which carriers were offered, for AcceptCarriers.
std::vector<const Carrier*> OfferCarriers(const ClientOptions& o, v1::StreamBatchesRequest* request,
                                          std::string* refused);
// The stream's sources, in the order a batch is offered to them: the first offered carrier the
// server granted, then the messages.
absl::StatusOr<std::vector<std::shared_ptr<PayloadSource>>> AcceptCarriers(
    const std::vector<const Carrier*>& offered, const CarrierStream& stream, const v1::StreamStart& start,
    std::string* refused);

}  // namespace conveyor::client
