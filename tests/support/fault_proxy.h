// An in-process TCP proxy in front of an HTTP server that injects scripted faults, for testing
// how the HTTP backend retries.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace conveyor::testing {

// What the proxy does with one HTTP request.
struct FaultAction {
  enum Kind {
    kPassThrough,   // forward the request, relay the whole response
    kRespond503,    // answer "503 Service Unavailable" itself (with Content-Length), then close
    kCutBodyAfter,  // forward, relay the response head and `bytes` of its body, then close
    kStall,         // read the request, send nothing for `stall_ms`, then close
    kReset,         // read the request, then reset the connection (RST)
    kTrickle,       // forward, relay the response head, then the body one byte per `stall_ms`
  };
  Kind kind = kPassThrough;
  uint64_t bytes = 0;
  int stall_ms = 0;

  static FaultAction PassThrough() { return {kPassThrough}; }
  static FaultAction Respond503() { return {kRespond503}; }
  static FaultAction CutBodyAfter(uint64_t bytes) { return {kCutBodyAfter, bytes}; }
  static FaultAction Stall(int ms) { return {kStall, 0, ms}; }
  static FaultAction Reset() { return {kReset}; }
  static FaultAction Trickle(int ms_per_byte) { return {kTrickle, 0, ms_per_byte}; }
};

// Listens on 127.0.0.1 at an ephemeral port and forwards to 127.0.0.1:upstream_port.
//
// Each request takes the next action from the plan (a FIFO queue); with the plan empty, requests
// pass through. To stay small the proxy serves ONE request per client connection: it rewrites the
// request's Connection header to "close" (so the upstream closes after its response, and the
// client sees "Connection: close" and does not reuse the connection). Requests must not have a
// body (HEAD and GET only).
//
// One thread accepts; each connection gets its own thread. All of them are joined by the
// destructor, which interrupts stalls and blocked I/O; finished connection threads are only joined
// then, so one proxy suits a test's hundreds of connections, not a long benchmark. Thread-safe.
class FaultProxy {
 public:
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(int upstream_port);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  // Appends to the plan; applied to the requests that arrive after those already planned.
  void Enqueue(FaultAction action);
  void Enqueue(const std::vector<FaultAction>& actions);

  int port() const { return port_; }
  // "http://127.0.0.1:PORT/".
  std::string base_url() const;
  // Requests whose head was read completely (and which took an action), so far.
  int requests_seen() const { return requests_seen_.load(); }
  // Planned actions no request has taken yet.
  size_t actions_left() const;

 private:
  FaultProxy(int listen_fd, int stop_fd, int port, int upstream_port);
  void AcceptLoop();
  void Serve(int client_fd);
  FaultAction NextAction();
  // Forwards `request_head` to the upstream and relays the response; stops after the body's
  // first `body_limit` bytes when `cut` is set.
  // With `trickle_ms` > 0 the body goes out one byte per trickle_ms (a store that is alive but
  // useless), until the client gives up.
  void Relay(int client_fd, const std::string& request_head, bool cut, uint64_t body_limit,
             int trickle_ms = 0);

  const int listen_fd_;
  const int stop_fd_;  // an eventfd, readable once the destructor runs
  const int port_;
  const int upstream_port_;
  std::atomic<int> requests_seen_{0};

  mutable absl::Mutex mu_;
  std::deque<FaultAction> plan_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> connections_ ABSL_GUARDED_BY(mu_);

  std::thread acceptor_;
};

}  // namespace conveyor::testing
