// The server's side of the same-host transport (base/shm_layout.h): a client on this host offers a
// region it created under /dev/shm; the stream's handler places each batch's payload in it and
// sends only the header over gRPC. One per stream; not thread-safe (the handler thread uses it).
//
// The client is not trusted: the name must be one Conveyor makes, the file a regular file of the
// offered size with the offered magic and nonce. The server maps it and copies payloads in with
// memcpy (pwrite into tmpfs ran at a fifth of memcpy's speed); a client that shrinks its file
// under the mapping turns the copy's page fault into SIGBUS, which a handler installed for
// guarded copies turns back into DATA_LOSS for that stream only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace conveyor {

class ShmWriter {
 public:
  // Opens the client's region /dev/shm/`name`. FAILED_PRECONDITION (a reason to send back) when
  // it is not there (another host, another /dev/shm, another user) or does not match the offer.
  // The server uses a ring of min(capacity, max_ring) bytes (its stream budget bounds what it
  // writes there, and the pages it touches), with at most `batches_ahead` (at least 1) placed
  // batches unreleased.
  static absl::StatusOr<std::unique_ptr<ShmWriter>> Open(const std::string& name, const std::string& nonce,
                                                         uint64_t capacity, uint64_t max_ring,
                                                         uint32_t batches_ahead);
  ~ShmWriter();
  ShmWriter(const ShmWriter&) = delete;
  ShmWriter& operator=(const ShmWriter&) = delete;

  uint64_t capacity() const { return capacity_; }
  uint64_t ring() const { return ring_; }

  // Places `n` bytes of `data` in the ring and returns their position; nullopt when that batch
  // travels in gRPC messages instead: `n` exceeds the ring, the ring is full while the client is
  // starved (it keeps every batch it got; full_batches()), or /dev/shm ran out of space (then for
  // the rest of the stream: unusable_reason()). Waits while the client has not released enough
  // (bytes, or batches_ahead), polling its counters, as gRPC flow control would make it wait,
  // until `stop()` says the stream is over (CANCELLED). DATA_LOSS when the region can no longer be
  // read or written.
  absl::StatusOr<std::optional<uint64_t>> Place(const uint8_t* data, uint64_t n,
                                                const std::function<bool()>& stop);
  // Seconds spent waiting for the client to release space, and bytes placed.
  double wait_seconds() const { return wait_seconds_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t full_batches() const { return full_batches_; }
  const std::string& unusable_reason() const { return unusable_reason_; }

 private:
  ShmWriter(int fd, std::string name, uint64_t capacity) : fd_(fd), name_(std::move(name)), capacity_(capacity) {}
  absl::StatusOr<uint64_t> Released();
  absl::StatusOr<bool> Starved();
  int fd_;
  uint8_t* base_ = nullptr;  // the mapping: header, then the ring
  std::string name_;
  uint64_t capacity_;
  uint64_t ring_ = 0;
  uint32_t batches_ahead_ = 1;
  uint64_t head_ = 0;  // bytes placed (monotonic, skipped tails included)
  std::deque<uint64_t> unreleased_;  // ends of the placed payloads not yet released
  double wait_seconds_ = 0;
  uint64_t bytes_ = 0;
  uint64_t full_batches_ = 0;
  bool usable_ = true;
  std::string unusable_reason_;
};

}  // namespace conveyor
