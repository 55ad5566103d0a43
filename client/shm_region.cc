#include "client/internal/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/shm_layout.h"

namespace conveyor::client {

absl::StatusOr<std::shared_ptr<ShmRegion>> ShmRegion::Create(uint64_t capacity) {
  capacity = (std::max<uint64_t>(capacity, 4096) + 4095) / 4096 * 4096;
  std::shared_ptr<ShmRegion> r(new ShmRegion());
  std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 16; ++i) {
    const unsigned v = rd() & 0xff;
    id += kHex[v >> 4];
    id += kHex[v & 15];
    r->nonce_ += static_cast<char>(rd() & 0xff);
  }
  r->name_ = std::string(shm::kNamePrefix) + id;
  r->capacity_ = capacity;
  {
    absl::MutexLock lock(&r->mu_);
    r->ring_ = capacity;
  }
  const std::string path = "/" + r->name_;
  const int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("shm_open ", path, ": ", std::strerror(errno)));
  r->linked_ = true;
  r->mapped_ = shm::kHeaderBytes + capacity;
  if (ftruncate(fd, static_cast<off_t>(r->mapped_)) != 0) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("sizing ", path, " to ", r->mapped_, " bytes: ", std::strerror(e)));
  }
  void* p = mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return absl::UnavailableError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  r->base_ = static_cast<uint8_t*>(p);
  std::memcpy(r->base_ + shm::kMagicOffset, shm::kMagic, 8);
  std::memcpy(r->base_ + shm::kCapacityOffset, &capacity, 8);
  std::memcpy(r->base_ + shm::kNonceOffset, r->nonce_.data(), shm::kNonceBytes);
  return r;
}

ShmRegion::~ShmRegion() {
  Unlink();
  if (base_ != nullptr) munmap(base_, mapped_);
}

void ShmRegion::Unlink() {
  if (!linked_) return;
  linked_ = false;
  shm_unlink(("/" + name_).c_str());
}

absl::Status ShmRegion::SetRing(uint64_t ring) {
  absl::MutexLock lock(&mu_);
  if (ring == 0 || ring > capacity_ || head_ != 0) {
    return absl::DataLossError(absl::StrCat("a shared memory ring of ", ring, " bytes in a region of ",
                                            capacity_));
  }
  ring_ = ring;
  return absl::OkStatus();
}

uint64_t ShmRegion::ring() const {
  absl::MutexLock lock(&mu_);
  return ring_;
}

void ShmRegion::SetStarved(bool starved) {
  reinterpret_cast<std::atomic<uint64_t>*>(base_ + shm::kStarvedOffset)->store(starved ? 1 : 0,
                                                                                std::memory_order_release);
}

absl::StatusOr<const uint8_t*> ShmRegion::Accept(uint64_t pos, uint64_t n) {
  absl::MutexLock lock(&mu_);
  if (n == 0 || n > ring_ || pos < head_ || pos % ring_ + n > ring_ ||
      pos + n > released_ + ring_ || pos != shm::PlaceAfter(head_, n, ring_)) {
    return absl::DataLossError(absl::StrCat("a payload of ", n, " bytes at shared memory position ", pos,
                                            " where the next may start at ", head_, " (", released_,
                                            " released of a ", ring_, "-byte ring)"));
  }
  in_use_.push_back(InUse{pos, pos + n, false});
  head_ = pos + n;
  return base_ + shm::kHeaderBytes + pos % ring_;
}

void ShmRegion::Release(uint64_t pos) {
  absl::MutexLock lock(&mu_);
  for (InUse& u : in_use_) {
    if (u.pos == pos) {
      u.released = true;
      break;
    }
  }
  uint64_t released = released_;
  while (!in_use_.empty() && in_use_.front().released) {
    released = in_use_.front().end;
    in_use_.pop_front();
  }
  if (released != released_) {
    released_ = released;
    // Read by the server with pread: an aligned 8-byte store, published after the reads of the
    // released payloads (the release fence orders them before it).
    std::atomic_thread_fence(std::memory_order_release);
    reinterpret_cast<std::atomic<uint64_t>*>(base_ + shm::kReleasedOffset)->store(released, std::memory_order_release);
  }
}

uint64_t ShmRegion::released() const {
  absl::MutexLock lock(&mu_);
  return released_;
}

}  // namespace conveyor::client
