// Small POSIX file helpers shared by the on-disk caches (storage/caching_storage.cc,
// pipeline/frame_store.cc): a descriptor closed on destruction, and positioned reads and writes
// that finish the whole range (retrying EINTR and short transfers).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <utility>

namespace conveyor {

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// All n bytes at offset; false on an error or end of file (errno says which, 0 at the end).
bool ReadFull(int fd, char* dst, size_t n, off_t offset);
// All n bytes at offset; false on an error.
bool WriteFull(int fd, const char* src, size_t n, off_t offset);

}  // namespace conveyor
