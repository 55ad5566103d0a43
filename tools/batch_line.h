// The one-line summary of a batch that `conveyor batches` and `conveyor fetch` print, so that what
// a server delivers can be compared line for line with what the offline pipeline computes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "base/tensor_desc.h"

namespace conveyor::tools {

// A view of one tensor of a batch (the pipeline's or the client's), valid while the batch lives.
struct LineTensor {
  const TensorDesc* desc = nullptr;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

struct LineSample {
  uint64_t index = 0;
  uint64_t episode = 0;
  uint32_t step = 0;
  uint32_t dataset = 0;  // a mixture's dataset; printed as DATASET:EPISODE/STEP when not 0
};

// "E:S consumer I/N samples K ids XXH3[ sha256 HEX][ [episode/step ...]]". The ids hash is over
// "index," per sample ("dataset:index," for a sample of a mixture's second dataset or later). The digest is SHA-256
// over each tensor's "name|dtype|d0,d1,...," then its bytes, in batch order.
absl::StatusOr<std::string> BatchLine(uint64_t epoch, uint64_t step, uint32_t consumer,
                                      uint32_t consumers, std::span<const LineSample> ids,
                                      std::span<const LineTensor> tensors, bool digest,
                                      bool list_ids);

}  // namespace conveyor::tools
