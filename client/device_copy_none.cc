// Built without CUDA: device delivery is refused with a clear error.
#include "client/device_copy.h"

namespace conveyor::client {

bool DeviceCopySupported() { return false; }

absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::Create(int) {
  return absl::FailedPreconditionError(
      "device delivery needs a client built with CUDA (CONVEYOR_CUDA=ON); this build has none");
}

}  // namespace conveyor::client
