// Turns a pipeline Batch into conveyor.v1 stream messages: a header, then the payload in
// messages of at most `max_message` bytes, cut at tensor boundaries where a tensor fits. Each
// message is a ready-to-send gRPC ByteBuffer whose payload slice points into the batch's own
// buffer (kept alive by the slice): the server never copies a payload. Shared by the server and
// the streaming benchmark.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "conveyor/v1/service.pb.h"
#include "shuffle/batch.h"

namespace conveyor {

// `role` names each tensor's TensorRole.
std::vector<grpc::ByteBuffer> EncodeBatch(const Batch& batch, Cursor next, uint64_t max_message,
                                          const std::function<v1::TensorRole(std::string_view)>& role);

// A StreamBatchesResponse that carries no payload (the stream's start) as a ByteBuffer.
grpc::ByteBuffer EncodeMessage(const v1::StreamBatchesResponse& message);

}  // namespace conveyor
