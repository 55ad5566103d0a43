#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cctype>
#include <new>
#include <optional>
#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <mutex>  // std::once_flag
#include <sstream>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/coverage.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/system_memory.h"
#include "base/worker_pool.h"
#include "conveyor/format/v1/shard.pb.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "datasets/dataset.h"
#include "format/format.h"
#include "storage/storage.h"
#include "server/internal/batch_encoder.h"
#include "server/internal/job_identity.h"
#include "server/internal/listen_holder.h"
#include "server/internal/peer_identity.h"
#include "server/job_waits.h"
#include "server/metrics.h"
#include "base/shm_layout.h"
#include "server/internal/shm_sink.h"
#include "server/internal/stripes.h"
#include "base/cancel.h"
#include "pipeline/cache_warm.h"
#include "pipeline/naive_warning.h"
#include "pipeline/order_digest.h"
#include "sample/tokenizer.h"
#include "pipeline/pipeline.h"

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;
using Clock = std::chrono::steady_clock;
constexpr char kServiceName[] = "conveyor.v1.Conveyor";
constexpr uint64_t kMaxMessageCap = 64ull << 20;  // gRPC handles larger, but memory per write grows
constexpr uint64_t kMinMessageBytes = 64ull << 10;
// Job names with series, a ledger and a secret of their own (server/internal/job_identity.h).
constexpr size_t kMaxJobSlots = 256;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    default: return "UNKNOWN";
  }
}

// A resolved config: the sample spec and pipeline options of one config text.
struct Config {
  std::string name;
  std::string text;
  std::string digest;
  std::string order_digest;  // pipeline/order_digest.h
  SampleSpec spec;
  PipelineOptions options;
  uint64_t samples_per_epoch = 0;
  uint64_t steps_per_epoch = 0;
};

// schedule_version: 0 = the config's; 1 to 4 overrides it (a resumed job's recorded version).
absl::StatusOr<std::shared_ptr<Config>> ResolveConfig(const Source& ds, std::string name,
                                                      std::string text, std::string_view source,
                                                      uint32_t schedule_version = 0) {
  auto c = std::make_shared<Config>();
  c->name = std::move(name);
  c->text = std::move(text);
  ASSIGN_OR_RETURN(c->spec, SampleSpec::FromYaml(c->text, ds.manifest(), source));
  RETURN_IF_ERROR(c->options.MergeYaml(c->text, c->spec, ds.manifest(), source));
  if (schedule_version != 0) c->options.order.version = schedule_version;
  // The digest a failing-over client compares: the config's text, and the schedule version
  // when it shapes the samples (GOP mode from version 2; every mode from version 3, whose audio
  // is decoded in chunks). A version-1 order, and a naive one of version 2, keep the digest
  // servers gave before versions existed, so old and new servers of one job agree exactly when
  // their samples do.
  // The tokenizer models the config names go in too (their SHA-256): the same text with another
  // model gives other ids. A config without one keeps the digest it had.
  const uint32_t version = c->options.order.version;
  std::string identity = version == 1 || (c->options.order.naive() && version == 2)
                             ? c->text
                             : StrCat(c->text, std::string_view("\0", 1), "schedule_version=",
                                      c->options.order.version);
  const std::string files = TokenizerIdentity(c->spec);
  if (!files.empty()) StrAppend(&identity, std::string_view("\0", 1), files);
  c->digest = Sha256Hex(identity);
  // The schedule shapes the order: resolve it from the config's own byte budget, before the
  // server's per-stream budget applies, so every server and `conveyor batches` agree.
  RETURN_IF_ERROR(ResolveSchedule(ds, c->spec, &c->options));
  ASSIGN_OR_RETURN(const std::string order, OrderIdentityText(c->text, c->options, files));
  c->order_digest = Sha256Hex(order);
  return c;
}

// One open stream, registered so that the reaper can cancel its pipeline when the client goes
// away (the sync API offers no callback) or the server shuts down.
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

// The client's address without its port: "ipv4:10.0.0.5:51234" -> "ipv4:10.0.0.5".
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  if (colon == std::string::npos || colon == first) return peer;
  return peer.substr(0, colon);
}

}  // namespace

