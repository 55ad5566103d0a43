// A real nginx serving a directory on 127.0.0.1, for tests and benchmarks of the HTTP backend.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tests/support/test_env.h"

namespace conveyor::testing {

// Runs /usr/sbin/nginx (Debian's nginx-light) as a child process, in the foreground and as a
// single process, with its config, pid file, logs and temp directories in a private prefix
// directory that is removed on destruction. It serves `root_dir` at http://127.0.0.1:PORT/ and
// also answers:
//   /always503/...        503 Service Unavailable, always (for exhausted-retry tests)
//   /.nginx-server-id     a token unique to this instance (used to check that the port is ours)
//
// The port is picked by binding port 0 and closing the socket, so another process may take it
// before nginx binds it; Start then tries again with another port.
//
// The child gets SIGKILL if the thread that called Start exits first (PR_SET_PDEATHSIG), so a
// crashed test leaves no nginx behind. Not thread-safe beyond its const accessors.
class NginxServer {
 public:
  struct Options {
    // Access logs help when debugging a test; benchmarks turn them off.
    bool access_log = true;
  };

  // Starts nginx and waits (at most 10 s per try) until it answers on its port.
  static absl::StatusOr<std::unique_ptr<NginxServer>> Start(const std::string& root_dir,
                                                            const Options& options);
  static absl::StatusOr<std::unique_ptr<NginxServer>> Start(const std::string& root_dir) {
    return Start(root_dir, Options());
  }

  // Stops nginx (SIGTERM, then SIGKILL after 5 s) and reaps it.
  ~NginxServer();
  NginxServer(const NginxServer&) = delete;
  NginxServer& operator=(const NginxServer&) = delete;

  int port() const { return port_; }
  // "http://127.0.0.1:PORT/".
  std::string base_url() const;
  // nginx's error log, for failure messages.
  std::string ErrorLog() const;

 private:
  NginxServer(std::unique_ptr<TempDir> prefix, pid_t pid, int port)
      : prefix_(std::move(prefix)), pid_(pid), port_(port) {}

  std::unique_ptr<TempDir> prefix_;
  pid_t pid_;
  int port_;
};

// Returns a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, then close).
absl::StatusOr<int> PickFreePort();

// A TCP socket bound to 127.0.0.1 on an ephemeral port (listening when `listen` is set). Returns
// the descriptor, which the caller owns, and stores the port in `*port`.
absl::StatusOr<int> BindLoopbackSocket(bool listen, int* port);

}  // namespace conveyor::testing
