// Cancellation that reaches blocking I/O without threading a token through every interface.
//
// The pipeline's worker pool (the one place that owns threads) installs a CancelScope on each
// worker with the pipeline's flag; storage backends that block (an HTTP transfer, a retry
// backoff) poll CancelRequested() and give up with CANCELLED. So cancelling a stream, or a
// server draining on SIGTERM, aborts a transfer in flight instead of waiting for a slow store.
// Readers and decoders stay synchronous and thread-agnostic: they never see the flag.
#pragma once

#include <atomic>

namespace conveyor {

namespace cancel_internal {
inline thread_local const std::atomic<bool>* current = nullptr;
}  // namespace cancel_internal

// True when the calling thread runs under a CancelScope whose flag is set.
inline bool CancelRequested() {
  const std::atomic<bool>* f = cancel_internal::current;
  return f != nullptr && f->load(std::memory_order_relaxed);
}

// Installs `flag` for the calling thread for the scope's lifetime (nests: restores the outer
// one). REQUIRES: `flag` outlives the scope.
class CancelScope {
 public:
  explicit CancelScope(const std::atomic<bool>* flag) : outer_(cancel_internal::current) {
    cancel_internal::current = flag;
  }
  ~CancelScope() { cancel_internal::current = outer_; }
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  const std::atomic<bool>* outer_;
};

}  // namespace conveyor