bool IsLoopbackAddress(const std::string& listen) {
  if (listen.rfind("unix:", 0) == 0) return true;
  std::string host;
  if (!listen.empty() && listen.front() == '[') {
    const size_t close = listen.find(']');
    if (close == std::string::npos) return false;
    host = listen.substr(1, close - 1);
  } else {
    const size_t colon = listen.rfind(':');
    host = colon == std::string::npos ? listen : listen.substr(0, colon);
  }
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::Status ValidateJobName(const std::string& job) {
  constexpr size_t kMax = 128;
  if (job.empty() || job.size() > kMax) {
    return absl::InvalidArgumentError(StrCat("job name of ", job.size(), " characters: give 1 to ",
                                             kMax, " characters of [A-Za-z0-9._:/@-]"));
  }
  for (size_t i = 0; i < job.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(job[i]);
    if (!(std::isalnum(c) || c == '.' || c == '_' || c == ':' || c == '/' || c == '@' || c == '-')) {
      return absl::InvalidArgumentError(StrCat("job name has character ", static_cast<int>(c),
                                               " at position ", i, ": use only [A-Za-z0-9._:/@-]"));
    }
  }
  return absl::OkStatus();
}

struct DataServer::Impl : public RawStreamBatchesService {
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
  // The server-wide memory budget (ServerLimits::server_memory_bytes, resolved at start) and the
  // admitted streams' estimates held against it.
  uint64_t memory_budget = 0;
  std::string memory_budget_source;  // how the budget was set, for messages
  uint64_t memory_reserved ABSL_GUARDED_BY(mu) = 0;
  int memory_holders ABSL_GUARDED_BY(mu) = 0;
  std::unique_ptr<WorkerPool> reaper;  // Reap()
  StripeRegistry stripes;  // striped payloads: the streams stripe streams may join
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
  JobWaits waits;                               // the clients' reports, last 60 s

  grpc::Status Reject(grpc::StatusCode code, std::string message) {
    metrics->RequestRejected(CodeName(code));
    return grpc::Status(code, std::move(message));
  }

  grpc::Status Authorize(grpc::ServerContext* ctx) {
    if (check_local_user) return AuthorizeLocalUser(ctx);
    if (token.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string want = "Bearer " + token;
    if (it == md.end()) {
      return Reject(grpc::StatusCode::UNAUTHENTICATED,
                    "this server requires a bearer token: send 'authorization: Bearer TOKEN' "
                    "(conveyor fetch --auth-token-file FILE)");
    }
    const std::string got(it->second.data(), it->second.size());
    if (got.size() != want.size() || CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0) {
      return Reject(grpc::StatusCode::UNAUTHENTICATED, "the bearer token does not match the server's");
    }
    return grpc::Status::OK;
  }

  // The local user of a loopback call, from the kernel's socket table: admitted when it is one
  // of local_users, refused (and counted) otherwise, or when the user cannot be told.
  grpc::Status AuthorizeLocalUser(grpc::ServerContext* ctx) {
    const std::optional<uid_t> uid = server_internal::LocalPeerUid(ctx->peer(), listen_host, listen_port);
    if (uid && server_internal::LocalUserAllowed(*uid, local_users)) return grpc::Status::OK;
    metrics->IdentityRefused("local_user");
    if (!uid) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          StrCat("this server admits local users by uid, and the local user of connection ",
                                 ctx->peer(), " cannot be told (not in this host's socket table)"));
    }
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        StrCat("local user ", server_internal::DescribeUid(*uid),
                               " may not use this server: it admits its own user (",
                               server_internal::DescribeUid(geteuid()),
                               "), root, and those its operator names with --allow-uid / --allow-group "
                               "(docs/serving.md \"Who may connect\"); run a server of your own"));
  }

  // The client a per-peer limit counts: its local user when it is on this host, its address
  // otherwise (every same-host client shares 127.0.0.1).
  std::string PeerKey(grpc::ServerContext* ctx) {
    if (const std::optional<uid_t> uid = server_internal::LocalPeerUid(ctx->peer(), listen_host, listen_port)) {
      return StrCat("local user ", server_internal::DescribeUid(*uid));
    }
    return PeerHost(ctx->peer());
  }

  // A call of `job` (a stream when `stream`): its label, once the secret it presents
  // (metadata conveyor-job-secret) matches the job's. A slot taken from an idle job drops that
  // job's ledger, totals and series.
  absl::StatusOr<std::string> EnterJob(grpc::ServerContext* ctx, const std::string& job, bool stream) {
    std::string_view secret;
    const auto& md = ctx->client_metadata();
    if (auto it = md.find("conveyor-job-secret"); it != md.end()) secret = {it->second.data(), it->second.size()};
    absl::StatusOr<server_internal::JobRegistry::Claim> claim = jobs->Enter(job, secret, stream);
    if (!claim.ok()) {
      metrics->IdentityRefused("job_secret");
      spdlog::warn("refused a call of job '{}' from {}: its job secret differs", job, ctx->peer());
      return claim.status();
    }
    if (!claim->reclaimed.empty()) {
      spdlog::info("job '{}' idle for {} s: its slot goes to {}", claim->reclaimed, o.job_idle_seconds,
                   claim->reclaimed == job ? "a new job of that name and secret" : StrCat("job '", job, "'"));
      {
        absl::MutexLock lock(&jobs_mu);
        job_totals.erase(claim->reclaimed);
        coverage.erase(claim->reclaimed);
        refused_data_pin.erase(claim->reclaimed);
      }
      metrics->ForgetJob(claim->reclaimed);
    }
    return claim->label;
  }

  // The background warm-up (ServerOptions::frame_cache_warm_threads): each config in turn.
  void WarmCache() {
    for (const auto& c : configs) {
      WarmOptions wo;
      wo.threads = o.frame_cache_warm_threads;
      auto last = std::chrono::steady_clock::now();
      wo.progress = [&](const WarmProgress& p) {
        const auto now = std::chrono::steady_clock::now();
        if (now - last < std::chrono::seconds(10)) return;
        last = now;
        spdlog::info("frame cache warm-up, config '{}': {}/{} episodes, {} frames decoded ({:.0f} frames/s), {} already cached",
                     c->name, p.episodes_done, p.episodes, p.frames_decoded, p.frames_decoded / std::max(p.seconds, 1e-9),
                     p.frames_present);
      };
      absl::StatusOr<WarmProgress> p = WarmFrameCache(*source, c->spec, frame_cache.get(), wo);
      if (!p.ok()) {
        if (p.status().code() != absl::StatusCode::kCancelled) {
          spdlog::warn("frame cache warm-up, config '{}': {}", c->name, p.status().ToString());
        }
        if (CancelRequested()) return;
        continue;
      }
      spdlog::info("frame cache warm-up, config '{}': done, {} episodes ({} failed), {} frames decoded in {:.1f} s, {} already cached",
                   c->name, p->episodes_done, p->episodes_failed, p->frames_decoded, p->seconds, p->frames_present);
    }
  }

  // The reaper: cancels the pipelines of streams whose client went away, so that a stream
  // blocked in Pipeline::Next() ends promptly, and all of them at shutdown.
  // It also ends a stream whose client stopped taking batches for --stream-progress-timeout.
  void Reap() {
    absl::MutexLock lock(&mu);
    const int64_t timeout_ns = static_cast<int64_t>(o.stream_progress_timeout_seconds * 1e9);
    while (!reaper_stop) {
      const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
      auto check = [&](const ActiveStream* s) {
        const int64_t since = s->blocked_since_ns.load();
        if (timeout_ns > 0 && since != 0 && now - since > timeout_ns && !s->stalled.exchange(true)) {
          metrics->StreamStalled();
          s->ctx->TryCancel();  // unblocks a Write the client does not read
        }
      };
      for (const ActiveStream* s : stripe_calls) check(s);
      for (const auto& [s, r] : streams) {
        check(s);
        if (r.pipeline && (shutting_down || s->stalled || s->ctx->IsCancelled())) r.pipeline->Cancel();
      }
      cv.WaitWithTimeout(&mu, absl::Milliseconds(20));
    }
  }

  // A consumer's data wait (ReportRequest): counters per job, so that Prometheus can compare the
  // time training waits for data with its step time. Unlike a stream, a report costs nothing to
  // refuse; values that cannot be true are refused rather than summed.
  grpc::Status Report(grpc::ServerContext* ctx, const pb::ReportRequest* req, pb::ReportResponse*) override {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    if (req->protocol_version() != pb::PROTOCOL_VERSION_CURRENT) {
      return Reject(grpc::StatusCode::FAILED_PRECONDITION,
                    StrCat("this server speaks Conveyor protocol ", int{pb::PROTOCOL_VERSION_CURRENT},
                           "; the report says ", req->protocol_version()));
    }
    const std::string job = req->job().empty() ? "default" : req->job();
    if (absl::Status s = ValidateJobName(job); !s.ok()) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message()));
    }
    const double wait = req->wait_seconds(), step = req->step_seconds();
    // A report covers about a second; a day is far beyond any and keeps the counters sane.
    constexpr double kMaxSeconds = 86400;
    if (!std::isfinite(wait) || !std::isfinite(step) || wait < 0 || step < 0 ||
        wait > kMaxSeconds || step > kMaxSeconds || req->steps() > 1000000 ||
        req->consumers() == 0 || req->consumer() >= req->consumers() ||
        req->step_wait_seconds_size() > 1024) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                    StrCat("report out of range: ", req->steps(), " steps, ", wait, " s waiting, ",
                           step, " s of steps, consumer ", req->consumer(), " of ",
                           req->consumers(), ", ", req->step_wait_seconds_size(), " step waits"));
    }
    absl::StatusOr<std::string> entered = EnterJob(ctx, job, /*stream=*/false);
    if (!entered.ok()) return ToGrpc(entered.status());
    const std::string& label = *entered;
    metrics->ClientReport(label, req->steps(), step, std::min(wait, step));
    const std::vector<float> step_waits(req->step_wait_seconds().begin(), req->step_wait_seconds().end());
    metrics->StepWaits(label, step_waits);
    const auto now = std::chrono::steady_clock::now();
    waits.Add(label, req->consumer(), req->consumers(), req->steps(), std::min(wait, step), step,
              step_waits, now);
    bool summarize = false;
    {
      absl::MutexLock lock(&jobs_mu);
      JobTotals& t = job_totals[label];
      summarize = now - t.summarized >= std::chrono::seconds(1);
      if (summarize) t.summarized = now;
    }
    if (summarize) {
      const JobWaits::Summary s = JobWaits::Summarize(waits.Ranks(label, now));
      metrics->JobWaitSummary(label, s.p50, s.p99, s.max, s.slowest_rank, s.slowest_wait_share);
    }
    return grpc::Status::OK;
  }

  grpc::Status Info(grpc::ServerContext* ctx, const pb::InfoRequest*, pb::InfoResponse* r) override {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    const Manifest& m = source->manifest();
    r->set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
    r->set_server_version(o.version);
    r->set_dataset_name(m.name);
    r->set_dataset_uri(source->uri());
    r->set_dataset_fingerprint(m.fingerprint);
    r->set_episodes(m.num_episodes);
    r->set_total_duration_s(m.total_duration_s);
    for (const StreamInfo& s : m.streams) {
      pb::StreamInfo* p = r->add_streams();
      p->set_name(s.name);
      p->set_kind(std::string(format::StreamKindName(s.kind)));
      p->set_codec(s.codec);
      p->set_rate(s.rate);
      for (int64_t d : s.shape) p->add_shape(d);
    }
    for (const auto& c : configs) {
      pb::ConfigInfo* p = r->add_configs();
      p->set_name(c->name);
      p->set_config_digest(c->digest);
      p->set_order_digest(c->order_digest);
      p->set_samples_per_epoch(c->samples_per_epoch);
      p->set_steps_per_epoch(c->steps_per_epoch);
      p->set_global_batch_size(c->options.global_batch_size);
    }
    r->set_max_message_bytes(o.max_message_bytes);
    // Jobs: streams open here, totals, and the ranks' reports of the window.
    std::map<std::string, pb::JobStatus> jobs;
    {
      absl::MutexLock lock(&mu);
      r->set_active_streams(streams.size());
      for (const auto& [s, reg] : streams) {
        if (reg.job_label.empty()) continue;
        pb::JobStatus& j = jobs[reg.job_label];
        j.set_streams(j.streams() + 1);
        j.set_queue_bytes(j.queue_bytes() + s->queue_bytes.load());
        j.set_queue_budget_bytes(j.queue_budget_bytes() + reg.queue_budget);
      }
    }
    {
      absl::MutexLock lock(&jobs_mu);
      for (const auto& [job, n] : refused_data_pin) jobs[job].set_refused_data_pin(n);
    }
    std::map<std::string, std::vector<JobWaits::Rank>> reported = waits.Snapshot();
    for (const auto& [job, ranks] : reported) {
      pb::JobStatus& j = jobs[job];
      for (const JobWaits::Rank& k : ranks) {
        pb::RankWait* w = j.add_ranks();
        w->set_rank(k.rank);
        w->set_consumers(k.consumers);
        w->set_steps(k.steps);
        w->set_wait_seconds(k.wait_seconds);
        w->set_step_seconds(k.step_seconds);
        w->set_max_wait_seconds(k.max_wait_seconds);
        for (uint64_t b : k.buckets) w->add_wait_buckets(b);
      }
    }
    {
      absl::MutexLock lock(&jobs_mu);
      for (const auto& [job, ledger] : coverage) {
        pb::JobStatus& j = jobs[job];
        for (const CoverageSlice& s : ledger.Slices()) {
          pb::CoverageSlice* c = j.add_coverage();
          c->set_epoch(s.epoch);
          c->set_consumer(s.consumer);
          c->set_consumers(s.consumers);
          c->set_global_batch_size(s.global_batch_size);
          c->set_samples(s.samples);
          c->set_digest(s.digest);
          c->set_first_position(s.first_position);
          c->set_end_position(s.end_position);
          c->set_batches(s.batches);
        }
      }
      for (auto& [job, j] : jobs) {
        j.set_job(job);
        if (auto it = job_totals.find(job); it != job_totals.end()) {
          j.set_samples(it->second.samples);
          j.set_frames_decoded(it->second.frames_decoded);
          j.set_frames_delivered(it->second.frames_delivered);
        }
        *r->add_jobs() = std::move(j);
      }
    }
    r->set_wait_window_seconds(60);
    if (frame_cache) {
      const FrameCacheStats fs = frame_cache->stats();
      pb::FrameCacheStatus* fc = r->mutable_frame_cache();
      fc->set_max_bytes(fs.max_bytes);
      fc->set_bytes(fs.bytes);
      fc->set_frames(fs.frames);
      fc->set_hits(fs.hits);
      fc->set_misses(fs.misses);
      fc->set_evicted_bytes(fs.evicted_bytes);
      fc->set_rejected(fs.rejected);
      fc->set_policy(o.frame_cache_policy);
      if (fs.has_store) {
        fc->set_store_dir(o.frame_cache_dir);
        fc->set_store_hits(fs.store.hits);
        fc->set_store_misses(fs.store.misses);
        fc->set_store_bytes(fs.store.usage_bytes);
        fc->set_store_max_bytes(fs.store.max_bytes);
        fc->set_store_published(fs.store.published);
        fc->set_store_rejected(fs.store.rejected);
        fc->set_store_evicted_bytes(fs.store.evicted_bytes);
        fc->set_store_corrupt(fs.store.corrupt);
      }
    }
    for (double b : JobWaits::kBucketBounds) r->add_wait_bucket_bounds(b);
    return grpc::Status::OK;
  }

  // Where each tensor's bytes are counted in metrics: masks by role, a stream's samples by its
  // kind, the rest as the mixture's tag or packing bookkeeping.
  std::string Modality(const TensorView& tensor) const {
    if (tensor.role == TensorRole::kPaddingMask) return "mask";
    const int i = source->manifest().StreamIndex(tensor.name);
    if (i < 0) {
      return !source->tag_stream().empty() && tensor.name == source->tag_stream() ? "tag" : "packing";
    }
    return std::string(format::StreamKindName(source->manifest().streams[i].kind));
  }

  using Writer = RawStreamBatchesService::Stream;

  // A stream's place in the registry, released however the stream ends (an early return, an
  // error, an exception): the slot is freed and the reaper never sees a dangling entry.
  class StreamSlot {
   public:
    StreamSlot(Impl* server, ActiveStream* entry) : server_(server), entry_(entry) {}
    ~StreamSlot() {
      {
        absl::MutexLock lock(&server_->mu);
        server_->streams.erase(entry_);
        server_->UpdateHealth();
      }
      server_->metrics->streams_active.Decrement();
    }
    StreamSlot(const StreamSlot&) = delete;
    StreamSlot& operator=(const StreamSlot&) = delete;

   private:
    Impl* server_;
    ActiveStream* entry_;
  };

  // Admission, before anything is read or resolved: shutdown, the stream limit, the per-peer
  // limit. OK: `entry` is registered and *slot releases it.
  grpc::Status Admit(ActiveStream* entry, std::optional<StreamSlot>* slot) {
    absl::MutexLock lock(&mu);
    if (shutting_down) {
      return Reject(grpc::StatusCode::UNAVAILABLE, "server is shutting down: use another server");
    }
    if (static_cast<int>(streams.size()) >= o.max_streams) {
      return Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                    StrCat("server is at its limit of ", o.max_streams,
                           " streams (--max-streams): use another server or raise the limit"));
    }
    int from_peer = 0;
    for (const auto& [s, r] : streams) from_peer += s->peer == entry->peer ? 1 : 0;
    if (from_peer >= o.limits.max_streams_per_peer) {
      return Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                    StrCat("client ", entry->peer, " already has ", from_peer,
                           " streams open, the limit per client (its local user on this host, its "
                           "address otherwise) "
                           "(--max-streams-per-peer ", o.limits.max_streams_per_peer, ")"));
    }
    streams.emplace(entry, Registered{});
    metrics->streams_active.Increment();
    slot->emplace(this, entry);
    UpdateHealth();
    return grpc::Status::OK;
  }

  // Health says SERVING exactly while a new stream would be admitted (by the stream limit). Set
  // only when it changes: every SetServingStatus call is a message to each Watch.
  void UpdateHealth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (server == nullptr || shutting_down) return;
    const bool serving = static_cast<int>(streams.size()) < o.max_streams;
    if (health_serving == serving) return;
    if (auto* health = server->GetHealthCheckService()) {
      health->SetServingStatus(serving);
      health_serving = serving;
    }
  }
  bool health_serving ABSL_GUARDED_BY(mu) = true;  // what was last set (Start sets SERVING)

  // Up to `wanted` stripe calls for a stream, as many as the stripe pool has room for (0 when
  // fewer than 2: the payloads then travel on the stream itself). Returned by ReleaseStripes.
  uint32_t ReserveStripes(uint32_t wanted) {
    absl::MutexLock lock(&mu);
    const int room = o.max_streams - stripe_slots;
    const uint32_t k = room < 2 ? 0 : std::min<uint32_t>(wanted, static_cast<uint32_t>(room));
    stripe_slots += static_cast<int>(k);
    UpdateHealth();
    return k;
  }
  void ReleaseStripes(uint32_t k) {
    absl::MutexLock lock(&mu);
    stripe_slots -= static_cast<int>(k);
    UpdateHealth();
  }

  // A stream's share of the server-wide memory budget, returned however the stream ends.
  class MemoryReservation {
   public:
    MemoryReservation(Impl* server, uint64_t bytes) : server_(server), bytes_(bytes) {}
    ~MemoryReservation() {
      absl::MutexLock lock(&server_->mu);
      server_->memory_reserved -= bytes_;
      server_->memory_holders -= 1;
      server_->metrics->memory_reserved_bytes.Set(static_cast<double>(server_->memory_reserved));
    }
    MemoryReservation(const MemoryReservation&) = delete;
    MemoryReservation& operator=(const MemoryReservation&) = delete;

   private:
    Impl* server_;
    uint64_t bytes_;
  };

  // Admits a stream's estimate against the server-wide budget, or refuses it, naming the budget,
  // what the running streams hold and what to do.
  grpc::Status ReserveMemory(uint64_t bytes, std::optional<MemoryReservation>* out) {
    if (TryReserveMemory(bytes, out)) return grpc::Status::OK;
    absl::MutexLock lock(&mu);
    {
      return Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                    StrCat("this stream would hold about ", bytes, " bytes; the ", memory_holders,
                           " streams running hold ", memory_reserved, " of this server's memory "
                           "budget of ", memory_budget, " bytes (", memory_budget_source,
                           "): retry when a stream ends (the client does, until its reconnect "
                           "timeout), use another server, or lower pipeline.queue_bytes or the "
                           "batch size"));
    }
  }

  // The same admission, without refusing: false when `bytes` do not fit now.
  bool TryReserveMemory(uint64_t bytes, std::optional<MemoryReservation>* out) {
    absl::MutexLock lock(&mu);
    if (bytes > memory_budget || memory_reserved > memory_budget - bytes) return false;
    memory_reserved += bytes;
    memory_holders += 1;
    metrics->memory_reserved_bytes.Set(static_cast<double>(memory_reserved));
    out->emplace(this, bytes);
    return true;
  }

  // The ceilings of ServerLimits, applied to a resolved config and this request's options.
  // Lowers the config's decode limits to the server's; refuses what cannot fit. *stream_bytes:
  // the stream's memory estimate, for the server-wide budget.
  grpc::Status CheckCeilings(SampleSpec* spec, const PipelineOptions& po, uint64_t* stream_bytes,
                             uint64_t* batch_bytes) {
    const ServerLimits& l = o.limits;
    spec->limits.max_pixels = std::min(spec->limits.max_pixels, l.max_pixels);
    spec->limits.max_frames_per_sample = std::min(spec->limits.max_frames_per_sample, l.max_frames_per_sample);
    spec->limits.max_audio_samples = std::min(spec->limits.max_audio_samples, l.max_audio_samples);
    spec->limits.max_sample_bytes =
        std::min<int64_t>(spec->limits.max_sample_bytes, static_cast<int64_t>(l.max_sample_bytes));
    if (po.global_batch_size > l.max_global_batch_size) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                    StrCat("pipeline.global_batch_size is ", po.global_batch_size,
                           "; this server's ceiling is ", l.max_global_batch_size,
                           " (--max-global-batch-size)"));
    }
    for (const StreamSpec& st : spec->streams) {
      if (st.kind != format::v1::VIDEO && st.kind != format::v1::IMAGE) continue;
      if (static_cast<int64_t>(st.deltas.size()) > l.max_frames_per_sample) {
        return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                      StrCat("streams.", source->manifest().streams[st.stream].name, " asks for ",
                             st.deltas.size(), " frames per sample; this server's ceiling is ",
                             l.max_frames_per_sample, " (--max-frames-per-sample)"));
      }
      if (static_cast<int64_t>(st.height) * st.width > l.max_pixels) {
        return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                      StrCat("streams.", source->manifest().streams[st.stream].name, " asks for ",
                             st.width, "x", st.height, " frames; this server's ceiling is ",
                             l.max_pixels, " pixels (--max-pixels)"));
      }
    }
    const MemoryEstimate e = EstimateMemory(*source, *spec, po);
    if (e.sample_bytes > l.max_sample_bytes) {
      return Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                    StrCat("one sample of this config is about ", e.sample_bytes,
                           " bytes; this server's ceiling is ", l.max_sample_bytes,
                           " (--max-sample-bytes): ask for fewer or smaller frames"));
    }
    if (e.batch_bytes > l.max_batch_bytes) {
      return Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                    StrCat("one consumer batch of this config is about ", e.batch_bytes,
                           " bytes; this server's ceiling is ", l.max_batch_bytes,
                           " (--max-batch-bytes): use more consumers or a smaller batch"));
    }
    if (e.total > l.stream_memory_bytes) {
      return Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                    StrCat("this stream would hold about ", e.total, " bytes (pre-decoded frames ",
                           e.window_prefetch_bytes, ", samples in flight ", e.in_flight_bytes,
                           ", batch buffers 2 x ", e.batch_bytes,
                           "); this server gives a stream at most ", l.stream_memory_bytes,
                           " (--stream-memory-bytes): lower pipeline.queue_bytes, the schedule's "
                           "window_blocks or the batch size"));
    }
    *stream_bytes = e.total;
    *batch_bytes = e.batch_bytes;
    return grpc::Status::OK;
  }

  grpc::Status StreamRaw(grpc::ServerContext* ctx, const pb::StreamBatchesRequest* req,
                         Writer* writer) override {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    if (req->protocol_version() != pb::PROTOCOL_VERSION_CURRENT) {
      return Reject(grpc::StatusCode::FAILED_PRECONDITION,
                    StrCat("this server speaks Conveyor protocol ", int{pb::PROTOCOL_VERSION_CURRENT},
                           "; the request says ", req->protocol_version(),
                           req->protocol_version() == 0 ? " (not set: an old or hand-made client?)" : "",
                           ": use a client of the same release as the server"));
    }
    if (!req->stripe_token().empty()) return ServeStripe(ctx, *req, writer);
    const std::string job = req->job().empty() ? "default" : req->job();
    if (absl::Status s = ValidateJobName(job); !s.ok()) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message()));
    }
    if (req->has_config_yaml() && req->config_yaml().size() > o.max_config_bytes) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                    StrCat("the request's config is ", req->config_yaml().size(),
                           " bytes; this server accepts at most ", o.max_config_bytes,
                           ": send a sample spec, not data"));
    }
    absl::StatusOr<std::string> label = EnterJob(ctx, job, /*stream=*/true);
    if (!label.ok()) return ToGrpc(label.status());
    struct JobStream {  // the job's slot is held while its stream runs
      server_internal::JobRegistry* jobs;
      const std::string& label;
      ~JobStream() { jobs->Release(label); }
    } job_stream{jobs.get(), *label};
    ActiveStream entry;
    entry.ctx = ctx;
    entry.peer = PeerKey(ctx);
    entry.job_label = *label;
    std::optional<StreamSlot> slot;
    if (grpc::Status s = Admit(&entry, &slot); !s.ok()) return s;
    std::string outcome = "ok";
    grpc::Status result;
    // No exception leaves a stream: a failed allocation (a batch larger than memory) or any other
    // throw ends this stream alone, its slot and memory freed by RAII on the way out.
    try {
      result = StartAndServe(ctx, *req, job, writer, &entry, &outcome);
    } catch (const std::bad_alloc&) {
      outcome = "error";
      result = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "the server ran out of memory for this stream; lower the batch size or "
                            "the frame sizes");
    } catch (const std::exception& e) {
      outcome = "error";
      result = grpc::Status(grpc::StatusCode::INTERNAL, StrCat("internal error in this stream: ", e.what()));
    }
    slot.reset();
    metrics->StreamEnded(outcome);
    if (!result.ok() && outcome == "error") metrics->Error(*label, CodeName(result.error_code()));
    spdlog::info("stream job={} consumer={}/{} from {} ended: {} {}", job, req->consumer(),
                 req->consumers(), ctx->peer(), CodeName(result.error_code()), result.error_message());
    return result;
  }

  // True once the call is over for this server: the client cancelled, or the server drains.
  StopFn StreamOver(grpc::ServerContext* ctx, const ActiveStream* entry = nullptr) {
    return [this, ctx, entry] {
      absl::MutexLock lock(&mu);
      return shutting_down || ctx->IsCancelled() || (entry != nullptr && entry->stalled);
    };
  }

  // A stripe stream (server/internal/stripes.h): the payload messages its stream hands it,
  // until that stream ends. It holds no admission slot: it is part of a stream that does.
  grpc::Status ServeStripe(grpc::ServerContext* ctx, const pb::StreamBatchesRequest& req, Writer* writer) {
    std::shared_ptr<StripeSession> session = stripes.Find(req.stripe_token());
    if (!session) {
      return Reject(grpc::StatusCode::FAILED_PRECONDITION,
                    "no stream of this server has that stripe token (it ended, or it was on another server)");
    }
    const uint32_t i = req.stripe_index();
    if (!session->Join(i)) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                    StrCat("stripe ", i, " of ", session->streams(), " is out of range or already joined"));
    }
    // Registered while it runs, so that the reaper ends it when its client stops reading (the
    // progress timeout, as for streams); its slot (ReserveStripes) is released when it ends.
    ActiveStream call;
    call.ctx = ctx;
    struct Registration {
      Impl* server;
      ActiveStream* call;
      ~Registration() {
        absl::MutexLock lock(&server->mu);
        server->stripe_calls.erase(call);
        server->stripe_slots -= 1;
        server->UpdateHealth();
      }
    } registration{this, &call};
    {
      absl::MutexLock lock(&mu);
      stripe_calls.insert(&call);
    }
    const StopFn cancelled = StreamOver(ctx, &call);
    while (std::optional<grpc::ByteBuffer> m = session->Pop(i, cancelled)) {
      call.Blocked();
      const bool written = writer->Write(*m);
      call.Progressed();
      if (call.stalled) {
        session->Fail(i, "its client took nothing for the progress timeout");
        return Stalled();
      }
      if (!written) {
        session->Fail(i, "the client's stripe stream went away");
        return grpc::Status::CANCELLED;
      }
    }
    if (cancelled()) {
      session->Fail(i, "the server is shutting down or the client cancelled");
      return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

  grpc::Status Stalled() const {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        StrCat("the client took no batch for ", o.stream_progress_timeout_seconds,
                               " s (--stream-progress-timeout): the stream is ended to free its slot"));
  }

  // Resolves an admitted request into a pipeline and serves it.
  grpc::Status StartAndServe(grpc::ServerContext* ctx, const pb::StreamBatchesRequest& req,
                             const std::string& job, Writer* writer, ActiveStream* entry,
                             std::string* outcome) {
    *outcome = "rejected";
    const Manifest& m = source->manifest();
    if (!req.dataset().empty() && req.dataset() != m.name && req.dataset() != m.fingerprint) {
      return Reject(grpc::StatusCode::NOT_FOUND,
                    StrCat("unknown dataset '", req.dataset().substr(0, 256), "': this server serves '",
                           m.name, "' (fingerprint ", m.fingerprint, ")"));
    }
    if (req.consumers() == 0) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT, "consumers must be at least 1");
    }
    if (req.consumer() >= req.consumers()) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                    StrCat("consumer index ", req.consumer(), " is out of range for ", req.consumers(),
                           " consumers (0 <= consumer < consumers)"));
    }
    // The config: one the server was started with, or the request's own (a oneof: never both).
    std::shared_ptr<Config> config;
    if (req.has_config_yaml()) {
      absl::StatusOr<std::shared_ptr<Config>> c =
          ResolveConfig(*source, "inline", req.config_yaml(), "request config");
      if (!c.ok()) return Reject(ToGrpc(c.status()).error_code(), std::string(c.status().message()));
      config = *c;
    } else {
      const std::string& name = req.config_name();
      for (const auto& c : configs) {
        if (name.empty() || c->name == name) {
          config = c;
          break;
        }
      }
      if (!config) {
        std::vector<std::string> names;
        for (const auto& c : configs) names.push_back(c->name);
        return Reject(grpc::StatusCode::NOT_FOUND,
                      StrCat("unknown config '", name.substr(0, 256), "': this server has ",
                             absl::StrJoin(names, ", ")));
      }
    }
    if (req.schedule_version() > kScheduleVersionCurrent) {
      return Reject(grpc::StatusCode::INVALID_ARGUMENT,
                    StrCat("schedule_version ", req.schedule_version(), " is unknown to this server (",
                           o.version, "): it knows 1 to ", kScheduleVersionCurrent));
    }
    if (req.schedule_version() != 0 && req.schedule_version() != config->options.order.version) {
      // The config's own source: a file's relative paths (a tokenizer model) resolve from it.
      absl::StatusOr<std::shared_ptr<Config>> c =
          ResolveConfig(*source, config->name, config->text, config->spec.config_source, req.schedule_version());
      if (!c.ok()) return Reject(ToGrpc(c.status()).error_code(), std::string(c.status().message()));
      config = *c;
    }
    // The job's pin (its checkpoint, or its launcher's): refused here, before any work, so the
    // refusal is counted and logged where the operator looks (the client checks it too).
    if ((!req.expect_dataset_fingerprint().empty() &&
         req.expect_dataset_fingerprint() != source->manifest().fingerprint) ||
        (!req.expect_order_digest().empty() && req.expect_order_digest() != config->order_digest)) {
      spdlog::warn("refused a stream of job '{}' rank {}: it pins dataset {} order {}, this server serves {} "
                   "order {}", req.job().substr(0, 256), req.consumer(), req.expect_dataset_fingerprint().substr(0, 64),
                   req.expect_order_digest().substr(0, 12), source->manifest().fingerprint,
                   config->order_digest.substr(0, 12));
      metrics->DataPinRefused();
      {
        absl::MutexLock lock(&jobs_mu);
        ++refused_data_pin[entry->job_label];
      }
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, StrCat(
          "this server serves dataset ", source->manifest().name, " (fingerprint ", source->manifest().fingerprint,
          ", order ", config->order_digest.substr(0, 12), ") but the job pins fingerprint ",
          req.expect_dataset_fingerprint().empty() ? "(any)" : req.expect_dataset_fingerprint().substr(0, 64),
          ", order ", req.expect_order_digest().empty() ? "(any)" : req.expect_order_digest().substr(0, 12),
          " (its checkpoint or its launcher's CONVEYOR_DATASET_FINGERPRINT / CONVEYOR_ORDER_DIGEST): its cursor "
          "names other samples here. Point the job at the data it trained on, or continue on purpose (Loader."
          "load_state_dict(state, allow_data_change=True); docs/python.md \"What a job pins\")"));
    }
    const uint64_t max_message =
        req.max_message_bytes() == 0
            ? o.max_message_bytes
            : std::clamp<uint64_t>(req.max_message_bytes(), kMinMessageBytes, kMaxMessageCap);
    PipelineOptions po = config->options;
    po.frame_cache = frame_cache;
    po.cpu_slots = cpu_slots;
    po.consumer = req.consumer();
    po.consumers = req.consumers();
    po.threads = o.threads;
    po.queue_bytes = std::min(po.queue_bytes, o.queue_bytes);
    po.pinned = false;
    SampleSpec spec = config->spec;  // with the server's ceilings applied
    uint64_t stream_bytes = 0, batch_bytes = 0;
    if (grpc::Status s = CheckCeilings(&spec, po, &stream_bytes, &batch_bytes); !s.ok()) return s;
    // The same-host ring, when the client offers to take one: its pages are the stream's too, so
    // it is admitted with the stream, or the stream goes without it.
    absl::StatusOr<uint64_t> ring = absl::FailedPreconditionError("");
    if (req.has_shared_memory()) ring = SharedMemoryRing(ctx, req.shared_memory(), po, batch_bytes);
    std::optional<MemoryReservation> reservation;  // held until the stream ends
    if (ring.ok() && !TryReserveMemory(stream_bytes + *ring, &reservation)) {
      ring = absl::ResourceExhaustedError(StrCat("this server's memory budget has no room for a shared ring of ",
                                                 *ring, " bytes beside the stream's ", stream_bytes));
    }
    if (!reservation) {
      if (grpc::Status s = ReserveMemory(stream_bytes, &reservation); !s.ok()) return s;
    }
    Cursor start{req.start().epoch(), req.start().step()};
    if (req.start().has_position()) start.position = req.start().position();
    *outcome = "ok";
    return Serve(ctx, writer, req, job, *config, spec, po, start, max_message, ring, entry, outcome);
  }

  // The ring of the stream's same-host region, or why it gets none
  // (StreamStart.shared_memory_refused). Room for the batches the client may hold unreleased,
  // the one being built and one skipped at the ring's end, from the config's estimate of a
  // batch; at most what the client accepts and the stream's byte budget.
  absl::StatusOr<uint64_t> SharedMemoryRing(grpc::ServerContext* ctx, const pb::SharedMemoryOffer& offer,
                                            const PipelineOptions& po, uint64_t batch_bytes) {
    if (!o.shared_memory) return absl::FailedPreconditionError("the server runs with --shared-memory=false");
    if (!offer.server_region()) {
      return absl::FailedPreconditionError(
          "the client offers a region of its own, which this server no longer writes into: upgrade the client");
    }
    static const std::string host = shm::HostId();
    if (host.empty() || offer.host() != host) {
      return absl::FailedPreconditionError(StrCat("the client runs on another host or with another /dev/shm (client ",
                                                  offer.host().substr(0, 128), ", server ", host, ")"));
    }
    // The region's socket is private to this server's user (0600): a client of another user
    // (admitted by --allow-uid, --allow-group or --loopback-open) could not open it, and the
    // stream would wait for it in vain before its payloads came in messages.
    if (const std::optional<uid_t> uid = server_internal::LocalPeerUid(ctx->peer(), listen_host, listen_port);
        uid && *uid != geteuid() && *uid != 0) {
      return absl::FailedPreconditionError(
          StrCat("the client runs as local user ", server_internal::DescribeUid(*uid),
                 " and a same-host region's socket is private to this server's user (",
                 server_internal::DescribeUid(geteuid()), "): payloads come in messages"));
    }
    if (offer.capacity() < shm::kAlign) {
      return absl::FailedPreconditionError(StrCat("the client accepts a ring of ", offer.capacity(), " bytes"));
    }
    const uint64_t batch = (batch_bytes + batch_bytes / 8 + shm::kAlign) / shm::kAlign * shm::kAlign;
    const uint64_t batches = std::clamp<uint64_t>(offer.batches_ahead(), 1, 64) + 2;
    const uint64_t wanted = batch > UINT64_MAX / batches ? UINT64_MAX : batch * batches;
    return std::max<uint64_t>(shm::kAlign, std::min({offer.capacity(), po.queue_bytes, wanted}) / shm::kAlign * shm::kAlign);
  }

  grpc::Status Serve(grpc::ServerContext* ctx, Writer* writer, const pb::StreamBatchesRequest& req,
                     const std::string& job, const Config& config, const SampleSpec& spec,
                     const PipelineOptions& po, Cursor start, uint64_t max_message,
                     const absl::StatusOr<uint64_t>& ring, ActiveStream* entry, std::string* outcome) {
    absl::StatusOr<std::unique_ptr<Pipeline>> created = Pipeline::Create(*source, spec, po, start);
    if (!created.ok()) {
      *outcome = "rejected";
      return Reject(ToGrpc(created.status()).error_code(), std::string(created.status().message()));
    }
    std::unique_ptr<Pipeline> pipeline = std::move(*created);
    {
      absl::MutexLock lock(&mu);
      streams[entry].pipeline = pipeline.get();
      if (shutting_down) pipeline->Cancel();
    }
    // Declared after `pipeline`, so destroyed before it however Serve ends (an exception too):
    // the reaper never cancels a pipeline that is gone.
    struct Unregister {
      Impl* server;
      ActiveStream* entry;
      ~Unregister() {
        absl::MutexLock lock(&server->mu);
        if (auto it = server->streams.find(entry); it != server->streams.end()) it->second.pipeline = nullptr;
      }
    } unregister{this, entry};
    const uint64_t steps = pipeline->steps_per_epoch();
    pb::StreamBatchesResponse first;
    pb::StreamStart* st = first.mutable_start();
    st->set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
    st->set_server_version(o.version);
    st->set_dataset_name(source->manifest().name);
    st->set_dataset_fingerprint(source->manifest().fingerprint);
    st->set_config_digest(config.digest);
    st->set_order_digest(config.order_digest);
    st->set_samples_per_epoch(pipeline->num_samples());
    st->set_steps_per_epoch(steps);
    st->set_global_batch_size(po.global_batch_size);
    st->set_max_epochs(po.max_epochs);
    st->set_schedule_version(po.order.version);
    CursorToProto(pipeline->start(), st->mutable_start());
    // The transport (server/internal/payload_sink.h): the same-host region when the client offers to take
    // one and runs where this server does, payloads in messages otherwise.
    std::unique_ptr<SharedMemorySink> region;
    if (req.has_shared_memory()) {
      absl::StatusOr<std::unique_ptr<SharedMemorySink>> r =
          ring.ok() ? SharedMemorySink::Create(*ring, req.shared_memory().batches_ahead(), max_message)
                    : absl::StatusOr<std::unique_ptr<SharedMemorySink>>(ring.status());
      if (r.ok()) {
        region = std::move(*r);
        st->set_shared_memory(true);
        st->set_shared_memory_ring(region->ring());
        st->set_shared_memory_socket(region->socket_path());
        st->set_shared_memory_token(region->token());
      } else {
        st->set_shared_memory_refused(std::string(r.status().message()));
      }
    }
    // Striped payloads, when asked for and the payloads travel in messages.
    // Each stripe is a call from the stripe pool (stripe_slots): a stream gets as many as are free.
    std::shared_ptr<StripeSession> stripe_session;
    std::string stripe_token;
    const uint32_t stripe_calls =
        !region && req.payload_streams() > 1 ? ReserveStripes(std::min(req.payload_streams(), kMaxPayloadStreams)) : 0;
    if (stripe_calls > 0) {
      stripe_session = stripes.Create(stripe_calls, 2 * max_message, &stripe_token);
      st->set_payload_streams(stripe_calls);
      st->set_stripe_token(stripe_token);
    }
    // When the stream is over no stripe may join any more; the slots of those that never joined are
    // released here, each joined one's when its call ends (ServeStripe).
    struct Unstripe {
      Impl* server;
      const std::string& token;
      const std::shared_ptr<StripeSession>& session;
      ~Unstripe() {
        if (!token.empty()) server->stripes.Remove(token);
        if (session) server->ReleaseStripes(session->StopJoining());
      }
    } unstripe{this, stripe_token, stripe_session};
    PipelineStats last{};
    // This job's series, created at 0 so that increase() and alerts see the first skip.
    const std::string label = entry->job_label;
    metrics->Skipped(label, 0);
    {
      const PipelineStats at_start = pipeline->stats();
      metrics->Quarantined(label, at_start.quarantined_episodes, at_start.quarantined_samples);
    }
    metrics->Frames(label, 0, 0);
    {
      absl::MutexLock lock(&mu);
      Registered& reg = streams[entry];
      reg.job_label = label;
      reg.queue_budget = po.queue_bytes;
    }
    auto finish = [&](grpc::Status s, const char* what) {
      metrics->queue_bytes.Decrement(static_cast<double>(last.queue_bytes));
      *outcome = what;  // `unregister` clears entry->pipeline on the way out
      return s;
    };
    if (!writer->Write(SerializeMessage(first))) return finish(grpc::Status::CANCELLED, "cancelled");
    const StopFn stop = StreamOver(ctx, entry);
    std::unique_ptr<PayloadSink> sink;
    if (region) {
      // The client connects as soon as it reads the stream start; meanwhile the workers decode.
      if (absl::Status h = region->Handoff(absl::Seconds(5), stop); !h.ok()) {
        if (ctx->IsCancelled()) return finish(grpc::Status::CANCELLED, "cancelled");
        spdlog::warn("job={} consumer={}/{}: the client did not take its shared region ({}); payloads go in messages",
                     job, req.consumer(), req.consumers(), std::string(h.message()));
        region.reset();
      } else {
        // The ring's allocator polls stop() only while it waits for the client to release: that
        // wait is what the progress timeout measures.
        pipeline->SetBatchBuffers(region->buffers([entry, stop] {
          entry->Blocked();
          return stop();
        }));
        sink = std::move(region);
      }
    }
    if (stripe_session) {
      if (absl::Status j = stripe_session->WaitJoined(absl::Seconds(5), stop); !j.ok()) {
        if (ctx->IsCancelled()) return finish(grpc::Status::CANCELLED, "cancelled");
        // The client was told to expect stripes: it cannot be served without them.
        stripe_session->Close(/*drain=*/false);
        return finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, StrCat("striped payloads: ", j.message())),
                      "error");
      }
      sink = MakeStripedSink(stripe_session, max_message, stop);
    }
    if (!sink) sink = MakeGrpcSink(max_message);
    metrics->StreamTransport(std::string(sink->transport()));

    uint64_t sent = 0;
    Cursor cursor = pipeline->start();
    for (;;) {
      if (req.max_batches() && sent >= req.max_batches()) return finish(grpc::Status::OK, "ok");
      const auto t0 = Clock::now();
      absl::StatusOr<std::optional<Batch>> b = pipeline->Next();
      metrics->PipelineWait(label, Seconds(t0, Clock::now()));
      const PipelineStats now = pipeline->stats();
      Account(label, last, now);
      last = now;
      entry->queue_bytes.store(now.queue_bytes);
      bool draining = false;
      {
        absl::MutexLock lock(&mu);
        draining = shutting_down;
      }
      if (draining) {
        return finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   StrCat("server is shutting down; resume from cursor ",
                                          cursor.ToString(), " on another server")),
                      "shutdown");
      }
      if (entry->stalled) return finish(Stalled(), "stalled");
      if (ctx->IsCancelled()) return finish(grpc::Status::CANCELLED, "cancelled");
      entry->Progressed();
      if (!b.ok()) {
        spdlog::error("job={} consumer={}/{}: {}", job, req.consumer(), req.consumers(),
                      std::string(b.status().message()));
        return finish(ToGrpc(Annotate(b.status(), StrCat("batch ", cursor.ToString()))),
                      "error");
      }
      if (!b->has_value()) return finish(grpc::Status::OK, "ok");  // the real end: max_epochs
      const Batch& batch = **b;
      const auto t1 = Clock::now();
      entry->Blocked();  // until the client takes the batch
      const absl::Status delivered = SendBatch(writer, batch, *sink, label);
      if (entry->stalled) return finish(Stalled(), "stalled");
      entry->Progressed();
      if (absl::IsCancelled(delivered)) return finish(grpc::Status::CANCELLED, "cancelled");
      if (!delivered.ok()) {
        spdlog::error("job={} consumer={}/{}: {}", job, req.consumer(), req.consumers(),
                      std::string(delivered.message()));
        return finish(ToGrpc(Annotate(delivered, StrCat("batch ", cursor.ToString()))), "error");
      }
      const double send = Seconds(t1, Clock::now());
      metrics->batch_send_seconds.Observe(send);
      metrics->ConsumerWait(label, send);
      metrics->Stage("send", send);
      ++sent;
      cursor = batch.next;
      RecordCoverage(label, batch, po.global_batch_size);
    }
  }

  // A delivered batch into the job's ledger, and the ledger's latest epoch into the metrics.
  void RecordCoverage(const std::string& label, const Batch& batch, uint64_t global_batch_size) {
    uint64_t epoch = 0, samples = 0, slices = 0;
    {
      absl::MutexLock lock(&jobs_mu);
      CoverageLedger& ledger = coverage[label];
      ledger.Add(batch.cursor, batch.consumer, batch.consumers, global_batch_size, batch.ids);
      epoch = batch.cursor.epoch;
      for (const CoverageSlice& s : ledger.Slices()) {
        if (s.epoch != epoch) continue;
        samples += s.samples;
        ++slices;
      }
    }
    metrics->Coverage(label, epoch, samples, slices);
  }

  void Account(const std::string& label, const PipelineStats& a, const PipelineStats& b) {
    metrics->Stage("decode", b.decode_seconds - a.decode_seconds);
    metrics->Stage("assemble", b.assemble_seconds - a.assemble_seconds);
    metrics->Stage("batch", b.batch_seconds - a.batch_seconds);
    metrics->Stage("idle", b.worker_idle_seconds - a.worker_idle_seconds);
    metrics->Stage("cpu_slot_wait", b.cpu_slot_wait_seconds - a.cpu_slot_wait_seconds);
    if (cpu_slots) metrics->cpu_slots_in_use.Set(cpu_slots->stats().in_use);
    if (b.skipped > a.skipped) metrics->Skipped(label, b.skipped - a.skipped);
    const uint64_t decoded = b.frames_decoded > a.frames_decoded ? b.frames_decoded - a.frames_decoded : 0;
    const uint64_t delivered =
        b.frames_delivered > a.frames_delivered ? b.frames_delivered - a.frames_delivered : 0;
    if (decoded || delivered) metrics->Frames(label, decoded, delivered);
    total_decoded += decoded;
    total_delivered += delivered;
    if (decoded || delivered) {
      absl::MutexLock lock(&jobs_mu);
      JobTotals& t = job_totals[label];
      t.frames_decoded += decoded;
      t.frames_delivered += delivered;
    }
    if (total_delivered > 0) {
      metrics->decode_amplification.Set(static_cast<double>(total_decoded) / total_delivered);
    }
    metrics->queue_bytes.Increment(static_cast<double>(b.queue_bytes) - static_cast<double>(a.queue_bytes));
  }

  // One write outstanding: Write() returns when gRPC took the message (flow control). CANCELLED
  // when the client went away.
  absl::Status SendBatch(Writer* writer, const Batch& b, PayloadSink& sink, const std::string& job_label) {
    const double waited = sink.wait_seconds();
    RETURN_IF_ERROR(sink.Send(b, b.next, [&](const grpc::ByteBuffer& m) { return writer->Write(m); }));
    if (sink.wait_seconds() > waited) metrics->SharedMemoryWait(sink.wait_seconds() - waited);
    std::map<std::string, uint64_t> modality_bytes;
    for (const TensorView& t : b.tensors) modality_bytes[Modality(t)] += t.bytes;
    metrics->Batch(job_label, b.ids.size());
    {
      absl::MutexLock lock(&jobs_mu);
      job_totals[job_label].samples += b.ids.size();
    }
    std::vector<uint64_t> per_dataset(source->size(), 0);
    for (const SampleId& id : b.ids) {
      if (id.dataset < per_dataset.size()) ++per_dataset[id.dataset];
    }
    for (size_t k = 0; k < per_dataset.size(); ++k) {
      if (per_dataset[k] > 0) metrics->DatasetSamples(source->member(k).name, per_dataset[k]);
    }
    for (const auto& [modality, bytes] : modality_bytes) {
      metrics->Bytes(modality, bytes);
      if (modality != "mask" && modality != "packing") metrics->Samples(modality, b.ids.size());
    }
    return absl::OkStatus();
  }
};

