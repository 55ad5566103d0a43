#include "sample/yaml_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::yaml {

std::string JoinNames(const std::set<std::string>& names) {
  std::string list;
  for (const auto& a : names) StrAppend(&list, list.empty() ? "" : ", ", a);
  return list;
}

absl::StatusOr<YAML::Node> Load(std::string_view text, std::string_view source) {
  // Configs come from requests too: bound the nesting before the recursive parser sees it (a
  // config is a few levels deep; thousands of '[' would only cost stack and time).
  constexpr int kMaxDepth = 32;
  constexpr size_t kMaxIndent = 128;
  int depth = 0, line = 1;
  size_t indent = 0;
  bool at_line_start = true, in_comment = false;
  char quote = 0;
  for (char c : text) {
    if (c == '\n') {
      ++line;
      at_line_start = true;
      indent = 0;
      in_comment = false;
      continue;
    }
    if (at_line_start) {
      if (c == ' ') {
        if (++indent > kMaxIndent) {
          return absl::InvalidArgumentError(StrCat(source, ":", line, ": indented more than ",
                                                   kMaxIndent, " columns: too deeply nested"));
        }
        continue;
      }
      at_line_start = false;
    }
    if (in_comment) continue;
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '#') {
      in_comment = true;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) {
        return absl::InvalidArgumentError(StrCat(source, ":", line, ": more than ", kMaxDepth,
                                                 " nested [ or {: too deeply nested"));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": not valid YAML: ", e.msg));
  }
}

absl::StatusOr<bool> Bool(std::string_view source, const YAML::Node& n, std::string_view what) {
  if (!n.IsScalar()) return ConfigError(source, n, StrCat(what, " must be true or false"));
  try {
    return n.as<bool>();
  } catch (const YAML::Exception&) {
    return ConfigError(source, n, StrCat(what, " must be true or false, not '", n.Scalar(), "'"));
  }
}

std::string Where(std::string_view source, const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0) return std::string(source);
  return StrCat(source, ":", m.line + 1, ":", m.column + 1);
}

absl::Status ConfigError(std::string_view source, const YAML::Node& n, std::string_view what) {
  return absl::InvalidArgumentError(StrCat(Where(source, n), ": ", what));
}

absl::Status CheckKeys(std::string_view source, const YAML::Node& map, std::string_view what,
                       const std::set<std::string>& allowed) {
  if (!map.IsMap()) return ConfigError(source, map, StrCat(what, " must be a mapping"));
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) return ConfigError(source, kv.first, StrCat("a key in ", what, " is not a name"));
    const std::string key = kv.first.as<std::string>();
    if (!allowed.count(key)) {
      return ConfigError(source, kv.first, StrCat("unknown key '", key, "' in ", what, " (known: ",
                                                  JoinNames(allowed), ")"));
    }
    // yaml-cpp keeps both copies of a repeated key and lookups see the first: a conflicting
    // config would silently use half of what it says.
    if (!seen.insert(key).second) {
      return ConfigError(source, kv.first, StrCat("key '", key, "' appears twice in ", what));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Number(std::string_view source, const YAML::Node& n, std::string_view what) {
  if (!n.IsScalar()) return ConfigError(source, n, StrCat(what, " must be a number"));
  try {
    const double v = n.as<double>();
    if (!std::isfinite(v)) return ConfigError(source, n, StrCat(what, " must be finite"));
    return v;
  } catch (const YAML::Exception&) {
    return ConfigError(source, n, StrCat(what, " must be a number, not '", n.Scalar(), "'"));
  }
}

absl::StatusOr<int64_t> Integer(std::string_view source, const YAML::Node& n, std::string_view what,
                                int64_t min, int64_t max) {
  if (!n.IsScalar()) return ConfigError(source, n, StrCat(what, " must be an integer"));
  int64_t v = 0;
  try {
    v = n.as<int64_t>();
  } catch (const YAML::Exception&) {
    return ConfigError(source, n, StrCat(what, " must be an integer, not '", n.Scalar(), "'"));
  }
  if (v < min || v > max) {
    return ConfigError(source, n, StrCat(what, " is ", v, "; it must be in [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<std::string> Word(std::string_view source, const YAML::Node& n, std::string_view what,
                                 const std::set<std::string>& allowed) {
  if (!n.IsScalar()) return ConfigError(source, n, StrCat(what, " must be a string"));
  const std::string v = n.Scalar();
  if (!allowed.count(v)) {
    return ConfigError(source, n, StrCat(what, " is '", v, "'; expected one of ", JoinNames(allowed)));
  }
  return v;
}

absl::StatusOr<std::vector<double>> Numbers(std::string_view source, const YAML::Node& n,
                                            std::string_view what, size_t min_len, size_t max_len) {
  if (!n.IsSequence()) return ConfigError(source, n, StrCat(what, " must be a list of numbers"));
  if (n.size() < min_len || n.size() > max_len) {
    return ConfigError(source, n, StrCat(what, " has ", n.size(), " entries; expected ", min_len,
                                 min_len == max_len ? "" : StrCat(" to ", max_len)));
  }
  std::vector<double> out;
  for (const auto& e : n) {
    ASSIGN_OR_RETURN(double v, Number(source, e, what));
    out.push_back(v);
  }
  return out;
}

}  // namespace conveyor::yaml
