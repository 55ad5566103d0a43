// The Conveyor data server: serves the batches of any consumer of any job from any cursor over
// gRPC (proto/conveyor/v1/service.proto). See docs/serving.md.
//
// Contract:
//  - Stateless beyond its configuration: a stream is a Pipeline (pipeline/pipeline.h) built from
//    the request, so any server with the same dataset and config serves the same bytes, and a
//    client can fail over to any of them from its last cursor.
//  - Flow control: each stream has one write outstanding and a pipeline bounded by
//    `queue_bytes`; a consumer that stops reading stops its own pipeline (backpressure to the
//    readers) and costs at most queue_bytes + one message, without slowing other streams.
//  - Security: listening beyond loopback (127.0.0.0/8, ::1) requires a bearer token over TLS
//    or TLS with verified client certificates; TLS alone encrypts but lets anyone in, so it is
//    refused like no protection, and a token without TLS travels in cleartext. On loopback the
//    local user is the identity (ServerOptions::allow_uids). A job's ranks share its secret. The token is checked on every Conveyor call (UNAUTHENTICATED otherwise).
//    grpc.health.v1 and reflection stay open so that load balancers and kubelet can probe (they
//    reveal no data).
//  - Hostile input: nothing a request asks for can crash the server or take more than its
//    ceilings (ServerLimits): a stream is admitted (stream count, per-peer count) before anything
//    is read or resolved; every size is estimated and checked before decoding or allocating; an
//    exception in a stream ends that stream only (INTERNAL / RESOURCE_EXHAUSTED) and frees its
//    slot. docs/serving.md lists the ceilings and what each bad input gets.
//  - Shutdown(): health goes NOT_SERVING, open streams end with UNAVAILABLE (clients resume on
//    another server), then the server stops.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

// Ceilings no request can raise. A request over one gets INVALID_ARGUMENT (a value no server
// would accept) or RESOURCE_EXHAUSTED (more memory than this server gives a stream), naming the
// key, its value and the ceiling. Decode limits a config asks for are lowered to these.
struct ServerLimits {
  uint64_t max_global_batch_size = 16384;
  int64_t max_pixels = 7680 * 4320;          // per decoded frame and per output image
  int64_t max_frames_per_sample = 256;       // per stream and sample
  int64_t max_audio_samples = 48000 * 60;    // per audio window, per channel
  uint64_t max_sample_bytes = 512ull << 20;  // one sample's tensors (estimated, then enforced)
  uint64_t max_batch_bytes = 2ull << 30;     // one consumer batch
  // Per stream: pre-decoded frames + samples in flight + batch buffers, estimated from the spec
  // before the stream starts (pipeline/pipeline.h EstimateMemory).
  uint64_t stream_memory_bytes = 2ull << 30;
  // All streams together: a stream is admitted only when its estimate fits beside the streams
  // already running, else RESOURCE_EXHAUSTED naming this budget (a client retries it as it does
  // an unavailable server, failing over or waiting until its reconnect timeout). 0: three
  // quarters of the machine's memory or its cgroup's limit, less the frame cache's bytes.
  uint64_t server_memory_bytes = 0;
  // By client: the local user (uid) for a client on this host, its IP address otherwise
  // (docs/serving.md "Who may connect").
  int max_streams_per_peer = 16;
};

