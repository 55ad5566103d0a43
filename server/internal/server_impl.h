// Internal to the server: the state of a DataServer that its calls share, and the registry of
// its open streams. server.cc starts it and serves the calls (admission, identity, stripe
// calls, the reaper); server/server_info.cc answers Info and Report; server/served_stream.cc
// serves one admitted stream (ServedStream).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>  // std::once_flag
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/coverage.h"
#include "base/worker_pool.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "pipeline/pipeline.h"
#include "server/internal/batch_encoder.h"
#include "server/internal/carrier.h"
#include "server/internal/job_identity.h"
#include "server/internal/peer_identity.h"
#include "server/internal/stream_config.h"
#include "server/job_waits.h"
#include "server/metrics.h"
#include "server/server.h"

namespace conveyor {

// Payload bytes per message: gRPC handles larger, but memory per write grows.
inline constexpr uint64_t kMaxMessageCap = 64ull << 20;
inline constexpr uint64_t kMinMessageBytes = 64ull << 10;

grpc::Status ToGrpc(const absl::Status& s);
const char* CodeName(grpc::StatusCode c);

// One open stream (or stripe call), registered so that the reaper can cancel its pipeline when
// the client goes away (the sync API offers no callback) or the server shuts down.
// What the registry (DataServer::Impl::streams, under its mutex) keeps of it is in Registered.
struct ActiveStream {
  grpc::ServerContext* ctx = nullptr;
  std::string peer;       // the client (PeerKey), for the per-peer limit
  std::string job_label;  // JobRegistry's label of the stream's job
  std::atomic<uint64_t> queue_bytes{0};  // the pipeline's bytes in flight, after each batch
  // Since when the stream has waited for its client to take a batch (steady clock, ns; 0: not
  // waiting), and whether the reaper ended it for waiting longer than the progress timeout.
  std::atomic<int64_t> blocked_since_ns{0};
  mutable std::atomic<bool> stalled{false};  // set by the reaper, which sees the registry's const entries
  void Blocked() {
    int64_t none = 0;
    blocked_since_ns.compare_exchange_strong(none, std::chrono::steady_clock::now().time_since_epoch().count());
  }
  void Progressed() { blocked_since_ns.store(0); }
};
struct Registered {
  Pipeline* pipeline = nullptr;  // while it serves: the reaper cancels it
  std::string job_label;         // empty until resolved
  uint64_t queue_budget = 0;
};

struct DataServer::Impl : public RawStreamBatchesService {
  using Writer = RawStreamBatchesService::Stream;

  ServerOptions o;
  std::unique_ptr<Source> source;  // a dataset or a mixture (pipeline/source.h)
  std::vector<std::shared_ptr<Config>> configs;
  std::string token;  // empty: no token required
  // Loopback TCP without a token or client certificates: each call's local user is checked
  // against local_users (docs/serving.md "Who may connect").
  bool check_local_user = false;
  server_internal::LocalUsers local_users;
  std::string listen_host;   // the bound address, for finding a same-host client's socket
  uint16_t listen_port = 0;
  std::unique_ptr<server_internal::JobRegistry> jobs;  // who speaks for each job name
  std::unique_ptr<ServerMetrics> metrics;
  std::shared_ptr<DecodedFrameCache> frame_cache;  // shared by every stream; null: none
  std::shared_ptr<CpuSlots> cpu_slots;             // shared by every stream; null: no bound
  std::unique_ptr<grpc::Server> server;
  std::string address;
  // What the streams' carriers share (server/internal/carrier.h): the bound address, the
  // stripe sessions and the stripe pool.
  CarrierServer carriers;

  absl::Mutex mu;
  absl::CondVar cv;
  // The open streams; entries removed by StreamSlot's destructor.
  std::map<const ActiveStream*, Registered> streams ABSL_GUARDED_BY(mu);
  // Stripe calls reserved by open streams. Each holds a handler thread as a stream does, so they
  // have a pool of their own (stripe_slots <= --max-streams) and the handler quota is sized for
  // both pools (2 x max_streams + 16): however clients mix streams and stripes, Info, health and
  // new streams keep threads of their own.
  int stripe_slots ABSL_GUARDED_BY(mu) = 0;
  std::set<ActiveStream*> stripe_calls ABSL_GUARDED_BY(mu);  // the stripe calls running
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  bool reaper_stop ABSL_GUARDED_BY(mu) = false;
  bool health_serving ABSL_GUARDED_BY(mu) = true;  // what was last set (Start sets SERVING)
  // The server-wide memory budget (ServerLimits::server_memory_bytes, resolved at start) and the
  // admitted streams' estimates held against it.
  uint64_t memory_budget = 0;
  std::string memory_budget_source;  // how the budget was set, for messages
  uint64_t memory_reserved ABSL_GUARDED_BY(mu) = 0;
  int memory_holders ABSL_GUARDED_BY(mu) = 0;
  std::unique_ptr<WorkerPool> reaper;  // Reap()
  std::unique_ptr<WorkerPool> warmer;  // WarmCache(); cancelled and joined first at destruction
  std::once_flag shutdown_once;

  // Aggregates for the amplification gauge.
  std::atomic<uint64_t> total_decoded{0}, total_delivered{0};

