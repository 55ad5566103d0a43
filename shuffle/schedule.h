// Schedule resolution: the automatic values of an order (OrderOptions::block_steps,
// window_blocks, and schedule version 2's BlockTable) from a dataset, a sample spec and a byte
// budget. They shape the global order, so they depend on the dataset, the spec and the budget
// only, never on the consumer count, the thread count or a server's own budget: a resized job and
// every server resolve the same order (docs/pipeline.md "Schedule versions").
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "datasets/dataset.h"
#include "format/manifest.h"
#include "sample/sample_spec.h"
#include "shuffle/order.h"

namespace conveyor {

// Fills in order->block_steps and order->window_blocks where they are 0 (automatic) and, for
// schedule version >= 2 outside naive mode, order->blocks: a block is about one GOP of the spec's
// first camera in anchor steps (version 2: whole GOPs per episode, measured on episode 0), a
// window as many blocks as half of `queue_bytes` holds twice over (two windows are decoded at
// once). `queue_bytes` is the budget of this dataset (a mixture member's share).
absl::Status ResolveOrder(const Dataset& dataset, const SampleSpec& spec, uint64_t queue_bytes,
                          OrderOptions* order);

// Bytes of the distinct frames one block of `block_steps` anchor steps needs, all cameras (RGB,
// at the spec's output size, or the stream's when it crops or keeps its own size).
uint64_t EstimateBlockFrameBytes(const SampleSpec& spec, const Manifest& manifest,
                                 uint64_t block_steps);

}  // namespace conveyor