struct ServerOptions {
  std::string dataset;                    // directory or URL (datasets/dataset.h)
  std::vector<std::string> config_paths;  // named by file stem; the first is the default
  std::string listen = "127.0.0.1:7700";  // port 0 picks a free port
  std::string metrics_listen;             // Prometheus /metrics; empty: off
  std::string auth_token_file;
  std::string tls_cert_file, tls_key_file;
  std::string tls_client_ca_file;         // require and verify client certificates
  // Who may connect (docs/serving.md "Who may connect"). A loopback TCP listener without a token
  // or client certificates admits the local users of LocalUsers (server/internal/peer_identity.h):
  // its own uid, root, these uids and these groups' members; each call's uid is read from the
  // kernel's socket table. A unix: listener's socket file is 0600, or 0660 owned by the one
  // group of allow_gids. loopback_open: admit every local user (the old behaviour; a unix
  // socket 0666). All three are refused where they choose nothing (beyond loopback, or with a
  // token or client certificates).
  std::vector<uint32_t> allow_uids;
  std::vector<uint32_t> allow_gids;
  bool loopback_open = false;
  // A bearer token beyond loopback travels in cleartext without TLS: refused unless this is set
  // (a network that is private or encrypted below gRPC).
  bool plaintext_token = false;
  // A job's slot (its own metrics series, coverage ledger and secret; server/internal/
  // job_identity.h) may be given to a new job name once the job has had no stream and no call
  // for this long, when all 256 slots are taken.
  double job_idle_seconds = 600;
  int threads = 2;                        // decode workers per stream
  // How many of all streams' decode workers compute at once (base/cpu_slots.h): N streams of
  // `threads` workers share this many CPU slots, so that many streams do not bury the threads
  // that send their batches. -1: one more than the CPUs this process may use (its affinity mask
  // and cgroup quota); 0: no bound (each stream's `threads` only).
  int cpu_slots = -1;
  uint64_t queue_bytes = 256ull << 20;    // per stream
  // One decoded-frame cache of this many bytes shared by every stream (pipeline/frame_cache.h):
  // a dataset's frames are decoded once per server, not once per epoch and stream. 0: none.
  uint64_t frame_cache_bytes = 0;
  std::string frame_cache_policy = "pin";  // pin | lru
  // The node-wide tier (pipeline/frame_store.h): decoded frames under this directory, shared by
  // every server on the node given it (/dev/shm: shared memory; a local disk). Empty: none.
  std::string frame_cache_dir;
  std::string frame_cache_shared_key;          // a group-shared store's node secret (FrameStoreOptions)
  uint64_t frame_cache_dir_bytes = 0;          // its bound for the node; 0: a quarter of its filesystem
  std::string frame_cache_compression = "none";  // none | lz4 | zstd
  // > 0: warm the frame cache in the background from start-up with this many threads
  // (pipeline/cache_warm.h): every frame each config's samples need, episode by episode, ahead of
  // the order, which never changes. For the spare cores of a node; 0: no warm-up.
  int frame_cache_warm_threads = 0;
  // Map the memory tier's pages for one epoch of the first config before serving
  // (PrefaultFrameCache, docs/pipeline.md "The decoded-frame cache"): start-up pays the page
  // faults its first epoch would, on `threads` threads. Needs frame_cache_bytes.
  bool frame_cache_prefault = false;
  uint64_t max_message_bytes = 4ull << 20;
  // Accept same-host clients' shared-memory regions (docs/serving.md "Same-host transport"):
  // payloads are written there and only headers travel over gRPC.
  bool shared_memory = true;
  // Streams at once; health says NOT_SERVING while this many are open. Stripe streams
  // (--payload-streams) hold a handler thread each as a stream does and have a pool of their own
  // of the same size: a stream is given as many stripes as the pool has free (none below 2, its
  // payloads then travel on the stream), so stripes never take a stream's or Info's thread.
  int max_streams = 64;
  // A stream (or stripe stream) whose client took no batch for this long (its Write blocked, or
  // its shared region unreleased) is ended with DEADLINE_EXCEEDED, freeing its slot, and counted
  // in conveyor_streams_stalled_total. 0: never.
  double stream_progress_timeout_seconds = 300;
  uint64_t max_config_bytes = 1ull << 20;  // inline configs larger than this are refused
  ServerLimits limits;
  std::string version = "dev";
};

class ServedStream;

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
  friend class ServedStream;  // one admitted stream (server/internal/served_stream.h)
  explicit DataServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True when the host of `listen` (HOST:PORT, [V6]:PORT or unix:PATH) is an address in
// 127.0.0.0/8 or ::1, or a unix socket. Names are not loopback: "localhost" may resolve
// anywhere, and "127.example.com" is not 127.0.0.1.
bool IsLoopbackAddress(const std::string& listen);

// Job names become metric labels and log fields: 1 to 128 characters of [A-Za-z0-9._:/@-].
absl::Status ValidateJobName(const std::string& job);

}  // namespace conveyor
