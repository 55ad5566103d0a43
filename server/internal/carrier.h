// Internal to the server: how a stream's payloads travel, chosen per stream from a table
// (kCarriers in server/carriers.cc) as datasets/registry.cc picks a dataset format. Each carrier
// owns its negotiation: whether the request asks for it, its grant (what it reserves, the
// StreamStart fields that tell the client, or why not), and its connection once the client has
// read the stream start, which yields the stream's PayloadSink (server/internal/payload_sink.h).
//
//   carrier           asked by (StreamBatchesRequest)  told in StreamStart         server side
//   same-host region  shared_memory                    shared_memory*              server/shm_sink.cc
//   stripes           payload_streams > 1              payload_streams, stripe_*   server/stripes.cc
//   messages          (the fallback)                   -                           server/batch_encoder.cc
//
// The first carrier asked for that grants carries the stream; one that refuses leaves the next
// its turn. A new carrier (CUDA IPC, RDMA) is a file pair here (its sink and its Grant), the
// request and StreamStart fields in proto/conveyor/v1/service.proto, and a row in kCarriers
// (its two functions declared in its own header, as GrantSharedMemory is in shm_sink.h);
// its client side is a PayloadSource and a row in client/carriers.cc.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "conveyor/v1/service.pb.h"
#include "server/internal/payload_sink.h"
#include "server/internal/stripes.h"

namespace conveyor {

// What carriers use of the server, shared by all its streams. The stripe pool's functions are
// the server's (they move its health); everything else is set once at start.
struct CarrierServer {
  bool shared_memory = true;  // ServerOptions::shared_memory
  // The bound address, by which a same-host client's local user is found (peer_identity.h).
  std::string listen_host;
  uint16_t listen_port = 0;
  StripeRegistry stripes;  // the streams stripe streams may join
  // Up to `wanted` stripe calls from the stripe pool (0 when it has too little room), and their
  // return (server.cc ReserveStripes, ReleaseStripes).
  std::function<uint32_t(uint32_t wanted)> reserve_stripes;
  std::function<void(uint32_t calls)> release_stripes;
};

// One stream, as its carrier's negotiation sees it. Valid while the stream is served.
struct CarrierRequest {
  grpc::ServerContext* ctx = nullptr;
  const v1::StreamBatchesRequest* request = nullptr;
  std::string who;             // "job=J consumer=C/N", for the log
  uint64_t max_message = 0;    // payload bytes per message
  uint64_t batch_bytes = 0;    // the config's estimate of one batch
  uint64_t queue_bytes = 0;    // the stream's byte budget
  uint64_t stream_bytes = 0;   // the stream's own memory estimate, already reserved
  // Adds `bytes` to the stream's share of the server's memory budget; false when they do not fit.
  std::function<bool(uint64_t bytes)> reserve_memory;
};

// A carrier granted to one stream; its StreamStart fields are written. Held until the stream
// ends (after its sink), so that what it reserved is returned then.
class CarrierGrant {
 public:
  virtual ~CarrierGrant() = default;
  // Once the client has read the stream start: waits for the client's side (a few seconds at
  // most, not past `stop`) and returns the stream's sink. Null: the carrier could not connect and
  // the stream's payloads go in messages (logged). An error ends the stream: CANCELLED when the
  // client went away meanwhile.
  virtual absl::StatusOr<std::unique_ptr<PayloadSink>> Connect(const StopFn& stop) = 0;
};

struct Carrier {
  bool (*asked)(const v1::StreamBatchesRequest& request);
  // The grant, its fields written in `start`; null when refused, having said why in `start`
  // where the protocol has a field for it.
  std::unique_ptr<CarrierGrant> (*grant)(const CarrierRequest& request, CarrierServer& server,
                                         v1::StreamStart* start);
};

// The carriers of kCarriers that `request` asks for, in turn: the first grant, or null (the
// payloads go in messages, MakeGrpcSink).
std::unique_ptr<CarrierGrant> GrantCarrier(const CarrierRequest& request, CarrierServer& server,
                                           v1::StreamStart* start);

}  // namespace conveyor
