// The Conveyor data server: serves the batches of any consumer of any job from any cursor over
// gRPC (proto/conveyor/v1/service.proto). See docs/serving.md.
//
// Contract:
//  - Stateless beyond its configuration: a stream is a Pipeline (shuffle/pipeline.h) built from
//    the request, so any server with the same dataset and config serves the same bytes, and a
//    client can fail over to any of them from its last cursor.
//  - Flow control: each stream has one write outstanding and a pipeline bounded by
//    `queue_bytes`; a consumer that stops reading stops its own pipeline (backpressure to the
//    readers) and costs at most queue_bytes + one message, without slowing other streams.
//  - Security: listening beyond loopback requires a bearer token or TLS. The token is checked on
//    every Conveyor call (UNAUTHENTICATED otherwise). grpc.health.v1 and reflection stay open so
//    that load balancers and kubelet can probe (they reveal no data).
//  - Shutdown(): health goes NOT_SERVING, open streams end with UNAVAILABLE (clients resume on
//    another server), then the server stops.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

struct ServerOptions {
  std::string dataset;                    // directory or URL (readers/dataset.h)
  std::vector<std::string> config_paths;  // named by file stem; the first is the default
  std::string listen = "127.0.0.1:7700";  // port 0 picks a free port
  std::string metrics_listen;             // Prometheus /metrics; empty: off
  std::string auth_token_file;
  std::string tls_cert_file, tls_key_file;
  std::string tls_client_ca_file;         // require and verify client certificates
  int threads = 2;                        // decode workers per stream
  uint64_t queue_bytes = 256ull << 20;    // per stream
  uint64_t max_message_bytes = 4ull << 20;
  int max_streams = 64;
  uint64_t max_config_bytes = 1ull << 20;  // inline configs larger than this are refused
  std::string version = "dev";
};

class DataServer {
 public:
  // Loads the dataset and configs, binds, and starts serving. Errors name what is wrong (an
  // unsafe listen address, a config error with file:line:col, a busy port).
  static absl::StatusOr<std::unique_ptr<DataServer>> Start(ServerOptions options);
  ~DataServer();

  std::string address() const;          // host:port actually bound
  std::string metrics_address() const;  // empty when metrics are off

  // Graceful: NOT_SERVING, end streams with UNAVAILABLE, wait up to `grace_seconds` for them,
  // then cancel what is left. Idempotent.
  void Shutdown(double grace_seconds);
  void Wait();

 private:
  struct Impl;
  explicit DataServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True for 127.0.0.0/8, ::1 and localhost.
bool IsLoopbackAddress(const std::string& listen);

}  // namespace conveyor
