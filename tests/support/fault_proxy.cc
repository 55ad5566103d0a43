#include "tests/support/fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "tests/support/nginx_server.h"

namespace conveyor::testing {
namespace {

// How long any single socket operation may wait before the proxy gives up on a connection.
constexpr int kIoTimeoutMs = 10000;
constexpr size_t kMaxRequestHead = 64 * 1024;

enum class Ready { kYes, kStopped, kTimedOut };

// Waits until `fd` has `events`, the proxy is stopping, or `timeout_ms` passes.
Ready WaitFor(int fd, short events, int stop_fd, int timeout_ms) {
  pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
  while (true) {
    int r = ::poll(fds, 2, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Ready::kStopped;
    if (r == 0) return Ready::kTimedOut;
    if (fds[1].revents != 0) return Ready::kStopped;
    return Ready::kYes;
  }
}

bool SendAll(int fd, int stop_fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t r = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      data += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLOUT, stop_fd, kIoTimeoutMs) != Ready::kYes) return false;
      continue;
    }
    return false;
  }
  return true;
}

// Reads an HTTP request head (through the blank line). False on EOF, error, timeout or stop.
bool ReadRequestHead(int fd, int stop_fd, std::string* head) {
  char buf[4096];
  while (head->find("\r\n\r\n") == std::string::npos) {
    if (head->size() > kMaxRequestHead) return false;
    if (WaitFor(fd, POLLIN, stop_fd, kIoTimeoutMs) != Ready::kYes) return false;
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    head->append(buf, static_cast<size_t>(r));
  }
  return true;
}

// Replaces the request's connection-management headers with "Connection: close".
std::string WithConnectionClose(const std::string& head) {
  std::string out;
  const absl::string_view lines(head.data(), head.find("\r\n\r\n"));
  for (absl::string_view line : absl::StrSplit(lines, "\r\n")) {
    if (absl::StartsWithIgnoreCase(line, "connection:") ||
        absl::StartsWithIgnoreCase(line, "keep-alive:") ||
        absl::StartsWithIgnoreCase(line, "proxy-connection:")) {
      continue;
    }
    StrAppend(&out, line, "\r\n");
  }
  StrAppend(&out, "Connection: close\r\n\r\n");
  return out;
}

int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

FaultProxy::FaultProxy(int listen_fd, int stop_fd, int port, int upstream_port)
    : listen_fd_(listen_fd), stop_fd_(stop_fd), port_(port), upstream_port_(upstream_port) {}

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(int upstream_port) {
  int port = 0;
  absl::StatusOr<int> listening = BindLoopbackSocket(/*listen=*/true, &port);
  if (!listening.ok()) return Annotate(listening.status(), "fault proxy");
  const int fd = *listening;
  int stop_fd = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd < 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(StrCat("fault proxy: eventfd: ", std::strerror(err)));
  }
  std::unique_ptr<FaultProxy> proxy(
      new FaultProxy(fd, stop_fd, port, upstream_port));
  proxy->acceptor_ = std::thread(&FaultProxy::AcceptLoop, proxy.get());
  return proxy;
}

