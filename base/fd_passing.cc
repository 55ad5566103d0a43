#include "base/fd_passing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace conveyor {
namespace {

// A one-byte message with room for one descriptor.
struct OneFdMessage {
  char byte = 1;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  OneFdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
};

}  // namespace

bool SendFd(int sock, int fd) {
  OneFdMessage m;
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  for (;;) {
    const ssize_t r = sendmsg(sock, &m.msg, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    return r == 1;
  }
}

int ReceiveFd(int sock) {
  OneFdMessage m;
  ssize_t r;
  do {
    r = recvmsg(sock, &m.msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r != 1) return -1;
  int fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m.msg); c != nullptr; c = CMSG_NXTHDR(&m.msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    // More than one descriptor is not ours to keep: close them all.
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fd < 0 && n == 1) {
        fd = got;
      } else {
        close(got);
      }
    }
  }
  return fd;
}

}  // namespace conveyor
