// The pipeline: turns a dataset and a sample spec into the batches of one consumer (training
// rank), in a global order that is a pure function of (dataset fingerprint, seed, epoch), from any
// cursor. See docs/pipeline.md.
//
// Global batch `step` of epoch `epoch` is positions [step * B, (step + 1) * B) of the epoch's
// order (EpochOrder; B = global_batch_size; an epoch has floor(samples / B) steps, the remainder
// is dropped); consumer i of N gets the i-th slice of B / N positions. Nothing depends on N, the
// thread count or the machine: a job resumed with another N but the same B continues the same
// global sequence. A start cursor with a position (base/types.h) starts the batches at that
// sample position instead, at any B: a job resumed with another B (a single dataset) continues
// the same global sample sequence too; its first epoch ends where fewer than B positions are left.
//
// Concurrency lives here and only here: `threads` workers, each with its own SampleAssembler,
// take tasks in order (pre-decode a block's frames, assemble a sample); results wait in a reorder
// buffer bounded in bytes; Next() hands out batches in order. Backpressure: no task is issued
// while the samples in flight would exceed the byte budget, so the readers stop when the
// consumer does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "sample/sample_assembler.h"
#include "datasets/dataset.h"
#include "pipeline/batch.h"
#include "pipeline/frame_cache.h"
#include "shuffle/order.h"
#include "base/cpu_slots.h"
#include "pipeline/packing.h"
#include "pipeline/source.h"

namespace conveyor {

// Ceilings on config values, whatever asks for them (a config file, a request, a flag).
inline constexpr uint64_t kMaxGlobalBatchSize = 1ull << 20;
inline constexpr uint64_t kMaxQueueBytes = 1ull << 40;
inline constexpr uint64_t kMaxThreads = 1024;
inline constexpr uint64_t kMaxScheduleValue = 1ull << 20;  // block_steps, window_blocks

struct PipelineOptions {
  uint64_t seed = 0;
  uint64_t global_batch_size = 32;
  uint32_t consumer = 0;
  uint32_t consumers = 1;
  OrderOptions order;          // block_steps = window_blocks = 1: naive global shuffle
  bool schedule_given = false;  // the config has a pipeline.schedule section (NaiveOrderWarning)
  int threads = 0;             // 0: one per core
  uint64_t queue_bytes = 512ull << 20;  // samples and pre-decoded frames in flight
  bool pinned = false;         // batches in pinned host memory (CUDA)
  uint64_t max_epochs = 0;     // stop after this many epochs (0: never)
  std::optional<PackingSpec> packing;  // packed sequences instead of stacked samples
  // A mixture: each member's schedule (resolved from `order` per member by ResolveSchedule).
  std::vector<OrderOptions> member_orders;
  // `buckets: {by: STREAM}`: the most elements of that stream's stored shapes over the dataset,
  // resolved by ResolveSchedule from the member index (0: not resolved, or no such buckets). The
  // memory estimate prices the stream's tensor at this size, not at its first sample's shape.
  uint64_t largest_bucket_elements = 0;
  // Decoded frames kept across epochs and shared with every pipeline given the same cache
  // (pipeline/frame_cache.h); null: none. GOP mode: a block whose frames are all cached is not
  // decoded. Changes where pixels come from, never what they are, nor the order.
  std::shared_ptr<DecodedFrameCache> frame_cache;
  // A bound on the workers computing at once, shared by every pipeline given the same slots
  // (base/cpu_slots.h): a server gives all its streams one, sized to its cores. Each worker holds
  // a slot while it decodes a block or assembles a sample. Changes when work runs, never a byte.
  // Null: none (the workers are bounded by `threads` alone).
  std::shared_ptr<CpuSlots> cpu_slots;

