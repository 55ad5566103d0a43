// The one place Conveyor starts threads.
//
// A WorkerPool owns a fixed set of threads running one body each; every thread runs under a
// CancelScope of the pool's flag (base/cancel.h), so Cancel() reaches blocking storage reads in
// flight. Joining is RAII: the destructor cancels and joins, so no thread outlives its owner.
// ParallelFor runs indexed tasks on such a pool with at most `threads` in flight, stops starting
// new ones at the first error, and returns the error of the lowest failed index, so a parallel
// loop reports the same error as a sequential one.
//
// Bounds on work in flight beyond the thread count (the pipeline's byte budget) and the order of
// results belong to the caller; this header only owns the threads' lifetime and cancellation.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace conveyor {

class WorkerPool {
 public:
  // Starts `threads` (at least 1) threads, thread i running body(i). `name` (at most 15 bytes
  // kept) names the threads for debuggers and `top -H`.
  WorkerPool(std::string name, int threads, std::function<void(int worker)> body);
  // Cancel() and Join().
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Sets the flag the threads run under. Bodies see it through CancelRequested() or cancelled()
  // and are expected to return soon; storage reads in flight give up with CANCELLED.
  void Cancel() { cancel_.store(true); }
  bool cancelled() const { return cancel_.load(std::memory_order_relaxed); }
  // Waits for every body to return. Idempotent; must not be called from a pool thread.
  void Join();
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  std::atomic<bool> cancel_{false};
  std::vector<std::thread> threads_;
};

// Runs fn(i) for every i in [0, n) on min(threads, n) threads (the calling thread waits). Indices
// start in increasing order; after a task fails no further index starts, and the result is the
// error of the lowest index that failed (OK when none did). The tasks run under the calling
// thread's cancellation: if it runs under a CancelScope, so do they, and indices not started when
// the flag is set fail with CANCELLED. threads <= 1 runs the loop on the calling thread.
absl::Status ParallelFor(std::string name, int threads, size_t n,
                         const std::function<absl::Status(size_t i)>& fn);

}  // namespace conveyor
