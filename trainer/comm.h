// Gradient averaging across trainer ranks: gloo over TCP on CPU (Debian's libgloo, what PyTorch
// uses for its gloo backend), NCCL when built with CUDA and GPUs are present, or nothing for a
// single rank. Ranks meet through a rendezvous directory on a filesystem they all see.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace conveyor::trainer {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl", "none"
  // In place: data[i] = sum over ranks of data[i].
  virtual absl::Status AllreduceSum(float* data, size_t count) = 0;
};

// `host`: the address gloo listens on and tells the other ranks (empty: this machine's hostname).
// `kind`: "auto" (nccl when built with CUDA and a GPU is present and world > 1, else gloo when
// world > 1, else none), "gloo", "nccl" or "none". `timeout_s` bounds the rendezvous.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const std::string& kind, int rank,
                                                                 int world_size,
                                                                 const std::string& rendezvous_dir,
                                                                 double timeout_s,
                                                                 const std::string& host = "");

bool NcclAvailable();  // built with NCCL and a CUDA device is usable

}  // namespace conveyor::trainer
