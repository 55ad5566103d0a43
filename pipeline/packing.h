// Sequence packing and batch building: how the pipeline turns the samples of one step into a Batch.
//
// Without packing, StackSamples stacks every tensor along a new first axis and pads variable-length
// tensors (text) with a mask. With packing, each sample has a token cost (TokenCount, from the
// `packing.tokens` costs of the config); PackBestFitDecreasing groups samples into sequences of at
// most `max_tokens` tokens; PackSamples stacks the tensors in packed order and adds the metadata a
// model needs to place each sample's tokens in its sequence and mask attention per sample
// (segment_ids, positions, per-stream token ranges). docs/pipeline.md, "Sequence packing", has the
// config, the layout and the measured fill ratios.
//
// Everything here is a pure function of its arguments (no threads, no state), so the same samples
// give the same plan and the same batch bytes on every server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sample/sample_assembler.h"
#include "sample/sample_spec.h"
#include "format/manifest.h"
#include "pipeline/batch.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace conveyor {

// The token cost of one stream of the sample spec. The unit is the stream kind's: a frame (video,
// image), a step (lowdim), a second (audio, rounded up per sample), a byte (text), or a token
// (text with a tokenizer: its tensor's ids, BOS and EOS included).
struct StreamTokens {
  int64_t per_unit = 0;    // 0: the stream costs nothing (streams not listed in `tokens`)
  int64_t audio_rate = 0;  // audio: samples per second of the assembled window (resolved)
  // Video, image (`per_patch: P`): a frame costs ceil(H / P) * ceil(W / P) tokens at its own
  // output size (a bucket's, with buckets: sample/buckets.h), per_unit is then 1. 0: per_frame.
  int64_t patch = 0;
};

struct PackingSpec {
  bool enabled = false;    // false: StackSamples (fixed-size batches with padding masks)
  int64_t max_tokens = 0;  // tokens per packed sequence, in [1, 2^24]
  // Samples considered together by best-fit decreasing, in batch order; 0 = the whole local batch.
  // Smaller windows pack a little worse and keep samples of nearby batch positions together.
  size_t window = 0;
  // false (default): padded entries (`<stream>_is_pad` true) cost no tokens, so a sample at an
  // episode edge takes less room; the model selects the real entries with `<stream>_is_pad`.
  // true: every entry costs its tokens, so each sample of a spec costs the same (text aside).
  bool count_padding = false;
  std::vector<StreamTokens> tokens;  // one per SampleSpec::streams entry, same order

  // Parses the `packing:` section (a sibling of `streams:`) against `spec`:
  //   packing:
  //     enabled: true            # default true when the section is present
  //     max_tokens: 4096         # required when enabled
  //     window: 0
  //     count_padding: false
  //     tokens: {cam0: {per_frame: 256}, action: {per_step: 1}, audio: {per_second: 50},
  //              instruction: {per_byte: 1}, caption: {per_token: 1}}
  // Each stream takes its kind's key (per_frame, per_step, per_second, per_byte; per_token for a
  // text stream with a tokenizer, which refuses per_byte; integers >= 0); a video or image stream
  // may give per_patch: P instead of per_frame (a frame of H x W costs its P x P patches, so
  // each resolution bucket costs its own tokens).
  // An undefined or null node gives packing disabled. Errors are INVALID_ARGUMENT naming
  // `source`:line:col: unknown keys and streams, a key of the wrong kind, values out of range,
  // and a spec whose fixed-size streams alone cost more than max_tokens. `manifest` supplies the
  // rate of an audio stream without `rate:` in the sample spec; without it such a stream with a
  // per_second cost is an error.
  static absl::StatusOr<PackingSpec> FromYaml(const YAML::Node& packing_node,
                                              const SampleSpec& spec, std::string_view source,
                                              const Manifest* manifest = nullptr);
  // The same from a whole config file's text (its `packing` key; absent: packing disabled).
  static absl::StatusOr<PackingSpec> FromYaml(std::string_view whole_yaml, const SampleSpec& spec,
                                              std::string_view source,
                                              const Manifest* manifest = nullptr);
};

