// Internal to the server (and its tests and stream_bench): it includes gRPC and the service protos.
// Turns a pipeline Batch into conveyor.v1 stream messages: a header, then the payload in
// messages of at most `max_message` bytes, cut at tensor boundaries where a tensor fits so the
// client can view most tensors in place.
//
// Messages leave as raw gRPC ByteBuffers: a message's small fields are serialized by protobuf,
// and its `data` field is a gRPC slice over the batch buffer itself, holding a reference to it
// until gRPC has sent the bytes. The server copies no payload byte; the wire format is the same
// conveyor.v1.StreamBatchesResponse any gRPC client parses (fields may come in any order).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "pipeline/batch.h"

namespace conveyor {

// Sends one message; false when the stream is gone.
using MessageWriter = std::function<bool(const grpc::ByteBuffer&)>;

// A whole message serialized by protobuf (the stream's first message; small ones).
grpc::ByteBuffer SerializeMessage(const v1::StreamBatchesResponse& message);

// A cursor on the wire: its position too when it has one.
void CursorToProto(const Cursor& c, v1::Cursor* out);

// Each tensor's wire role is its TensorView::role; `write` sends one message (EncodeBatch stops
// and returns CANCELLED when it returns false). With `region_position`, the payload lies in the
// stream's same-host region there (server/internal/shm_sink.h) and the batch is one message: the header,
// in_shared_memory, shm_position and last.
// Striped payloads (server/internal/stripes.h): the batch's number in its stream, and where
// payload message `index` (of `bytes` payload bytes) goes.
struct PayloadStripes {
  uint64_t batch = 0;
  std::function<absl::Status(uint64_t index, const grpc::ByteBuffer& message, uint64_t bytes)> write;
};

// With `stripes`, the header goes alone through `write` (payload_striped) and each payload
// message, naming the batch, through stripes->write.
absl::Status EncodeBatch(const Batch& batch, Cursor next, uint64_t max_message,
                         const MessageWriter& write, std::optional<uint64_t> region_position = {},
                         const PayloadStripes* stripes = nullptr);

// The server side of StreamBatches with raw messages, on gRPC's synchronous API: a service
// deriving from this gets each call on a handler thread, reads nothing itself (the request is
// parsed before it is called) and writes ByteBuffers. gRPC's generated code offers raw messages
// only to its asynchronous and callback APIs; this installs the same split-streaming handler the
// generated WithSplitStreamingMethod_StreamBatches does, with ByteBuffer as the response type, so
// that gRPC's serializer passes the slices through instead of serializing a protobuf copy.
class RawStreamBatchesService : public v1::Conveyor::Service {
 public:
  using Stream = grpc::ServerSplitStreamer<v1::StreamBatchesRequest, grpc::ByteBuffer>;
  RawStreamBatchesService();

  // One call: `request` parsed (as the synchronous API passes it), `stream` to write messages to.
  virtual grpc::Status StreamRaw(grpc::ServerContext* ctx, const v1::StreamBatchesRequest* request,
                                 Stream* stream) = 0;

  // Replaced by StreamRaw: never called.
  grpc::Status StreamBatches(grpc::ServerContext*, const v1::StreamBatchesRequest*,
                             grpc::ServerWriter<v1::StreamBatchesResponse>*) final;
};

}  // namespace conveyor
