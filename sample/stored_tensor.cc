#include "sample/stored_tensor.h"

#include <algorithm>

#include <yaml-cpp/yaml.h>

#include "base/status_macros.h"
#include "base/strings.h"
#include "sample/sample_spec.h"
#include "sample/yaml_config.h"

namespace conveyor {

absl::Status ParseTensorPadding(std::string_view source, const YAML::Node& n, StreamSpec* s) {
  using yaml::ConfigError;
  if (n["overlong"] && !n["pad_to"]) {
    return ConfigError(source, n["overlong"], StrCat("stream '", s->name, "': overlong goes with pad_to"));
  }
  if (!n["pad_to"]) return absl::OkStatus();
  if (s->stored_shape.empty() || !n["shape"]) {
    return ConfigError(source, n["pad_to"],
                       StrCat("stream '", s->name, "': pad_to pads a tensor served in its stored "
                              "shape; give shape: stored"));
  }
  ASSIGN_OR_RETURN(s->pad_to, yaml::Integer(source, n["pad_to"], "pad_to", 1, int64_t{1} << 24));
  if (n["overlong"]) {
    ASSIGN_OR_RETURN(std::string v, yaml::Word(source, n["overlong"], "overlong", {"error", "truncate"}));
    s->pad_truncate = v == "truncate";
  }
  // The served shape: N rows of the stored rows' shape (the first sample's, as the dataset names it).
  s->stored_shape[0] = s->pad_to;
  return absl::OkStatus();
}

absl::StatusOr<ServedTensor> ServeStoredTensor(const SampleSpec& spec, size_t si,
                                               const std::vector<int64_t>& stored_in,
                                               const std::string& where) {
  const StreamSpec& s = spec.streams[si];
  const std::vector<int64_t> stored = stored_in.empty() ? std::vector<int64_t>{1} : stored_in;  // 0-d: [1]
  ServedTensor out;
  out.rows = stored[0];
  if (spec.buckets.by == static_cast<int>(si)) {  // one shape per batch: any shape
    out.shape.assign(stored.begin(), stored.end());
    return out;
  }
  if (s.pad_to > 0) {
    const bool rows_match = stored.size() == s.stored_shape.size() &&
                            std::equal(stored.begin() + 1, stored.end(), s.stored_shape.begin() + 1);
    if (!rows_match) {
      return absl::DataLossError(StrCat(
          where, ": stored shape ", ShapeText(stored), "; pad_to serves ", ShapeText(s.stored_shape),
          ", which takes [L", std::string(stored.size() > 1 ? ", ..." : ""),
          "] with rows of the stream's shape (its first sample's) and L at most ", s.pad_to));
    }
    if (stored[0] > s.pad_to && !s.pad_truncate) {
      return absl::DataLossError(StrCat(where, ": stored shape ", ShapeText(stored), " has ",
                                        stored[0], " rows, over pad_to ", s.pad_to,
                                        " (overlong: truncate keeps the first ", s.pad_to, ")"));
    }
    out.shape = s.stored_shape;
    out.rows = std::min(stored[0], s.pad_to);
    out.padded = true;
    return out;
  }
  if (!std::equal(stored.begin(), stored.end(), s.stored_shape.begin(), s.stored_shape.end())) {
    return absl::DataLossError(StrCat(
        where, ": stored shape ", ShapeText(stored), ", the stream is served as ",
        ShapeText(s.stored_shape),
        " (its first sample's shape); pad_to: N takes a varying first dimension, buckets: {by: ",
        s.name, "} any shape, one per batch (docs/sampling.md \"Tensors of varying shape\")"));
  }
  out.shape = s.stored_shape;
  return out;
}

}  // namespace conveyor