FaultProxy::~FaultProxy() {
  // The eventfd stays readable once written, so every poll in every thread sees it.
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(stop_fd_, &one, sizeof(one));
  acceptor_.join();
  std::vector<std::thread> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (std::thread& t : connections) t.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

void FaultProxy::Enqueue(FaultAction action) {
  absl::MutexLock lock(&mu_);
  plan_.push_back(action);
}

void FaultProxy::Enqueue(const std::vector<FaultAction>& actions) {
  absl::MutexLock lock(&mu_);
  plan_.insert(plan_.end(), actions.begin(), actions.end());
}

std::string FaultProxy::base_url() const { return StrCat("http://127.0.0.1:", port_, "/"); }

size_t FaultProxy::actions_left() const {
  absl::MutexLock lock(&mu_);
  return plan_.size();
}

FaultAction FaultProxy::NextAction() {
  absl::MutexLock lock(&mu_);
  if (plan_.empty()) return FaultAction::PassThrough();
  FaultAction action = plan_.front();
  plan_.pop_front();
  return action;
}

void FaultProxy::AcceptLoop() {
  while (WaitFor(listen_fd_, POLLIN, stop_fd_, -1) == Ready::kYes) {
    int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    absl::MutexLock lock(&mu_);
    connections_.emplace_back(&FaultProxy::Serve, this, client);
  }
}

void FaultProxy::Serve(int client_fd) {
  std::string head;
  if (ReadRequestHead(client_fd, stop_fd_, &head)) {
    requests_seen_.fetch_add(1);
    const FaultAction action = NextAction();
    switch (action.kind) {
      case FaultAction::kPassThrough:
        Relay(client_fd, WithConnectionClose(head), /*cut=*/false, 0);
        break;
      case FaultAction::kCutBodyAfter:
        Relay(client_fd, WithConnectionClose(head), /*cut=*/true, action.bytes);
        break;
      case FaultAction::kTrickle:
        Relay(client_fd, WithConnectionClose(head), /*cut=*/false, 0, action.stall_ms);
        break;
      case FaultAction::kRespond503: {
        const std::string body = "fault proxy: 503\n";
        std::string response = StrCat(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: ",
            body.size(), "\r\nConnection: close\r\n\r\n");
        if (!absl::StartsWith(head, "HEAD ")) response += body;
        SendAll(client_fd, stop_fd_, response.data(), response.size());
        break;
      }
      case FaultAction::kStall: {
        // Ends early when the client gives up (closes) or the proxy stops.
        WaitFor(client_fd, POLLRDHUP, stop_fd_, action.stall_ms);
        break;
      }
      case FaultAction::kReset: {
        linger abort{1, 0};  // close() then sends RST instead of FIN
        ::setsockopt(client_fd, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
        break;
      }
    }
  }
  ::close(client_fd);
}

void FaultProxy::Relay(int client_fd, const std::string& request_head, bool cut,
                       uint64_t body_limit, int trickle_ms) {
  int upstream = ConnectLoopback(upstream_port_);
  if (upstream < 0) return;
  if (SendAll(upstream, stop_fd_, request_head.data(), request_head.size())) {
    // Bytes of the response stream to pass on: unlimited, or the head plus `body_limit` once the
    // end of the head has been seen.
    uint64_t limit = std::numeric_limits<uint64_t>::max();
    uint64_t relayed = 0;
    std::string response_head;  // the stream so far, until the end of the head is found
    bool head_found = false;
    char buf[64 * 1024];
    while (relayed < limit && WaitFor(upstream, POLLIN, stop_fd_, kIoTimeoutMs) == Ready::kYes) {
      ssize_t r = ::recv(upstream, buf, sizeof(buf), 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      const size_t n = static_cast<size_t>(r);
      if (trickle_ms > 0) {
        // The head as it comes, then every body byte alone, trickle_ms apart, until the client
        // gives up (closes) or the proxy stops. The body may arrive in later reads.
        size_t from = 0;
        if (!head_found) {
          const size_t searched = response_head.size();
          response_head.append(buf, n);
          const size_t end = response_head.find("\r\n\r\n", searched >= 3 ? searched - 3 : 0);
          if (end == std::string::npos) {
            if (!SendAll(client_fd, stop_fd_, buf, n)) break;
            continue;
          }
          head_found = true;
          from = end + 4 - searched;
          if (!SendAll(client_fd, stop_fd_, buf, from)) break;
        }
        bool gone = false;
        for (size_t i = from; i < n && !gone; ++i) {
          gone = !SendAll(client_fd, stop_fd_, buf + i, 1) ||
                 WaitFor(client_fd, POLLRDHUP, stop_fd_, trickle_ms) != Ready::kTimedOut;
        }
        if (gone) break;
        continue;
      }
      if (cut && !head_found) {
        const size_t searched = response_head.size();
        response_head.append(buf, n);
        size_t end = response_head.find("\r\n\r\n", searched >= 3 ? searched - 3 : 0);
        if (end != std::string::npos) {
          head_found = true;
          limit = end + 4 + body_limit;
        }
      }
      const size_t pass = static_cast<size_t>(std::min<uint64_t>(n, limit - relayed));
      if (!SendAll(client_fd, stop_fd_, buf, pass)) break;
      relayed += pass;
    }
  }
  ::close(upstream);
}

}  // namespace conveyor::testing
