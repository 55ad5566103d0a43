#include "base/posix_file.h"

#include <unistd.h>

#include <cerrno>

namespace conveyor {

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

bool ReadFull(int fd, char* dst, size_t n, off_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, n, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    dst += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
  return true;
}

bool WriteFull(int fd, const char* src, size_t n, off_t offset) {
  while (n > 0) {
    const ssize_t put = ::pwrite(fd, src, n, offset);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    src += put;
    n -= static_cast<size_t>(put);
    offset += put;
  }
  return true;
}

}  // namespace conveyor
