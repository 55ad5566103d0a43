#include "client/internal/message_source.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace conveyor::client {

MessageSource::MessageSource(std::string target, BlockAllocator allocate)
    : target_(std::move(target)), allocate_(std::move(allocate)) {}

absl::Status MessageSource::Take(wire::Message& m, InboundPayload* p) {
  // A batch whose payload lies elsewhere, on a stream whose carrier for it was not granted.
  if (m.in_shared_memory || m.payload_striped) {
    return absl::DataLossError(absl::StrCat("server ", target_, " sent a batch whose payload is ",
                                            m.in_shared_memory ? "in shared memory" : "striped",
                                            " on a stream that was not granted that carrier"));
  }
  if (m.header) {
    ASSIGN_OR_RETURN(p->storage, allocate_(p->bytes));
    p->filled = 0;
  }
  if (m.data_size == 0 && !m.data_at) return absl::OkStatus();
  if (m.offset != p->filled || p->filled + m.data_size > p->bytes) {
    return absl::DataLossError(absl::StrCat("server ", target_, ": payload bytes [", m.offset, ", ",
                                            m.offset + m.data_size, ") where offset ", p->filled, " of ",
                                            p->bytes, " was due"));
  }
  if (m.data_size > 0 && !m.data_at->Copy(p->storage->block.data + p->filled, m.data_size)) {
    return absl::DataLossError(absl::StrCat("server ", target_, " sent a truncated message"));
  }
  p->filled += m.data_size;
  return absl::OkStatus();
}

}  // namespace conveyor::client