DataServer::DataServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DataServer::~DataServer() {
  Shutdown(0);
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->reaper_stop = true;
    impl_->cv.SignalAll();
  }
  impl_->warmer.reset();  // cancels the episodes not started, joins
  impl_->reaper.reset();  // joins
}

std::string DataServer::address() const { return impl_->address; }
std::string DataServer::metrics_address() const { return impl_->metrics->address(); }

void DataServer::Shutdown(double grace_seconds) {
  std::call_once(impl_->shutdown_once, [&] {
    if (auto* health = impl_->server->GetHealthCheckService()) {
      health->SetServingStatus(false);
      health->Shutdown();
    }
    {
      absl::MutexLock lock(&impl_->mu);
      impl_->shutting_down = true;
      impl_->cv.SignalAll();
    }
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));
    impl_->server->Shutdown(deadline);
  });
}

void DataServer::Wait() { impl_->server->Wait(); }

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Start(ServerOptions o) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  if (o.config_paths.empty()) return absl::InvalidArgumentError("--config is required");
  if (o.threads < 1) return absl::InvalidArgumentError("--threads must be at least 1");
  if (o.cpu_slots < -1 || o.cpu_slots > static_cast<int>(kMaxThreads)) {
    return absl::InvalidArgumentError(StrCat("--cpu-slots must be in [0, ", kMaxThreads,
                                             "] (0: no bound), not ", o.cpu_slots));
  }
  if (o.max_streams < 1) return absl::InvalidArgumentError("--max-streams must be at least 1");
  if (o.max_message_bytes < kMinMessageBytes || o.max_message_bytes > kMaxMessageCap) {
    return absl::InvalidArgumentError(StrCat("--max-message-bytes must be in [", kMinMessageBytes,
                                             ", ", kMaxMessageCap, "]"));
  }
  const bool tls = !o.tls_cert_file.empty() || !o.tls_key_file.empty();
  if (tls && (o.tls_cert_file.empty() || o.tls_key_file.empty())) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  if (!o.tls_client_ca_file.empty() && !tls) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  if (!IsLoopbackAddress(o.listen) && o.auth_token_file.empty()) {
    if (!tls) {
      return absl::FailedPreconditionError(StrCat(
          "refusing to listen on ", o.listen, " without protection: anyone who can reach it could "
          "read the dataset. Give --auth-token-file FILE (a bearer token clients must send) or "
          "TLS with client certificates (--tls-cert, --tls-key, --tls-client-ca), or listen on "
          "127.0.0.1"));
    }
    if (o.tls_client_ca_file.empty()) {
      return absl::FailedPreconditionError(StrCat(
          "refusing to listen on ", o.listen, " with TLS but without client verification: TLS "
          "encrypts, yet anyone who can reach the port could still read the dataset. Add "
          "--tls-client-ca CA.pem (clients must present a certificate it signed) or "
          "--auth-token-file FILE"));
    }
  }
  if (!IsLoopbackAddress(o.listen) && !o.auth_token_file.empty() && !tls && !o.plaintext_token) {
    return absl::FailedPreconditionError(StrCat(
        "refusing to listen on ", o.listen, " with a bearer token but without TLS: the token and "
        "the batches would cross the network in cleartext, and whoever sees the token can read the "
        "dataset. Add --tls-cert and --tls-key (clients: --tls-ca), or, on a network that is "
        "private or encrypted below gRPC, --insecure-plaintext-token (docs/serving.md \"Who may "
        "connect\")"));
  }
  const bool unix_listener = o.listen.rfind("unix:", 0) == 0;
  if (unix_listener && (!o.allow_uids.empty() || o.allow_gids.size() > 1)) {
    return absl::InvalidArgumentError(StrCat(
        "--listen ", o.listen, ": a unix socket admits by its file's mode, so it takes no --allow-uid "
        "and at most one --allow-group (its group); listen on 127.0.0.1:PORT to admit users by uid"));
  }
  const bool by_credentials = !o.auth_token_file.empty() || !o.tls_client_ca_file.empty();
  if ((!o.allow_uids.empty() || !o.allow_gids.empty() || o.loopback_open) &&
      (!IsLoopbackAddress(o.listen) || by_credentials)) {
    return absl::InvalidArgumentError(StrCat(
        "--allow-uid, --allow-group and --loopback-open choose the local users of a loopback "
        "listener without a token or client certificates; this server (--listen ", o.listen, ") admits ",
        by_credentials ? "whoever presents its token or a client certificate" : "clients beyond this host",
        ": drop them"));
  }
  m.check_local_user = IsLoopbackAddress(o.listen) && !unix_listener && !o.loopback_open && !by_credentials;
  m.local_users.uids.assign(o.allow_uids.begin(), o.allow_uids.end());
  m.local_users.gids.assign(o.allow_gids.begin(), o.allow_gids.end());
  if (!(o.job_idle_seconds >= 0) || o.job_idle_seconds > 1e9) {
    return absl::InvalidArgumentError(StrCat("--job-idle-seconds must be at least 0, not ", o.job_idle_seconds));
  }
  m.jobs = std::make_unique<server_internal::JobRegistry>(
      kMaxJobSlots, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.job_idle_seconds)));
  if (o.limits.max_streams_per_peer < 1) {
    return absl::InvalidArgumentError("--max-streams-per-peer must be at least 1");
  }
  if (o.limits.max_global_batch_size < 1 || o.limits.max_pixels < 1 ||
      o.limits.max_frames_per_sample < 1 || o.limits.max_audio_samples < 1 ||
      o.limits.max_sample_bytes < 1 || o.limits.max_batch_bytes < 1 ||
      o.limits.stream_memory_bytes < o.queue_bytes) {
    return absl::InvalidArgumentError(
        "every ceiling must be at least 1, and --stream-memory-bytes at least --queue-bytes");
  }
  if (!o.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(std::string t, ReadTokenFile(o.auth_token_file));
    if (t.size() < 16) {
      return absl::InvalidArgumentError(StrCat("token file ", o.auth_token_file, " holds ", t.size(),
                                               " characters; use at least 16 (openssl rand -hex 32)"));
    }
    m.token = t;
  }
  ASSIGN_OR_RETURN(m.source, Source::Open(o.dataset));
  for (const std::string& path : o.config_paths) {
    ASSIGN_OR_RETURN(std::string text, ReadLocalFile(path, "config"));
    const std::string name = std::filesystem::path(path).stem().string();
    for (const auto& c : m.configs) {
      if (c->name == name) {
        return absl::InvalidArgumentError(StrCat("two configs are named '", name, "' (", path,
                                                 "): configs are named by file stem"));
      }
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Config> c, ResolveConfig(*m.source, name, text, path));
    if (const std::string w = NaiveOrderWarning(*m.source, c->spec, c->options); !w.empty()) {
      spdlog::warn("config {}: {}", path, w);
    }
    // Validate against the dataset once, and learn the epoch's size for Info.
    PipelineOptions po = c->options;
    po.threads = 1;
    absl::StatusOr<std::unique_ptr<Pipeline>> p = Pipeline::Create(*m.source, c->spec, po, Cursor{});
    if (!p.ok()) return Annotate(p.status(), path);
    c->samples_per_epoch = (*p)->num_samples();
    c->steps_per_epoch = (*p)->steps_per_epoch();
    m.configs.push_back(std::move(c));
  }
  ASSIGN_OR_RETURN(m.metrics, ServerMetrics::Create(o.metrics_listen, o.version));
  if (o.limits.server_memory_bytes != 0) {
    m.memory_budget = o.limits.server_memory_bytes;
    m.memory_budget_source = "--server-memory-bytes";
  } else {
    const SystemMemory sys = ProbeSystemMemory();
    const uint64_t quarters = sys.bytes / 4 * 3;
    m.memory_budget = quarters > o.frame_cache_bytes ? quarters - o.frame_cache_bytes : 0;
    m.memory_budget_source = StrCat("3/4 of ", sys.bytes, " bytes from ", sys.source,
                                    o.frame_cache_bytes ? " less --frame-cache-bytes" : "",
                                    "; set --server-memory-bytes");
    if (m.memory_budget == 0) {
      return absl::InvalidArgumentError(StrCat(
          "no memory left for streams: ", m.memory_budget_source,
          sys.bytes == 0 ? " (the machine's memory could not be read)" : ""));
    }
  }
  m.metrics->memory_budget_bytes.Set(static_cast<double>(m.memory_budget));
  spdlog::info("memory budget for all streams: {} bytes ({})", m.memory_budget,
               m.memory_budget_source);
  m.metrics->ExposeStorage([source = m.source.get()] { return source->storage_stats(); });
  if (o.cpu_slots != 0) {
    // Default: one more than the CPUs, so that a worker stalled on a page fault or a local read
    // leaves no core idle (measured: bench/RESULTS.md "8 consumers at 16 threads per stream").
    std::string why = "--cpu-slots";
    int slots = o.cpu_slots;
    if (slots < 0) {
      std::string cpus_from;
      slots = AvailableCpus(&cpus_from) + 1;
      why = StrCat("one more than the CPUs, from ", cpus_from);
    }
    m.cpu_slots = std::make_shared<CpuSlots>(slots);
    m.metrics->cpu_slots.Set(slots);
    spdlog::info("decode workers: {} per stream, at most {} computing at once over all streams ({})",
                 o.threads, slots, why);
  }
  FrameCacheConfig fcc;
  fcc.bytes = o.frame_cache_bytes;
  fcc.policy = o.frame_cache_policy;
  fcc.dir = o.frame_cache_dir;
  fcc.shared_key = o.frame_cache_shared_key;
  fcc.dir_bytes = o.frame_cache_dir_bytes;
  fcc.compression = o.frame_cache_compression;
  ASSIGN_OR_RETURN(m.frame_cache, MakeFrameCache(fcc));
  if (m.frame_cache) m.metrics->ExposeFrameCache([cache = m.frame_cache] { return cache->stats(); });
  if (m.frame_cache && o.frame_cache_prefault && !m.configs.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
    const uint64_t made = PrefaultFrameCache(*m.source, m.configs.front()->spec, *m.frame_cache, threads);
    spdlog::info("frame cache: {} bytes pre-faulted for config '{}' in {:.2f} s", made, m.configs.front()->name,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls) {
    grpc::SslServerCredentialsOptions ssl(o.tls_client_ca_file.empty()
                                              ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    ASSIGN_OR_RETURN(pair.private_key, ReadLocalFile(o.tls_key_file, "TLS key"));
    ASSIGN_OR_RETURN(pair.cert_chain, ReadLocalFile(o.tls_cert_file, "TLS certificate"));
    ssl.pem_key_cert_pairs.push_back(pair);
    if (!o.tls_client_ca_file.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadLocalFile(o.tls_client_ca_file, "client CA"));
    }
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Handler threads are bounded: each open stream and each stripe stream holds one (the sync API),
  // max_streams of each (Impl::stripe_slots), plus a few for Info, health and streams being
  // refused. Past that gRPC answers RESOURCE_EXHAUSTED itself.
  grpc::ResourceQuota quota("conveyor-server");
  quota.SetMaxThreads(2 * o.max_streams + 16);
  builder.SetResourceQuota(quota);
  int port = 0;
  builder.AddListeningPort(o.listen, creds, &port);
  builder.RegisterService(&m);
  // Requests are small: a few times the largest config we accept, so that an oversized config
  // still gets our own clear error, while nobody (authenticated or not) can make the server
  // buffer more than this per call.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::clamp<uint64_t>(4 * o.max_config_bytes, 1 << 20, 64 << 20)));
  builder.SetMaxSendMessageSize(static_cast<int>(kMaxMessageCap + (1 << 20)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // A server owns its address: gRPC turns SO_REUSEPORT on by default, so a second server on a
  // taken port would start and the kernel would split new connections between the two (a job's
  // ranks training on two datasets without an error). Off, the second one fails to bind.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A unix socket is created by the bind inside BuildAndStart with the umask's mode: a private
  // umask for that moment, so that no one else can connect before RestrictUnixSocket sets its
  // final mode (start-up: no stream thread creates files yet).
  const mode_t umask_before = unix_listener ? umask(0077) : 0;
  m.server = builder.BuildAndStart();
  if (unix_listener) umask(umask_before);
  if (!m.server || port == 0) {
    const size_t colon = o.listen.rfind(':');
    const int asked = colon == std::string::npos ? 0 : std::atoi(o.listen.c_str() + colon + 1);
    const std::string holder = asked > 0 ? server_internal::ListenHolder(asked) : std::string();
    return absl::UnavailableError(StrCat(
        "cannot listen on ", o.listen, ": ",
        holder.empty() ? "the address is malformed or in use"
                       : StrCat("the address is in use by ", holder),
        " (a server owns its address; to replace one, drain it first or start the new one on "
        "another port and update the job's server list: docs/serving.md \"Restarting a server\")"));
  }
  // A unix socket has no port (gRPC reports 1 for it): its address is the path as given.
  m.address = o.listen.rfind("unix:", 0) == 0 ? o.listen
                                              : o.listen.substr(0, o.listen.rfind(':') + 1) + std::to_string(port);
  m.listen_host = o.listen.substr(0, o.listen.rfind(':'));
  m.listen_port = static_cast<uint16_t>(port);
  if (unix_listener) {
    std::optional<gid_t> group;
    if (!o.allow_gids.empty()) group = o.allow_gids.front();
    const mode_t mode = o.loopback_open ? 0666 : group ? 0660 : 0600;
    if (absl::Status s = server_internal::RestrictUnixSocket(o.listen.substr(5), mode, group); !s.ok()) {
      m.server->Shutdown();
      return s;
    }
  }
  if (auto* health = m.server->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus(kServiceName, true);
  }
  // Released batch buffers kept for reuse are memory no stream accounts for: bound them by one
  // stream's budget.
  HostBuffer::SetPoolLimit(static_cast<size_t>(std::min(o.limits.stream_memory_bytes, uint64_t{2} << 30)));
  m.o = std::move(o);
  m.reaper = std::make_unique<WorkerPool>("conveyor-reaper", 1, [&m](int) { m.Reap(); });
  if (m.frame_cache && m.o.frame_cache_warm_threads > 0) {
    m.warmer = std::make_unique<WorkerPool>("conveyor-cache-warm", 1, [&m](int) { m.WarmCache(); });
  }
  return std::unique_ptr<DataServer>(new DataServer(std::move(impl)));
}

}  // namespace conveyor
