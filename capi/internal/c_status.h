// What both C ABI libraries (libconveyor_c.so.1, libconveyor_video.so.1) do at their boundary: a
// failed Status becomes its code as an int and the thread's last error, a string handed out is
// malloc'd. INTERNAL: included by capi/'s .cc files only.
//
// Each library has its own last error: LastError() is an inline function's thread-local, and
// with hidden visibility and --exclude-libs every shared library holds its own copy, which its
// own *_last_error() returns.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"

namespace conveyor::capi {

inline std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

// Records `s` ("CODE: message") as the calling thread's last error and returns its code.
inline int Fail(const absl::Status& s) {
  LastError() = std::string(absl::StatusCodeToString(s.code())) + ": " + std::string(s.message());
  return static_cast<int>(s.code());
}

inline int Fail(absl::StatusCode code, const std::string& message) {
  return Fail(absl::Status(code, message));
}

// A malloc'd copy, released by the library's *_string_free (free).
inline char* Dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace conveyor::capi
