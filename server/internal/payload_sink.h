// Internal to the server (and its tests and stream_bench): the transport seam. Each stream sends
// its batches through one PayloadSink: where the pipeline builds them, and how their header and
// payload reach the client. Three sinks exist, each beside its carrier's negotiation
// (server/internal/carrier.h, which picks one per stream from a table):
//
//   gRPC messages     server/batch_encoder.cc  MakeGrpcSink: the payload in messages, as slices
//                                              over the batch buffer (no copy)
//   same-host region  server/internal/shm_sink.h  the batches built in a sealed memfd the client
//                                              maps; only the header in a message
//   stripes           server/internal/stripes.h   the payload messages over more streams, each on
//                                              a connection of its own
//
// The client's side of each is a PayloadSource (client/internal/payload_source.h).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "pipeline/batch.h"
#include "server/internal/batch_encoder.h"

namespace conveyor {

// True when the stream is over (the client went away, the server drains): a sink waiting for
// the client stops and returns CANCELLED.
using StopFn = std::function<bool()>;

class PayloadSink {
 public:
  virtual ~PayloadSink() = default;
  // "grpc", "grpc_striped" or "shared_memory": the metrics' transport label.
  virtual std::string_view transport() const = 0;
  // Where the stream's pipeline builds its batches (Pipeline::SetBatchBuffers); null for the
  // pipeline's own HostBuffers. `stop` ends a wait for room.
  virtual BatchBuffers buffers(StopFn stop) { return nullptr; }
  // Sends `batch`, whose successor is `next`: its header and payload, through `write`. CANCELLED
  // when `write` fails (the client went away).
  virtual absl::Status Send(const Batch& batch, const Cursor& next, const MessageWriter& write) = 0;
  // Seconds spent waiting for the client to make room, so far.
  virtual double wait_seconds() const { return 0; }
};

// Payloads in gRPC messages of at most `max_message` bytes (server/batch_encoder.h EncodeBatch).
std::unique_ptr<PayloadSink> MakeGrpcSink(uint64_t max_message);

}  // namespace conveyor
