// What a tensor is, apart from where its bytes are: its name, element type, shape and role. Every
// tensor struct of the tree (a sample's OwnedTensor, a batch's TensorView, the client's
// client::TensorView, the uploader's HostTensor and DeviceTensor, DeviceFrames' tensors) derives
// from it and adds only where its bytes live, so the four are declared once and a description
// passes from one layer to the next by copy (or by pointer, tools/batch_line.h) without a field
// being restated. Header-only apart from base/types.h; installed with the client's public header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/types.h"

namespace conveyor {

struct TensorDesc {
  std::string name;
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;  // C order
  // Set where the tensor is made and carried with it to the client (the wire's
  // conveyor.v1.TensorRole), so no layer tells a padding mask or a packing tensor by its name.
  TensorRole role = TensorRole::kData;
};

}  // namespace conveyor
