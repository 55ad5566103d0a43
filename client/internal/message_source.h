// Payloads in the stream's own messages (server/batch_encoder.h EncodeBatch): a header, then the
// payload in one or more messages at increasing offsets, each copied from gRPC's receive slices
// straight into the batch's block. The source every stream has, for every batch no other
// carrier of the stream carries. Used by the stream's receiving thread.
#pragma once

#include <string>

#include "client/internal/payload_source.h"

namespace conveyor::client {

class MessageSource final : public PayloadSource {
 public:
  // `target` names the server in errors; `allocate` gives each batch its block.
  MessageSource(std::string target, BlockAllocator allocate);
  std::string_view transport() const override { return "grpc"; }
  bool Carries(const wire::Message& m) const override { return true; }
  absl::Status Take(wire::Message& m, InboundPayload* p) override;

 private:
  std::string target_;
  BlockAllocator allocate_;
};

}  // namespace conveyor::client
