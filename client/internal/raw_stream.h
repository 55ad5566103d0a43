// One StreamBatches call on gRPC's generic API, as the client makes them (its stream, and each
// stripe stream, client/internal/stripes.h): the messages arrive raw (ByteBuffers), so the
// payload is parsed straight from gRPC's receive slices into the batch block (client/internal/
// wire.h), one copy after gRPC's receive. Used by one thread.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace conveyor::client {

class RawStream {
 public:
  // Starts the call on `channel` under `ctx`, sends `request` (a serialized
  // StreamBatchesRequest) and half-closes. ok() says whether all of that went through.
  RawStream(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx, const std::string& request);
  ~RawStream();  // shuts its completion queue down and drains it
  RawStream(const RawStream&) = delete;
  RawStream& operator=(const RawStream&) = delete;

  bool ok() const { return open_; }
  // The next message; false at the stream's end or when it failed (then Finish says why).
  bool Read(grpc::ByteBuffer* m);
  // The call's status; after the last Read (or the context's TryCancel).
  grpc::Status Finish();

 private:
  bool Wait();
  grpc::CompletionQueue cq_;
  grpc::GenericStub stub_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool open_ = false;
};

}  // namespace conveyor::client
