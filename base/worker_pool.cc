#include "base/worker_pool.h"

#include <pthread.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "base/cancel.h"

namespace conveyor {

WorkerPool::WorkerPool(std::string name, int threads, std::function<void(int worker)> body) {
  name.resize(std::min<size_t>(name.size(), 15));  // the kernel's limit for a thread's name
  threads_.reserve(static_cast<size_t>(std::max(threads, 1)));
  for (int i = 0; i < std::max(threads, 1); ++i) {
    threads_.emplace_back([this, body, i] {
      CancelScope scope(&cancel_);
      body(i);
    });
    pthread_setname_np(threads_.back().native_handle(), name.c_str());
  }
}

WorkerPool::~WorkerPool() {
  Cancel();
  Join();
}

void WorkerPool::Join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

absl::Status ParallelFor(std::string name, int threads, size_t n,
                         const std::function<absl::Status(size_t i)>& fn) {
  const std::atomic<bool>* outer = cancel_internal::current;
  std::vector<absl::Status> status(n);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto loop = [&] {
    CancelScope scope(outer);  // the caller's cancellation, not the pool's own flag
    for (;;) {
      if (failed.load()) return;
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      status[i] = CancelRequested() ? absl::CancelledError("cancelled before it started") : fn(i);
      if (!status[i].ok()) failed.store(true);
    }
  };
  const size_t workers = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), n);
  if (workers <= 1) {
    loop();
  } else {
    WorkerPool pool(std::move(name), static_cast<int>(workers), [&](int) { loop(); });
    pool.Join();
  }
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace conveyor