// The tokens `sample` costs: per stream in spec order, video/image frames * per_frame (frames =
// the tensor's first dimension; with per_patch, frames * ceil(H / P) * ceil(W / P)), lowdim steps * per_step, audio ceil(samples * per_second /
// rate), text bytes * per_byte or token ids * per_token; with count_padding false, entries whose `<stream>_is_pad` is true
// are not counted. Writes the per-stream counts to `per_stream` (resized to spec.streams.size())
// when it is not null. A tensor missing from the sample counts 0 (CountTokens reports it).
int64_t TokenCount(const Sample& sample, const SampleSpec& spec, const PackingSpec& packing,
                   std::vector<int64_t>* per_stream);

// TokenCount of each sample. INVALID_ARGUMENT naming the sample index and its token count when a
// sample costs more than max_tokens (it is not truncated: cutting a stream would change what the
// sample holds, e.g. the action targets, and the fix is a larger max_tokens or a smaller spec), or
// when a stream with a token cost has no tensor.
absl::StatusOr<std::vector<int64_t>> CountTokens(std::span<const Sample> samples,
                                                 const SampleSpec& spec,
                                                 const PackingSpec& packing);

// Which samples share each packed sequence. Sequences hold indices into the batch, in batch order.
struct PackPlan {
  std::vector<std::vector<size_t>> sequences;
  int64_t tokens_used = 0;  // sum over all items
  int64_t max_tokens = 0;   // the capacity of each sequence
  // tokens_used / (sequences * max_tokens); 0 for an empty plan.
  double fill_ratio() const;
};

// Best-fit decreasing, deterministic. Items are taken in windows of `window` consecutive items
// (0: one window of all). Within a window, by tokens descending (ties: lower index first), each
// item goes into the open sequence with the least room left that still fits it (ties: the lower
// sequence number), else into a new sequence; a window's sequences are closed at its end. Each
// sequence lists its items in ascending index. REQUIRES: 0 <= tokens[i] <= max_tokens (an item
// over max_tokens would get a sequence of its own). O(n log n).
PackPlan PackBestFitDecreasing(std::span<const int64_t> tokens, int64_t max_tokens, size_t window);

// First-fit in batch order (the baseline): each item into the lowest-numbered open sequence with
// room, else a new one; windows as above. O(n * sequences).
PackPlan PackFirstFit(std::span<const int64_t> tokens, int64_t max_tokens, size_t window);

// Stacks the samples into one batch: each tensor `<name>` becomes [b, ...] in one HostBuffer
// (64-byte aligned offsets; pinned when asked and possible). Tensors whose first dimension varies
// between samples are padded with zeros at the end of that axis to the longest and get a bool mask
// `<name>_mask` [b, max_len] (true = real entry); text streams always get one, so a batch's
// tensor names do not depend on its contents. Batch.ids come from the samples, in order; the
// caller sets cursor and consumer. INVALID_ARGUMENT for no samples, or when samples differ in
// tensor names, dtypes, or dimensions other than the first (naming the tensor and sample).
// With `buffers`, the batch is built in the buffer it gives (pipeline/batch.h); a large batch
// is filled on up to `threads` threads (the same bytes at any count).
absl::StatusOr<Batch> StackSamples(std::vector<Sample> samples, const SampleSpec& spec,
                                   bool pinned, const BatchBuffers& buffers = nullptr, int threads = 1);

// Packs the samples as `plan` says: the sample tensors as StackSamples makes them, stacked in
// packed order (sequence 0's samples, then sequence 1's, ...; Batch.ids in the same order), plus,
// with S sequences, n samples and K = spec.streams.size() (all int32):
//   segment_ids    [S, max_tokens]  1-based slot of the sample within its sequence; 0 = padding
//   positions      [S, max_tokens]  position within the token's own sample (from 0); 0 = padding
//   sample_sequence [n], sample_offset [n]  the sequence and first token of each sample
//   stream_offsets [n, K], stream_lengths [n, K]  each stream's token range in the sequence; a
//     sample's tokens are laid out stream by stream in spec order, so its ranges tile its segment
// `tokens` are the samples' token counts (CountTokens) in batch order. INVALID_ARGUMENT when the
// plan does not place every sample exactly once, a sequence is over max_tokens, or `tokens`
// disagrees with the samples.
absl::StatusOr<Batch> PackSamples(std::vector<Sample> samples, const SampleSpec& spec,
                                  const PackingSpec& packing, std::span<const int64_t> tokens,
                                  const PackPlan& plan, bool pinned,
                                  const BatchBuffers& buffers = nullptr, int threads = 1);

}  // namespace conveyor
