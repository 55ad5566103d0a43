#include "base/cpu_slots.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>

#include "absl/synchronization/mutex.h"

namespace conveyor {
namespace {

// The slots the calling thread holds through a CpuSlotHold; null: none.
thread_local CpuSlots* held = nullptr;

// "QUOTA PERIOD" of cgroup v2's cpu.max ("max PERIOD": no limit); 0 when no limit or unreadable.
int CpusOfCpuMax(const std::string& path) {
  std::ifstream f(path);
  std::string quota;
  int64_t period = 0;
  if (!(f >> quota >> period) || quota == "max") return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str()) return 0;
  return CpusOfQuota(q, period);
}

int64_t ReadInt(const std::string& path) {
  std::ifstream f(path);
  int64_t v = 0;
  return (f >> v) ? v : 0;
}

// The tightest CPU quota from this process's cgroup up to the hierarchy's root; 0: none.
int CgroupCpus(std::string* where) {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  int best = 0;
  auto consider = [&](int cpus, const std::string& file) {
    if (cpus > 0 && (best == 0 || cpus < best)) {
      best = cpus;
      *where = file;
    }
  };
  while (std::getline(f, line)) {
    const size_t a = line.find(':');
    const size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string rel = line.substr(b + 1);
    const bool v2 = line.rfind("0::", 0) == 0;
    const bool v1 = ("," + controllers + ",").find(",cpu,") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/" + controllers;
    while (true) {
      while (rel.size() > 1 && rel.back() == '/') rel.pop_back();
      const std::string dir = rel == "/" ? root : root + rel;
      if (v2) {
        consider(CpusOfCpuMax(dir + "/cpu.max"), dir + "/cpu.max");
      } else {
        consider(CpusOfQuota(ReadInt(dir + "/cpu.cfs_quota_us"), ReadInt(dir + "/cpu.cfs_period_us")),
                 dir + "/cpu.cfs_quota_us");
      }
      if (rel.empty() || rel == "/") break;
      rel = rel.substr(0, rel.rfind('/'));
      if (rel.empty()) rel = "/";
    }
  }
  return best;
}

}  // namespace

struct CpuSlots::Waiter {
  bool granted = false;
  absl::CondVar cv;
};

CpuSlots::CpuSlots(int slots) : slots_(std::max(1, slots)), free_(slots_) {}

void CpuSlots::Acquire() {
  absl::MutexLock lock(&mu_);
  ++stats_.acquires;
  if (free_ > 0 && waiters_.empty()) {
    --free_;
  } else {
    // FIFO: a releasing thread hands its slot to the oldest waiter, so a stream whose workers
    // asked first is not overtaken by whichever thread the mutex happens to wake.
    ++stats_.waits;
    Waiter w;
    waiters_.push_back(&w);
    const auto t0 = std::chrono::steady_clock::now();
    while (!w.granted) w.cv.Wait(&mu_);
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ++stats_.in_use;
  stats_.in_use_peak = std::max(stats_.in_use_peak, stats_.in_use);
}

void CpuSlots::AcquireReturning() {
  absl::MutexLock lock(&mu_);
  ++stats_.acquires;
  if (free_ <= 0 || !waiters_.empty()) ++stats_.overdrafts;
  --free_;  // may go negative: the overdraft
  ++stats_.in_use;
  stats_.in_use_peak = std::max(stats_.in_use_peak, stats_.in_use);
}

void CpuSlots::Release() {
  absl::MutexLock lock(&mu_);
  --stats_.in_use;
  if (free_ < 0 || waiters_.empty()) {
    ++free_;  // pays back an overdraft first, or frees the slot
    return;
  }
  Waiter* w = waiters_.front();
  waiters_.pop_front();
  w->granted = true;
  w->cv.Signal();
}

CpuSlots::Stats CpuSlots::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

CpuSlotHold::CpuSlotHold(CpuSlots* slots) {
  if (slots == nullptr || held != nullptr) return;
  slots->Acquire();
  slots_ = slots;
  held = slots;
}

CpuSlotHold::~CpuSlotHold() {
  if (slots_ == nullptr) return;
  held = nullptr;
  slots_->Release();
}

ScopedSlotRelease::ScopedSlotRelease() : slots_(held) {
  if (slots_ == nullptr) return;
  held = nullptr;  // a hold made inside the scope takes a slot of its own
  slots_->Release();
}

ScopedSlotRelease::~ScopedSlotRelease() {
  if (slots_ == nullptr) return;
  slots_->AcquireReturning();
  held = slots_;
}

int CpusOfQuota(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::max<int64_t>(1, (quota + period - 1) / period));
}

int AvailableCpus(std::string* source) {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  std::string where = "affinity";
  if (cpus <= 0) {
    cpus = 1;
    where = "default";
  }
  std::string cgroup_file;
  const int quota = CgroupCpus(&cgroup_file);
  if (quota > 0 && quota < cpus) {
    cpus = quota;
    where = cgroup_file;
  }
  if (source != nullptr) *source = where;
  return cpus;
}

}  // namespace conveyor
