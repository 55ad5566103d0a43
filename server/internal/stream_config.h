// Internal to the server: a config as a server serves it, resolved once from its text (the
// files it was started with, or a request's own).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "pipeline/pipeline.h"
#include "sample/sample_spec.h"

namespace conveyor {

// A resolved config: the sample spec and pipeline options of one config text.
struct Config {
  std::string name;
  std::string text;
  std::string digest;        // what a failing-over client compares (StreamStart.config_digest)
  std::string order_digest;  // pipeline/order_digest.h
  SampleSpec spec;
  PipelineOptions options;
  uint64_t samples_per_epoch = 0;
  uint64_t steps_per_epoch = 0;
};

// The config `text` named `name` against the served data; `source` names where the text came
// from in errors (a file's relative paths, a tokenizer model, resolve from it).
// schedule_version: 0 = the config's; 1 to 4 overrides it (a resumed job's recorded version).
absl::StatusOr<std::shared_ptr<Config>> ResolveConfig(const Source& ds, std::string name, std::string text,
                                                      std::string_view source, uint32_t schedule_version = 0);

}  // namespace conveyor
