// What the pipeline reads off a dataset, a spec and a manifest before it decodes anything: the
// figures shuffle/schedule.h resolves an order from (shuffle/ reads no dataset itself), one
// sample's bytes, whether a spec has video. Internal to pipeline/ (schedule_inputs.cc,
// memory_estimate.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "format/manifest.h"
#include "sample/sample_spec.h"
#include "shuffle/order.h"
#include "shuffle/schedule.h"

namespace conveyor {

// The spec's video streams as block sizing sees them (rates and frame sizes from `manifest`).
std::vector<ScheduleCamera> ScheduleCameras(const SampleSpec& spec, const Manifest& manifest);

// The figures ResolveOrder needs to resolve `order` for `spec` on `dataset`: episode 0's
// keyframes and the episode starts (quarantined episodes left out) only when
// ScheduleNeedsOf(order) asks for them. Errors: the quarantine file or the sample index.
absl::StatusOr<ScheduleInputs> MeasureSchedule(const Dataset& dataset, const SampleSpec& spec,
                                               const OrderOptions& order);

// Bytes of one sample's tensors, from the spec and the manifest (text counted as 256 bytes, or
// 256 token ids without a max_tokens). `largest_bucket_elements`: the buckets' stream (`buckets:
// {by: STREAM}`) priced at this many elements when it is more than the stream's first sample's
// (PipelineOptions::largest_bucket_elements).
uint64_t EstimateSampleBytes(const SampleSpec& spec, const Manifest& manifest,
                             uint64_t largest_bucket_elements = 0);

bool HasVideo(const SampleSpec& spec);

}  // namespace conveyor
