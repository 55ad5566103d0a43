// The warning `conveyor serve` and `conveyor batches` print for a config that names no schedule
// and so gets the naive order: for video every sample seeks and decodes from a keyframe, and a
// format read an episode at a time (RLDS) reads a record per sample once the dataset outgrows its
// cache. The decode-once order (`schedule: {mode: gop}`) gives every sample the same bits at the
// same cost per epoch, so the naive default only exists for the checkpoints that resume it.
#pragma once

#include <string>

#include "pipeline/pipeline.h"
#include "pipeline/source.h"
#include "sample/sample_spec.h"

namespace conveyor {

// "" when the config gives a schedule or the naive order costs nothing here (no video stream
// sampled and no dataset read whole episodes at a time); else what it costs and how to change it.
std::string NaiveOrderWarning(const Source& source, const SampleSpec& spec, const PipelineOptions& options);

}  // namespace conveyor
