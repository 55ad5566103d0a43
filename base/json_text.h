// JSON text that never throws on the bytes it was given. Names and messages reach JSON from data
// files (a tar member's name, a .npy header's dtype, a stream name in a manifest, an error that
// quotes them), and nlohmann::json's dump() throws type_error 316 on a string that is not UTF-8,
// which ends a process that does not catch it (found by tests/fuzz/webdataset_fuzz.cc). Invalid
// bytes are written as U+FFFD instead, as Python's errors="replace" does.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace conveyor {

// `indent` as dump()'s: -1 one line, N spaces per level.
inline std::string JsonText(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace conveyor
