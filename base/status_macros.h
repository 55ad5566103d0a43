// Status plumbing shared by every Conveyor library. absl (as packaged in Debian 12) has Status and
// StatusOr but not the RETURN_IF_ERROR / ASSIGN_OR_RETURN macros, so they live here.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CONVEYOR_CONCAT_IMPL(a, b) a##b
#define CONVEYOR_CONCAT(a, b) CONVEYOR_CONCAT_IMPL(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status conveyor_status_ = (expr);         \
    if (!conveyor_status_.ok()) return conveyor_status_; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, StatusOrExpr()): declares/assigns x or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(CONVEYOR_CONCAT(conveyor_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(*tmp)

namespace conveyor {

// Prefixes a status message with context ("reading shard s3://b/x.cvs: ..."), keeping the code.
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), std::string(context) + ": " + std::string(s.message()));
}

}  // namespace conveyor
