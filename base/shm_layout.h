// The same-host transport's shared region (docs/serving.md "Same-host transport"): the layout the
// server (server/internal/shm_sink.h, which creates the region and builds batches in it) and the client
// (client/internal/shm_region.h, which reads them in place) agree on. Header-only.
//
// The region is a memfd the server creates per stream and seals against shrinking and growing
// (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), so that neither side can take pages away from
// under the other's mapping. The client receives its descriptor once over a Unix socket under
// /dev/shm (StreamStart.shared_memory_socket), proving itself with the stream's token:
//
//   client -> server   the 16-byte token
//   server -> client   one byte, the descriptor attached (SCM_RIGHTS)
//   client -> server   one byte: 1 when it mapped the region and will read batches there, 0 not
//
//   [0, 4096)           header: magic, ring bytes (the server's), the client's release counter
//                       and its "starved" flag (the only bytes the client writes)
//   [4096, 4096 + ring) the data ring
//
// The server's pipeline builds each batch's buffer at a monotonic position `pos` (bytes ever
// placed, each start rounded up to 4096, with the tail of the ring skipped when a buffer would
// wrap) at data offset pos % ring, and tells the client `pos` in the batch's header message. The
// client releases batches in any order and publishes, in `released`, the position up to which
// every batch is released; the server places a batch only where it ends at most
// `released + ring`, and only while fewer than the offer's `batches_ahead` placed batches are
// unreleased. While the ring is full the server waits, as gRPC flow control would make it,
// unless the client says it is starved (its Next() waits with nothing received: it keeps every
// batch it was given); then the batch is built in ordinary memory and travels in messages.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace conveyor::shm {

inline constexpr char kMagic[8] = {'C', 'V', 'Y', 'S', 'H', 'M', '0', '2'};
inline constexpr uint64_t kHeaderBytes = 4096;  // the data ring starts here (page aligned)
inline constexpr uint64_t kMagicOffset = 0;
inline constexpr uint64_t kRingOffset = 8;       // uint64: data ring bytes
inline constexpr uint64_t kReleasedOffset = 64;  // uint64, written by the client only
inline constexpr uint64_t kStarvedOffset = 72;   // uint64, 1 while the client's Next() waits empty
inline constexpr uint64_t kTokenBytes = 16;
inline constexpr uint64_t kAlign = 4096;  // every batch starts on a page
// Socket names are "conveyor-" and 32 lowercase hex digits and ".sock", under /dev/shm.
inline constexpr const char* kSocketDir = "/dev/shm";
inline constexpr const char* kNamePrefix = "conveyor-";

// Where a buffer of `n` bytes goes after `head` (bytes placed so far): `head` rounded up to a
// page, or the start of the next lap of a ring of `ring` bytes (a multiple of kAlign) when it
// would wrap. REQUIRES: 0 < n <= ring.
inline uint64_t PlaceAfter(uint64_t head, uint64_t n, uint64_t ring) {
  const uint64_t h = (head + kAlign - 1) / kAlign * kAlign;
  const uint64_t span = (n + kAlign - 1) / kAlign * kAlign;
  return h % ring + span <= ring ? h : (h / ring + 1) * ring;
}

// This host as the transport sees it: the kernel's boot id and /dev/shm's device and inode.
// Equal for a client and a server that can share a region and reach each other's socket (the
// same machine and the same /dev/shm); empty when /dev/shm is not there.
inline std::string HostId() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat st {};
  if (stat(kSocketDir, &st) != 0) return "";
  return boot + ":" + std::to_string(static_cast<uint64_t>(st.st_dev)) + ":" +
         std::to_string(static_cast<uint64_t>(st.st_ino));
}

}  // namespace conveyor::shm