  // Per job (by metrics label, so at most 257 of them): totals for Info and `conveyor top`, and
  // when its wait gauges were last recomputed (at most once a second per job).
  struct JobTotals {
    uint64_t samples = 0, frames_decoded = 0, frames_delivered = 0;
    std::chrono::steady_clock::time_point summarized{};
  };
  absl::Mutex jobs_mu;
  std::map<std::string, JobTotals> job_totals ABSL_GUARDED_BY(jobs_mu);
  // What each job's streams delivered, per epoch and consumer slice (base/coverage.h; by metrics
  // label): Info's JobStatus.coverage, `conveyor audit --servers`.
  std::map<std::string, CoverageLedger> coverage ABSL_GUARDED_BY(jobs_mu);
  // Streams refused because they pin other data, by job label: JobStatus.refused_data_pin.
  std::map<std::string, uint64_t> refused_data_pin ABSL_GUARDED_BY(jobs_mu);
  JobWaits waits;  // the clients' reports, last 60 s

  // A stream's place in the registry, released however the stream ends (an early return, an
  // error, an exception): the slot is freed and the reaper never sees a dangling entry.
  class StreamSlot {
   public:
    StreamSlot(Impl* server, ActiveStream* entry) : server_(server), entry_(entry) {}
    ~StreamSlot();
    StreamSlot(const StreamSlot&) = delete;
    StreamSlot& operator=(const StreamSlot&) = delete;

   private:
    Impl* server_;
    ActiveStream* entry_;
  };

  // A stream's share of the server-wide memory budget, returned however the stream ends.
  class MemoryReservation {
   public:
    MemoryReservation(Impl* server, uint64_t bytes) : server_(server), bytes_(bytes) {}
    ~MemoryReservation();
    MemoryReservation(const MemoryReservation&) = delete;
    MemoryReservation& operator=(const MemoryReservation&) = delete;
    // `bytes` more for the same stream (a carrier's memory), when they fit beside the others.
    bool Grow(uint64_t bytes);

   private:
    Impl* server_;
    uint64_t bytes_;
  };

  // Start-up (DataServer::Start, with `o` checked and set), in this order: the token, the data
  // and the configs; the metrics and the memory budget; the CPU slots and the frame cache; the
  // listener, with health SERVING.
  absl::Status LoadData();
  absl::Status BudgetMemory();
  absl::Status SetUpDecoding();
  absl::Status Listen();

  grpc::Status Reject(grpc::StatusCode code, std::string message);
  grpc::Status Authorize(grpc::ServerContext* ctx);
  // The local user of a loopback call, from the kernel's socket table: admitted when it is one
  // of local_users, refused (and counted) otherwise, or when the user cannot be told.
  grpc::Status AuthorizeLocalUser(grpc::ServerContext* ctx);
  // The client a per-peer limit counts: its local user when it is on this host, its address
  // otherwise (every same-host client shares 127.0.0.1).
  std::string PeerKey(grpc::ServerContext* ctx);
  // A call of `job` (a stream when `stream`): its label, once the secret it presents
  // (metadata conveyor-job-secret) matches the job's. A slot taken from an idle job drops that
  // job's ledger, totals and series.
  absl::StatusOr<std::string> EnterJob(grpc::ServerContext* ctx, const std::string& job, bool stream);
  // The background warm-up (ServerOptions::frame_cache_warm_threads): each config in turn.
  void WarmCache();
  // The reaper: cancels the pipelines of streams whose client went away, so that a stream
  // blocked in Pipeline::Next() ends promptly, and all of them at shutdown.
  // It also ends a stream whose client stopped taking batches for --stream-progress-timeout.
  void Reap();

  // server_info.cc: a consumer's data-wait report, and what the server serves and its jobs.
  grpc::Status Report(grpc::ServerContext* ctx, const v1::ReportRequest* req, v1::ReportResponse*) override;
  grpc::Status Info(grpc::ServerContext* ctx, const v1::InfoRequest*, v1::InfoResponse* r) override;
  void AddJobs(v1::InfoResponse* r);
  void AddFrameCache(v1::FrameCacheStatus* fc);

  grpc::Status StreamRaw(grpc::ServerContext* ctx, const v1::StreamBatchesRequest* req, Writer* writer) override;
  // Admission, before anything is read or resolved: shutdown, the stream limit, the per-peer
  // limit. OK: `entry` is registered and *slot releases it.
  grpc::Status Admit(ActiveStream* entry, std::optional<StreamSlot>* slot);
  // Health says SERVING exactly while a new stream would be admitted (by the stream limit). Set
  // only when it changes: every SetServingStatus call is a message to each Watch.
  void UpdateHealth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Up to `wanted` stripe calls for a stream, as many as the stripe pool has room for (0 when
  // fewer than 2: the payloads then travel on the stream itself). Returned by ReleaseStripes.
  uint32_t ReserveStripes(uint32_t wanted);
  void ReleaseStripes(uint32_t k);
  // Admits a stream's estimate against the server-wide budget, or refuses it, naming the budget,
  // what the running streams hold and what to do.
  grpc::Status ReserveMemory(uint64_t bytes, std::optional<MemoryReservation>* out);
  // True once the call is over for this server: the client cancelled, or the server drains.
  StopFn StreamOver(grpc::ServerContext* ctx, const ActiveStream* entry = nullptr);
  // A stripe stream (server/internal/stripes.h): the payload messages its stream hands it,
  // until that stream ends. It holds no admission slot: it is part of a stream that does.
  grpc::Status ServeStripe(grpc::ServerContext* ctx, const v1::StreamBatchesRequest& req, Writer* writer);
  grpc::Status Stalled() const;
};

}  // namespace conveyor
