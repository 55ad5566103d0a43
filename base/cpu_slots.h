// A bound on the pipeline workers that compute at once, shared by every pipeline given it.
//
// A server runs one pipeline per stream, each with its own `threads` workers, so 8 consumers of a
// server started with --threads 16 make 128 workers. With that many runnable threads on a few
// cores, the threads that move the bytes (gRPC's pollers, the stream handlers, an in-process
// client) wait behind a hundred decoders at every wake-up, and gRPC's flow control turns each
// wait into a stall: measured on 2 cores, 8 gRPC consumers of 16-worker streams got 0.02-0.21 of
// the offline pipeline, and 0.94-1.18 with the workers bounded to the cores (bench/RESULTS.md
// "8 consumers at 16 threads per stream").
//
// CpuSlots hands out `slots` permits in the order they were asked for. A pipeline worker holds
// one (CpuSlotHold) while it decodes a block or assembles a sample and gives it back between
// tasks, so the workers of all streams computing at once never exceed the slots, and a stream's
// share follows how many of its workers have work. A thread that blocks on something outside the
// process while holding one (a remote read, a retry's backoff) lends it out for the wait
// (ScopedSlotRelease), so a slow store does not idle the cores. Which worker runs which task
// never changes a byte; the slots change only when things run.
//
// Rule for holders: never wait for a thread that is queued for a slot while holding one. The
// pipeline holds one only around DecodeBlock and Assemble, whose only waits on other threads are
// short locks, and locks held across a remote read (LeRobot builds a video's index once, under a
// mutex, from the store): the reader lent its slot for the read and takes one back without
// queueing (an overdraft, paid back before any waiter is served), so it never waits for the
// holders waiting for it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class CpuSlots {
 public:
  explicit CpuSlots(int slots);  // at least 1
  CpuSlots(const CpuSlots&) = delete;
  CpuSlots& operator=(const CpuSlots&) = delete;

  int slots() const { return slots_; }

  // Blocks until a slot is free; waiters get slots in the order they asked.
  void Acquire();
  // Takes a slot at once, beyond the bound if none is free (the overdraft is paid back by the
  // next releases before any waiter gets one). For a thread coming back from a wait it lent its
  // slot for: it may hold a lock that slot holders are waiting for (a value built once under a
  // mutex, from a remote read), so making it queue could deadlock.
  void AcquireReturning();
  void Release();

  struct Stats {
    uint64_t acquires = 0;
    uint64_t waits = 0;         // acquires that found no slot free
    double wait_seconds = 0;    // summed over the waiters
    int in_use = 0;             // now (above `slots` while returning threads overdraw)
    int in_use_peak = 0;
    uint64_t overdrafts = 0;    // AcquireReturning calls that found no slot free
  };
  Stats stats() const;

 private:
  struct Waiter;
  const int slots_;
  mutable absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);  // slots - in use; negative while overdrawn
  std::deque<Waiter*> waiters_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

// Holds one slot of `slots` for its lifetime (nothing when `slots` is null) and makes it the
// calling thread's, so that a ScopedSlotRelease inside can lend it out. Nests: an inner hold on a
// thread that already holds a slot takes nothing.
class CpuSlotHold {
 public:
  explicit CpuSlotHold(CpuSlots* slots);
  ~CpuSlotHold();
  CpuSlotHold(const CpuSlotHold&) = delete;
  CpuSlotHold& operator=(const CpuSlotHold&) = delete;

 private:
  CpuSlots* slots_ = nullptr;  // null: took nothing
};

// Gives the calling thread's slot back for the scope's lifetime (a thread without one: nothing)
// and takes one again at its end without queueing (CpuSlots::AcquireReturning). For waits on the
// world outside the process: storage backends put one around a network transfer and a retry's
// backoff.
class ScopedSlotRelease {
 public:
  ScopedSlotRelease();
  ~ScopedSlotRelease();
  ScopedSlotRelease(const ScopedSlotRelease&) = delete;
  ScopedSlotRelease& operator=(const ScopedSlotRelease&) = delete;

 private:
  CpuSlots* slots_ = nullptr;  // the slots lent out; null: none
};

// The CPUs this process may compute on: the CPUs of its affinity mask, lowered by its cgroup's
// CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us, rounded up), at least 1.
// `source` (optional) says which bound it came from ("affinity" or the cgroup file).
int AvailableCpus(std::string* source = nullptr);

// The CPUs a quota of `quota` microseconds per `period` allows, rounded up; 0 for no limit
// (quota <= 0 or period <= 0). Exposed for tests.
int CpusOfQuota(int64_t quota, int64_t period);

}  // namespace conveyor
