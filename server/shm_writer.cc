#include "server/shm_writer.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/shm_layout.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor {
namespace {

bool ValidName(const std::string& name) {
  const std::string prefix = shm::kNamePrefix;
  if (name.size() != prefix.size() + 32 || name.compare(0, prefix.size(), prefix) != 0) return false;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status PreadAll(int fd, void* dst, size_t n, uint64_t offset, const std::string& where) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::DataLossError(StrCat(where, ": read failed (", r < 0 ? std::strerror(errno) : "end of file", ")"));
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

// Copies into the client's mapping survive the client shrinking its file under them: the page
// fault becomes SIGBUS, which the handler turns into a jump back to the copy (the thread's
// guard), so the stream fails with DATA_LOSS and the server goes on. Faults outside a guarded
// copy get the default action, as without the handler.
// volatile: the stores around memcpy must happen, though nothing in this thread reads them.
thread_local sigjmp_buf* volatile guarded_copy = nullptr;

void OnSigbus(int, siginfo_t*, void*) {
  if (sigjmp_buf* jb = guarded_copy) siglongjmp(*jb, 1);
  signal(SIGBUS, SIG_DFL);  // not ours: returning re-runs the access, which now kills as before
}

void InstallSigbusGuard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, nullptr);
  });
}

// memcpy that returns false instead of dying when the mapping lost its pages.
bool GuardedCopy(void* dst, const void* src, size_t n) {
  sigjmp_buf jb;
  if (sigsetjmp(jb, 1) != 0) {
    guarded_copy = nullptr;
    return false;
  }
  guarded_copy = &jb;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded_copy = nullptr;
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmWriter>> ShmWriter::Open(const std::string& name, const std::string& nonce,
                                                          uint64_t capacity, uint64_t max_ring,
                                                          uint32_t batches_ahead) {
  if (!ValidName(name)) {
    return absl::FailedPreconditionError(StrCat("shared memory name '", name.substr(0, 64), "' is not one Conveyor makes"));
  }
  if (nonce.size() != shm::kNonceBytes || capacity == 0 || capacity > (uint64_t{1} << 40)) {
    return absl::FailedPreconditionError("shared memory offer with a bad nonce or size");
  }
  const std::string path = "/dev/shm/" + name;
  const int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(StrCat("cannot open ", path, " (", std::strerror(errno),
                                                "): the client is on another host or in another /dev/shm"));
  }
  std::unique_ptr<ShmWriter> w(new ShmWriter(fd, name, capacity));
  w->ring_ = std::max<uint64_t>(4096, std::min(capacity, max_ring) / 4096 * 4096);
  w->ring_ = std::min(w->ring_, capacity);
  w->batches_ahead_ = std::max<uint32_t>(1, batches_ahead);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != shm::kHeaderBytes + capacity) {
    return absl::FailedPreconditionError(StrCat(path, " is not a region of ", capacity, " bytes"));
  }
  char header[shm::kNonceOffset + shm::kNonceBytes];
  RETURN_IF_ERROR(PreadAll(fd, header, sizeof(header), 0, path));
  uint64_t cap = 0;
  std::memcpy(&cap, header + shm::kCapacityOffset, 8);
  if (std::memcmp(header + shm::kMagicOffset, shm::kMagic, 8) != 0 || cap != capacity ||
      std::memcmp(header + shm::kNonceOffset, nonce.data(), shm::kNonceBytes) != 0) {
    return absl::FailedPreconditionError(StrCat(path, " does not hold the offered region"));
  }
  // The descriptor keeps it: the name goes now, so nothing stays in /dev/shm whoever dies first.
  unlink(path.c_str());
  InstallSigbusGuard();
  void* p = mmap(nullptr, shm::kHeaderBytes + capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return absl::FailedPreconditionError(StrCat("cannot map ", path, ": ", std::strerror(errno)));
  w->base_ = static_cast<uint8_t*>(p);
  return w;
}

ShmWriter::~ShmWriter() {
  if (base_ != nullptr) munmap(base_, shm::kHeaderBytes + capacity_);
  close(fd_);
}

absl::StatusOr<uint64_t> ShmWriter::Released() {
  uint64_t released = 0;
  if (!GuardedCopy(&released, base_ + shm::kReleasedOffset, 8)) {
    return absl::DataLossError(StrCat("shared memory ", name_, ": the client shrank its region"));
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return std::min(released, head_);  // a client claiming more only hurts itself
}

absl::StatusOr<bool> ShmWriter::Starved() {
  uint64_t starved = 0;
  if (!GuardedCopy(&starved, base_ + shm::kStarvedOffset, 8)) {
    return absl::DataLossError(StrCat("shared memory ", name_, ": the client shrank its region"));
  }
  return starved != 0;
}

absl::StatusOr<std::optional<uint64_t>> ShmWriter::Place(const uint8_t* data, uint64_t n,
                                                         const std::function<bool()>& stop) {
  if (n == 0 || n > ring_ || !usable_) return std::optional<uint64_t>();
  const uint64_t pos = shm::PlaceAfter(head_, n, ring_);
  // Wait until [pos, pos + n) lies within one lap of what the client released and fewer than
  // batches_ahead placed batches are unreleased. A client that is merely slower makes the server
  // wait here, as gRPC flow control would; one that keeps every batch it was given would wait for
  // the server forever, so when it says it is starved the batch travels in messages instead.
  const auto t0 = std::chrono::steady_clock::now();
  bool waited = false;
  for (int sleep_us = 20;; sleep_us = std::min(sleep_us * 2, 2000)) {
    ASSIGN_OR_RETURN(uint64_t released, Released());
    while (!unreleased_.empty() && unreleased_.front() <= released) unreleased_.pop_front();
    if (pos + n <= released + ring_ && unreleased_.size() < batches_ahead_) break;
    if (stop()) {
      wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return absl::CancelledError("the stream ended while the client's shared memory was full");
    }
    ASSIGN_OR_RETURN(bool starved, Starved());
    if (starved) {
      if (waited) wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++full_batches_;
      return std::optional<uint64_t>();
    }
    waited = true;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
  if (waited) wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!GuardedCopy(base_ + shm::kHeaderBytes + pos % ring_, data, n)) {
    // The client shrank its file, or /dev/shm had no page left for it (tmpfs answers both with
    // SIGBUS): the bytes copied so far lie where nobody was told to look.
    struct stat st {};
    if (fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) < shm::kHeaderBytes + capacity_) {
      return absl::DataLossError(StrCat("shared memory ", name_, ": the client shrank its region"));
    }
    usable_ = false;
    unusable_reason_ = StrCat("/dev/shm/", name_, ": no memory left in /dev/shm for the region");
    return std::optional<uint64_t>();
  }
  head_ = pos + n;
  unreleased_.push_back(head_);
  bytes_ += n;
  return std::optional<uint64_t>(pos);
}

}  // namespace conveyor
