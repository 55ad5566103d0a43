// Device delivery for the client (CUDA builds): copies a received batch's tensors into device
// memory through a pinned staging buffer, asynchronously on the copier's own stream, and records
// an event the trainer waits on. Without CUDA, Create() says so and nothing else is compiled in.
#pragma once

#include <memory>

#include "absl/status/statusor.h"

namespace conveyor::client {

struct Batch;

bool DeviceCopySupported();

class DeviceCopier {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceCopier>> Create(int device);
  virtual ~DeviceCopier() = default;
  // Sets each tensor's device_data and batch->ready_event; `*keep` owns the device memory, the
  // staging buffer and the event (released when the batch is).
  virtual absl::Status Copy(Batch* batch, std::shared_ptr<void>* keep) = 0;
};

}  // namespace conveyor::client
