// Checked reading of YAML configs (yaml-cpp), shared by every config section: the sample spec
// (sample/sample_spec.cc), packing and pipeline (pipeline/). Every error is INVALID_ARGUMENT and
// starts with "SOURCE:LINE:COLUMN: " so a user can go straight to the offending key.
//
// YAML::Node is only declared here, so this header does not pull yaml-cpp into whoever includes
// it; the .cc files that walk nodes include <yaml-cpp/yaml.h> themselves.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace conveyor::yaml {

// "SOURCE:LINE:COLUMN" of `n` (just SOURCE when the node has no position).
std::string Where(std::string_view source, const YAML::Node& n);
// INVALID_ARGUMENT "Where(n): what".
absl::Status ConfigError(std::string_view source, const YAML::Node& n, std::string_view what);
// Parses `text`; a syntax error names the line and column.
absl::StatusOr<YAML::Node> Load(std::string_view text, std::string_view source);

// `map` is a mapping whose keys are all in `allowed` ("unknown key 'x' in WHAT (known: ...)").
absl::Status CheckKeys(std::string_view source, const YAML::Node& map, std::string_view what,
                       const std::set<std::string>& allowed);
// "a, b, c" in set order.
std::string JoinNames(const std::set<std::string>& names);

absl::StatusOr<double> Number(std::string_view source, const YAML::Node& n, std::string_view what);
absl::StatusOr<int64_t> Integer(std::string_view source, const YAML::Node& n, std::string_view what,
                                int64_t min, int64_t max);
absl::StatusOr<bool> Bool(std::string_view source, const YAML::Node& n, std::string_view what);
// A string that must be one of `allowed`.
absl::StatusOr<std::string> Word(std::string_view source, const YAML::Node& n, std::string_view what,
                                 const std::set<std::string>& allowed);
// A list of min_len..max_len numbers.
absl::StatusOr<std::vector<double>> Numbers(std::string_view source, const YAML::Node& n,
                                            std::string_view what, size_t min_len, size_t max_len);

}  // namespace conveyor::yaml
