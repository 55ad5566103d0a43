// The same-host transport's shared region (docs/serving.md "Same-host transport"): the layout the
// client (client/internal/shm_region.h, which creates it) and the server (server/shm_writer.h,
// which writes batch payloads into it) agree on. Header-only, no dependencies.
//
//   [0, 4096)               header: magic, data capacity, nonce, the client's release counter
//                           and its "starved" flag
//   [4096, 4096 + capacity) the data ring
//
// The server places each batch's payload contiguously at a monotonic position `pos` (bytes ever
// placed, with the tail of the ring skipped when a payload would wrap) at data offset
// pos % capacity, and tells the client `pos` in the batch's header message. The client releases
// batches in any order and publishes, in `released`, the position up to which every batch is
// released; the server places a payload only where it ends at most `released + ring` (the ring:
// the capacity, or less when the server's stream budget is smaller; StreamStart says which), and
// only while fewer than the offer's `batches_ahead` placed batches are unreleased. While the ring
// is full the server waits, as gRPC flow control would make it, unless the client says it is
// starved (its Next() waits with nothing received: it keeps every batch it was given); then the
// batch travels in messages.
#pragma once

#include <cstdint>

namespace conveyor::shm {

inline constexpr char kMagic[8] = {'C', 'V', 'Y', 'S', 'H', 'M', '0', '1'};
inline constexpr uint64_t kHeaderBytes = 4096;  // the data ring starts here (page aligned)
inline constexpr uint64_t kMagicOffset = 0;
inline constexpr uint64_t kCapacityOffset = 8;   // uint64: data ring bytes
inline constexpr uint64_t kNonceOffset = 16;     // 16 bytes the client chose
inline constexpr uint64_t kNonceBytes = 16;
inline constexpr uint64_t kReleasedOffset = 64;  // uint64, written by the client only
inline constexpr uint64_t kStarvedOffset = 72;   // uint64, 1 while the client's Next() waits empty
// Names are "conveyor-" and 32 lowercase hex digits, under /dev/shm.
inline constexpr const char* kNamePrefix = "conveyor-";

// Where a payload of `n` bytes goes after `head` (bytes placed so far): `head`, or the start of
// the next lap of a ring of `ring` bytes when it would wrap. REQUIRES: 0 < n <= ring.
inline uint64_t PlaceAfter(uint64_t head, uint64_t n, uint64_t ring) {
  return head % ring + n <= ring ? head : (head / ring + 1) * ring;
}

}  // namespace conveyor::shm
