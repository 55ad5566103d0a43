// What a resumed job must find unchanged besides the dataset: the text that decides which
// samples a cursor's position names and what their bits are, so a checkpoint can pin it
// (client/client.h ClientOptions::expect_order_digest, the Loader's state_dict).
//
// It is the config with its `pipeline:` section left out (global_batch_size, threads, queue_bytes
// and max_epochs may change on a resume: a job resumes at any batch size and world size), plus
// what of that section shapes the order once resolved: the seed, the schedule version and mode,
// block and window sizes (a window follows queue_bytes), per mixture member too. Keys are emitted
// in the config's order, comments dropped. `files` is what of the files the config names decides
// the samples' bits (sample/tokenizer.h TokenizerIdentity: a tokenizer model's SHA-256), appended
// when not empty, so a changed model is a changed digest.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "pipeline/pipeline.h"

namespace conveyor {

absl::StatusOr<std::string> OrderIdentityText(std::string_view config_text, const PipelineOptions& resolved,
                                              std::string_view files = {});

}  // namespace conveyor
