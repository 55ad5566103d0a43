#include "tests/support/nginx_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "base/strings.h"

namespace conveyor::testing {
namespace {

constexpr char kNginxBinary[] = "/usr/sbin/nginx";
constexpr int kStartAttempts = 3;
constexpr auto kStartTimeout = std::chrono::seconds(10);
constexpr auto kStopTimeout = std::chrono::seconds(5);

// $PREFIX, $ROOT, $PORT, $TOKEN and $ACCESS_LOG are filled in by NginxConfig.
constexpr char kConfigTemplate[] = R"(daemon off;
master_process off;
worker_processes 1;
pid "$PREFIX/nginx.pid";
error_log "$PREFIX/error.log" warn;
events { worker_connections 1024; }
http {
  access_log $ACCESS_LOG;
  client_body_temp_path "$PREFIX/client_body_temp";
  proxy_temp_path "$PREFIX/proxy_temp";
  fastcgi_temp_path "$PREFIX/fastcgi_temp";
  uwsgi_temp_path "$PREFIX/uwsgi_temp";
  scgi_temp_path "$PREFIX/scgi_temp";
  types { }
  default_type application/octet-stream;
  sendfile on;
  # Not tcp_nopush: with it (TCP_CORK), keep-alive connections answer many unaligned range
  # requests ~44 ms late (likely the tail segment waiting for the client's delayed ACK);
  # measured with curl and with Conveyor, 64 KiB ranges at random offsets.
  tcp_nopush off;
  keepalive_timeout 75s;
  keepalive_requests 100000;
  server {
    listen 127.0.0.1:$PORT;
    server_name localhost;
    root "$ROOT";
    location / { }
    location /always503/ { return 503; }
    location = /.nginx-server-id { return 200 "$TOKEN"; }
  }
}
)";

std::string NginxConfig(const std::string& prefix, const std::string& root, int port,
                        const std::string& token, const NginxServer::Options& options) {
  const std::string access_log = options.access_log ? StrCat("\"", prefix, "/access.log\"") : "off";
  return absl::StrReplaceAll(kConfigTemplate, {{"$PREFIX", prefix},
                                               {"$ROOT", root},
                                               {"$PORT", std::to_string(port)},
                                               {"$TOKEN", token},
                                               {"$ACCESS_LOG", access_log}});
}

// Asks 127.0.0.1:port for /.nginx-server-id; true when the answer carries `token`.
bool AnswersWithToken(int port, const std::string& token) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /.nginx-server-id HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[1024];
      ssize_t r;
      while ((r = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, r);
    }
  }
  ::close(fd);
  return absl::StartsWith(response, "HTTP/1.1 200") && absl::StrContains(response, token);
}

// Waits up to `timeout` for `pid` to exit; true when it did (and was reaped).
bool WaitForExit(pid_t pid, std::chrono::steady_clock::duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void StopProcess(pid_t pid) {
  ::kill(pid, SIGTERM);
  if (WaitForExit(pid, kStopTimeout)) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

std::string ReadIfExists(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "";
  return ReadFile(path);
}

}  // namespace

absl::StatusOr<int> BindLoopbackSocket(bool listen, int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listen && ::listen(fd, 128) != 0) ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(StrCat(listen ? "listening on" : "binding", " 127.0.0.1:0: ",
                                      std::strerror(err)));
  }
  *port = static_cast<int>(ntohs(addr.sin_port));
  return fd;
}

absl::StatusOr<int> PickFreePort() {
  int port = 0;
  absl::StatusOr<int> fd = BindLoopbackSocket(/*listen=*/false, &port);
  if (!fd.ok()) return fd.status();
  ::close(*fd);
  return port;
}

absl::StatusOr<std::unique_ptr<NginxServer>> NginxServer::Start(const std::string& root_dir,
                                                                const Options& options) {
  if (::access(kNginxBinary, X_OK) != 0) {
    return absl::FailedPreconditionError(
        StrCat(kNginxBinary, " is not installed (Debian package nginx-light; see tools/setup.sh)"));
  }
  std::string last_error;
  for (int attempt = 1; attempt <= kStartAttempts; ++attempt) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    auto prefix = std::make_unique<TempDir>();
    const std::string conf = prefix->Join("nginx.conf");
    const std::string stderr_log = prefix->Join("stderr.log");
    // The prefix path is unique on this machine, which makes it a good identity token.
    const std::string token = prefix->path();
    WriteFile(conf, NginxConfig(prefix->path(), root_dir, *port, token, options));

    // Everything the child needs is built before fork: only async-signal-safe calls follow it.
    const std::string prefix_arg = prefix->path() + "/";
    const std::string error_log = prefix->Join("error.log");
    std::vector<const char*> argv = {"nginx",      "-p", prefix_arg.c_str(), "-c",
                                     conf.c_str(), "-e", error_log.c_str(),  nullptr};
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) return absl::InternalError(StrCat("fork: ", std::strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      int out = ::open(stderr_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int in = ::open("/dev/null", O_RDONLY);
      if (out >= 0) {
        ::dup2(out, STDOUT_FILENO);
        ::dup2(out, STDERR_FILENO);
      }
      if (in >= 0) ::dup2(in, STDIN_FILENO);
      ::execv(kNginxBinary, const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }

    const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int status;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      if (AnswersWithToken(*port, token)) {
        return std::unique_ptr<NginxServer>(new NginxServer(std::move(prefix), pid, *port));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!exited) StopProcess(pid);
    last_error = StrCat("nginx on port ", *port,
                        exited ? " exited during startup" : " did not answer within 10 s",
                        "; error log: ", ReadIfExists(error_log), ReadIfExists(stderr_log));
  }
  return absl::UnavailableError(StrCat("could not start ", kNginxBinary, " serving ", root_dir,
                                       " after ", kStartAttempts, " tries; last: ", last_error));
}

NginxServer::~NginxServer() { StopProcess(pid_); }

std::string NginxServer::base_url() const { return StrCat("http://127.0.0.1:", port_, "/"); }

std::string NginxServer::ErrorLog() const { return ReadIfExists(prefix_->Join("error.log")); }

}  // namespace conveyor::testing
