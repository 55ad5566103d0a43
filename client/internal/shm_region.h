// The client's side of the same-host transport (base/shm_layout.h): a region under /dev/shm that
// this client creates for one stream and offers to the server, which writes batch payloads into
// it. Batches view their tensors in place; releasing a batch (in any order) frees its bytes, and
// the region publishes how far, in order, everything is released.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace conveyor::client {

class ShmRegion : public std::enable_shared_from_this<ShmRegion> {
 public:
  // A new region with a data ring of `capacity` bytes (rounded up to 4096), mode 0600. Pages are
  // not touched: memory is used as the server fills it.
  static absl::StatusOr<std::shared_ptr<ShmRegion>> Create(uint64_t capacity);
  ~ShmRegion();  // unmaps; unlinks the name if still there
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& nonce() const { return nonce_; }
  uint64_t capacity() const { return capacity_; }
  // Removes the name once the server has opened the region (or refused it): nothing is left in
  // /dev/shm when either process dies.
  void Unlink();

  // The ring the server uses (StreamStart.shared_memory_ring): at most the capacity. Before the
  // first Accept. DATA_LOSS when it does not fit.
  absl::Status SetRing(uint64_t ring);
  uint64_t ring() const;
  // Tells the server that Next() waits with nothing received (the trainer keeps every batch it
  // got): a full ring then sends batches in messages instead of waiting for releases.
  void SetStarved(bool starved);

  // A payload of `n` bytes the server placed at `pos`: checked to be where the next payload may
  // be (after the last one, within one lap of what is released, not wrapping) and registered as
  // in use. DATA_LOSS naming what is wrong otherwise. Called by the receiving thread, in order.
  absl::StatusOr<const uint8_t*> Accept(uint64_t pos, uint64_t n);
  // The payload accepted at `pos` is no longer viewed (any thread, any order).
  void Release(uint64_t pos);
  uint64_t released() const;

 private:
  ShmRegion() = default;
  std::string name_, nonce_;
  uint64_t capacity_ = 0;
  uint8_t* base_ = nullptr;  // the whole mapping: header, then the ring
  size_t mapped_ = 0;
  bool linked_ = false;

  mutable absl::Mutex mu_;
  struct InUse {
    uint64_t pos, end;
    bool released;
  };
  std::deque<InUse> in_use_ ABSL_GUARDED_BY(mu_);  // accepted payloads, in placement order
  uint64_t ring_ ABSL_GUARDED_BY(mu_) = 0;      // = capacity_ unless the server uses less
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;      // end of the last accepted payload
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;  // what the header says
};

}  // namespace conveyor::client
