// The vocabulary every layer shares: where a consumer is in the global sequence (Cursor), what a
// sample is called (SampleId), and the element types of tensors (DType). One definition each, used
// by the pipeline, the server, the client and the tools, so that a cursor a trainer saved parses
// the same way everywhere. Header-only apart from absl; no FFmpeg, gRPC or protobuf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace conveyor {

// The position in the global sequence. Two forms (docs/pipeline.md "Consumers and the cursor"):
//  - EPOCH:STEP, batch `step` of epoch `epoch` at the job's global batch size B: sample position
//    step * B of the epoch's order. Means what it meant when it was recorded only at that B.
//  - EPOCH@POSITION (`position` set): sample `position` of the epoch's order, whatever the batch
//    size. The batches from it start there and advance by the batch size in force; `step` is then
//    derived (floor(position / B)). A job may resume from it at another global batch size and
//    world size and continue the same global sample sequence.
// Resuming from a cursor gives exactly the batches an uninterrupted run gives from there.
struct Cursor {
  constexpr Cursor() = default;
  constexpr Cursor(uint64_t e, uint64_t s, std::optional<uint64_t> p = std::nullopt)
      : epoch(e), step(s), position(p) {}

  uint64_t epoch = 0;
  uint64_t step = 0;
  std::optional<uint64_t> position;
  bool operator==(const Cursor&) const = default;
  // The sample position this cursor names at global batch size `batch` (its `position` when set).
  // False when step * batch overflows.
  bool PositionAt(uint64_t batch, uint64_t* out) const;
  std::string ToString() const;  // "EPOCH:STEP", or "EPOCH@POSITION" when position is set
  // "EPOCH:STEP" or "EPOCH@POSITION": two decimal integers of at most 19 digits, nothing else (no
  // sign, no spaces). INVALID_ARGUMENT naming the text otherwise.
  static absl::StatusOr<Cursor> Parse(std::string_view text);
};

// Kept as a free function for the pipeline's callers.
inline absl::StatusOr<Cursor> ParseCursor(std::string_view text) { return Cursor::Parse(text); }

struct SampleId {
  uint64_t index = 0;    // sample index in the dataset (SampleIndex)
  uint64_t episode = 0;
  uint32_t step = 0;     // anchor step in the episode
  uint32_t dataset = 0;  // the mixture member it came from (0 for a single dataset)
  bool operator==(const SampleId&) const = default;
};

// The values are the C ABI's element type codes (capi/include/conveyor/conveyor_c.h CONVEYOR_UINT8,
// ...): only ever appended, never renumbered. kFloat16 is IEEE binary16; kBFloat16 is bfloat16 (a
// float32's upper 16 bits, rounded; base/float16.h).
enum class DType : uint8_t { kUint8, kBool, kFloat32, kInt32, kFloat16, kBFloat16 };

// What a tensor is for, carried beside it from the sample to the client (the wire's
// conveyor.v1.TensorRole), so no layer recognises a role from a tensor's name.
enum class TensorRole : uint8_t {
  kData,         // a stream's samples (frames, state, actions, audio, text), or an unpacked
                 // batch's other tensors (`<stream>_mask`, a mixture's tag)
  kPaddingMask,  // `<stream>_is_pad`, `<stream>_dim_is_pad`: true where a value is padding
  kSegmentIds,   // packing: which sample each token belongs to (0: padding)
  kPositions,    // packing: position of each token within its sample
  kSampleInfo,   // packing: per-sample bookkeeping; in a sample, a mixture's tag
};
size_t DTypeSize(DType t);             // bytes per element
std::string_view DTypeName(DType t);   // "uint8", "bool", "float32", "int32", "float16", "bfloat16"
// The .npy descr: "|u1", "|b1", "<f4", "<i4", "<f2"; empty for kBFloat16, which numpy has no type
// for (the .npy writers refuse it, naming the tensor: docs/sampling.md "Tensor dtypes").
std::string_view NumpyDescr(DType t);

// a * b, or false when it does not fit in 64 bits (config arithmetic, shape products).
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

}  // namespace conveyor