  // Reads the `pipeline:` (and `packing:`) sections of a config file; keys not given keep the
  // values already in *this. Unknown keys are errors naming file:line:col.
  absl::Status MergeYaml(std::string_view yaml, const SampleSpec& spec, const Manifest& manifest,
                         std::string_view source);
};

struct PipelineStats {
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t skipped = 0;          // on_error: skip
  // Left out of the order by the config's `quarantine:` (sample/quarantine.h), per epoch.
  uint64_t quarantined_episodes = 0;
  uint64_t quarantined_samples = 0;
  uint64_t bytes = 0;            // tensor bytes handed out
  uint64_t frames_decoded = 0;   // video
  uint64_t frames_decoded_nvdec = 0;  // of frames_decoded, on NVDEC (`decode: gpu`)
  uint64_t frames_delivered = 0;
  uint64_t prefetch_hits = 0;    // frames served from the window prefetch (pre-decoded blocks)
  uint64_t prefetch_misses = 0;
  // The decoded-frame cache (PipelineOptions::frame_cache), in frames of pre-decoded blocks:
  // found there (not decoded), and decoded because some frame of their block was not.
  uint64_t frame_cache_hits = 0;
  uint64_t frame_cache_misses = 0;
  uint64_t blocks_from_frame_cache = 0;  // blocks not decoded at all
  // Epoch orders (shuffle/order.h, O(blocks) to build) after each member's first: built ahead by
  // a worker while the epoch before was still running, or built late by the walker under the
  // pipeline's lock when it reached the epoch (every worker and the consumer waited meanwhile:
  // the epoch-boundary gap this planning removes; docs/pipeline.md "Epoch boundaries").
  uint64_t epoch_orders_planned_ahead = 0;
  uint64_t epoch_orders_built_late = 0;
  // Taking each epoch's last batch: the next epoch's first batch was already planned (its
  // orders built) in how many boundaries, and how many of its samples were already assembled.
  uint64_t epoch_boundaries = 0;
  uint64_t boundaries_planned_ahead = 0;
  uint64_t next_epoch_samples_ready = 0;
  uint64_t samples_ready = 0;      // now: the samples Next() can hand out in order without waiting,
                                   // counted up to 4 batches (at least 64)
  uint64_t queue_bytes = 0;        // reorder buffer + window prefetch, now
  uint64_t queue_bytes_peak = 0;   // reorder buffer + window prefetch, at most
  uint64_t prefetch_bytes_peak = 0;  // the window prefetch, at most
  double seconds = 0;              // since Create
  double decode_seconds = 0;       // workers pre-decoding blocks (summed over workers)
  double assemble_seconds = 0;     // workers assembling samples (summed)
  double batch_seconds = 0;        // Next() building batches
  double wait_seconds = 0;         // Next() waiting for samples (the consumer starved)
  double worker_idle_seconds = 0;  // workers waiting for budget or tasks (backpressure)
  double cpu_slot_wait_seconds = 0;  // workers with a task waiting for a CPU slot (summed)
  double fill_ratio_sum = 0;       // packing: sum of per-batch fill ratios
  std::vector<uint64_t> member_samples;  // samples handed out per dataset (mixture member)
  double amplification() const {
    return frames_delivered ? static_cast<double>(frames_decoded) / frames_delivered : 0;
  }
};

// One dataset of a mixture, as the pipeline sees it (conveyor batches --stats, bench, metrics).
struct MixtureProgress {
  std::string name;
  double requested_share = 0;      // of every global batch
  uint64_t samples_per_epoch = 0;  // the dataset's own samples (one of its epochs)
  double epochs = 0;               // its epochs the global sequence has gone through so far
};

class Pipeline {
 public:
  // INVALID_ARGUMENT when the batch size is not a multiple of the consumer count, the consumer
  // index is out of range, or an epoch has no full batch; OUT_OF_RANGE (an error, never "end")
  // for a cursor past the end of an epoch or past the last epoch, naming the valid range.
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(const Dataset& dataset,
                                                          const SampleSpec& spec,
                                                          PipelineOptions options, Cursor start);
  // A dataset or a mixture (pipeline/source.h; `spec` parsed against source.manifest()). The
  // source must outlive the pipeline. A mixture's global batch takes each member's share of
  // positions (shuffle/mixture.h); an epoch is sum(member samples) / global_batch_size steps.
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(const Source& source,
                                                          const SampleSpec& spec,
                                                          PipelineOptions options, Cursor start);
  ~Pipeline();  // cancels and joins the workers

