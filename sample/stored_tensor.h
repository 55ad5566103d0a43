// A per-clip tensor served in its stored shape (`shape: stored` on a WebDataset .npy member;
// docs/sampling.md "Tensors of varying shape"). Samples may store different shapes (T5 embeddings
// of L tokens, VAE latents of each resolution bucket); the spec says which it takes:
//   - by default, the stream's shape as the dataset names it (its first sample's): another shape
//     is an error naming the shard, key and member;
//   - `pad_to: N` (a varying leading dim, [L, D]): L up to N, zero rows after the stored ones and
//     a `<stream>_is_pad` mask of N flags; L > N is an error, or cut to N with `overlong: truncate`;
//   - `buckets: {by: STREAM}` (sample/buckets.h): any shape, one shape per batch.
// Pure functions of the spec and a sample's stored shape, so the assembler, the order's buckets and
// `conveyor check --config` agree on every sample.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace conveyor {

struct SampleSpec;
struct StreamSpec;

// What is served of one sample's stored tensor.
struct ServedTensor {
  std::vector<int64_t> shape;  // the tensor's shape in the batch
  // The stored tensor's leading rows copied into it (the rest are zeros, masked): all of them
  // unless the tensor is padded or truncated.
  int64_t rows = 0;
  bool padded = false;  // `pad_to`: the mask is one flag per row of `shape[0]`
};

// Parses `pad_to: N` and `overlong: error | truncate` on a LOWDIM stream already parsed with
// `shape: stored` (`n`: the stream's options); sets s->pad_to, s->pad_truncate and
// s->stored_shape[0] = N. Errors name source:line:col.
absl::Status ParseTensorPadding(std::string_view source, const YAML::Node& n, StreamSpec* s);

// What stream `si` of `spec` (a `shape: stored` stream) serves of a sample whose tensor is stored
// in `stored` (a 0-d array: {}). An error (DATA_LOSS) when the spec does not take that shape;
// `where` names the shard, key and member.
absl::StatusOr<ServedTensor> ServeStoredTensor(const SampleSpec& spec, size_t si,
                                               const std::vector<int64_t>& stored,
                                               const std::string& where);

}  // namespace conveyor
