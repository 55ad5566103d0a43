#include "pipeline/batch.h"

namespace conveyor {

const TensorView* Batch::Find(std::string_view name) const {
  for (const TensorView& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t Batch::bytes() const {
  size_t n = 0;
  for (const TensorView& t : tensors) n += t.bytes;
  return n;
}

}  // namespace conveyor