  // The samples of epoch `epoch`'s positions, in order, as the pipeline would hand them out (no
  // sample is decoded): every position of a single dataset (the same at any global batch size),
  // or the steps_per_epoch x global_batch_size positions a mixture lays out at
  // options.global_batch_size. What the coverage audit computes expected digests from.
  static absl::StatusOr<std::vector<SampleId>> EpochSequence(const Source& source,
                                                             const SampleSpec& spec,
                                                             PipelineOptions options, uint64_t epoch);

  // The next batch, in order; std::nullopt at the end of the data (after max_epochs), which is
  // not an error (tf.data's end_of_sequence). CANCELLED after Cancel(); a sample error
  // (on_error: fail) as it happened, naming the sample. Any error status is final.
  absl::StatusOr<std::optional<Batch>> Next();
  void Cancel();
  // Builds the batches of later Next() calls in these buffers (pipeline/batch.h; a server's
  // same-host region). Called from the thread that calls Next().
  void SetBatchBuffers(BatchBuffers buffers);

  uint64_t num_samples() const;
  uint64_t steps_per_epoch() const;
  // The cursor of the first batch, with its position: the start cursor normalized (a position
  // with no whole batch left in its epoch is the next epoch's first).
  Cursor start() const;
  // Per dataset (one entry for a single dataset), at the cursor of the next batch.
  std::vector<MixtureProgress> Mixture() const;
  // The options in force, with automatic values (block_steps, window_blocks) resolved.
  const PipelineOptions& options() const;
  PipelineStats stats() const;

 private:
  struct Impl;
  explicit Pipeline(std::unique_ptr<Impl> impl);
  // Everything Create sets up before the workers start: options checked, schedule resolved,
  // members, sample indexes, the start cursor normalized.
  static absl::StatusOr<std::unique_ptr<Impl>> Prepare(const Source& source, const SampleSpec& spec,
                                                       PipelineOptions options, Cursor start);
  std::unique_ptr<Impl> impl_;
};

// Fills in the automatic schedule values (order.block_steps, order.window_blocks = 0) by
// shuffle/schedule.h's ResolveOrder with options->queue_bytes, from the figures measured here on
// the dataset (its first episode's keyframes, its sample index; pipeline/schedule_inputs.cc). A
// server resolves them from the config before it applies its own, smaller byte budget, so it
// serves the order the config names.
absl::Status ResolveSchedule(const Dataset& dataset, const SampleSpec& spec, PipelineOptions* options);
// A mixture resolves each member's schedule (options->member_orders) with an equal share of
// queue_bytes.
absl::Status ResolveSchedule(const Source& source, const SampleSpec& spec, PipelineOptions* options);

// The most memory one consumer's pipeline of these (resolved) options holds, estimated from the
// spec and the manifest before anything is decoded, so that a server can refuse a request it
// cannot afford instead of finding out while decoding it. Saturates at UINT64_MAX.
struct MemoryEstimate {
  uint64_t sample_bytes = 0;       // one sample's tensors
  uint64_t batch_bytes = 0;        // one consumer batch (global_batch_size / consumers samples)
  uint64_t window_prefetch_bytes = 0;  // pre-decoded frames of two GOP windows (0 when naive)
  uint64_t in_flight_bytes = 0;    // the reorder buffer: samples decoded ahead of Next()
  uint64_t total = 0;              // window prefetch + in flight + two batch buffers
};
MemoryEstimate EstimateMemory(const Dataset& dataset, const SampleSpec& spec,
                              const PipelineOptions& options);
MemoryEstimate EstimateMemory(const Source& source, const SampleSpec& spec,
                              const PipelineOptions& options);

}  // namespace conveyor
