// Internal to the server (and its tests and stream_bench): it includes the service protos.
// Turns a pipeline Batch into conveyor.v1 stream messages: a header, then the payload in
// messages of at most `max_message` bytes, cut at tensor boundaries where a tensor fits so the
// client can view most tensors in place. Shared by the server and the streaming benchmark.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "conveyor/v1/service.pb.h"
#include "pipeline/batch.h"

namespace conveyor {

// Puts a batch's whole payload somewhere else than the messages (the same-host transport,
// server/shm_writer.h): its position there, nullopt to send it in messages after all, or an
// error that ends the stream.
using PayloadPlacer = std::function<absl::StatusOr<std::optional<uint64_t>>(const uint8_t* data, uint64_t n)>;

// `role` names each tensor's TensorRole; `write` sends one message and returns false when the
// stream is gone (EncodeBatch then stops and returns CANCELLED). With `place`, a payload it
// places goes as one message: the header, in_shared_memory, shm_position and last.
absl::Status EncodeBatch(const Batch& batch, Cursor next, uint64_t max_message,
                         const std::function<v1::TensorRole(std::string_view)>& role,
                         const std::function<bool(const v1::StreamBatchesResponse&)>& write,
                         const PayloadPlacer& place = nullptr);

}  // namespace conveyor
