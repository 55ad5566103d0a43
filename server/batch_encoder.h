// Turns a pipeline Batch into conveyor.v1 stream messages: a header, then the payload in
// messages of at most `max_message` bytes, cut at tensor boundaries where a tensor fits so the
// client can view most tensors in place. Shared by the server and the streaming benchmark.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "conveyor/v1/service.pb.h"
#include "pipeline/batch.h"

namespace conveyor {

// `role` names each tensor's TensorRole; `write` sends one message and returns false when the
// stream is gone (EncodeBatch then stops and returns false).
bool EncodeBatch(const Batch& batch, Cursor next, uint64_t max_message,
                 const std::function<v1::TensorRole(std::string_view)>& role,
                 const std::function<bool(const v1::StreamBatchesResponse&)>& write);

}  // namespace conveyor
