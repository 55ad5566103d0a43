// features.json, the TFDS description of an RLDS dataset's records, as the features Conveyor
// reads: each leaf feature with the key it has in a record ("steps/observation/image": nested
// FeaturesDicts joined by '/'), whether it is per step (under a Dataset / Sequence feature), its
// kind, per-step shape, dtype and encoding.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::rlds {

enum class FeatureKind { kImage, kTensor, kText };

struct FeatureSpec {
  std::string key;        // the tf.train.Example key: "steps/action", "episode_metadata/file_path"
  FeatureKind kind = FeatureKind::kTensor;
  bool per_step = false;  // under "steps" (a Dataset or Sequence feature)
  std::vector<int64_t> shape;  // per step (image [H, W, C]; tensor dims; [] for a scalar)
  std::string dtype;      // "float32", "int64", "bool", "uint8", "string", ...
  std::string encoding;   // image: "jpeg" / "png"; tensor: "none"
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct Features {
  std::vector<FeatureSpec> features;  // leaves Conveyor reads, in features.json's order
  std::vector<std::string> skipped;   // "key (why)": leaves it cannot read
};

// `source` names features.json in errors.
absl::StatusOr<Features> ParseFeatures(std::string_view json, const std::string& source);

// The stream name of a feature: its key without "steps/", '/' turned into '.'
// ("steps/observation/image" -> "observation.image").
std::string StreamName(const FeatureSpec& f);

}  // namespace conveyor::rlds
