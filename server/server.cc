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
#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <new>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/cancel.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/system_memory.h"
#include "pipeline/cache_warm.h"
#include "pipeline/naive_warning.h"
#include "server/internal/listen_holder.h"
#include "server/internal/served_stream.h"
#include "storage/storage.h"

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;
using Clock = std::chrono::steady_clock;
constexpr char kServiceName[] = "conveyor.v1.Conveyor";
// Job names with series, a ledger and a secret of their own (server/internal/job_identity.h).
constexpr size_t kMaxJobSlots = 256;

// The client's address without its port: "ipv4:10.0.0.5:51234" -> "ipv4:10.0.0.5".
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  if (colon == std::string::npos || colon == first) return peer;
  return peer.substr(0, colon);
}


}  // namespace

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

grpc::Status DataServer::Impl::Reject(grpc::StatusCode code, std::string message) {
  metrics->RequestRejected(CodeName(code));
  return grpc::Status(code, std::move(message));
}

grpc::Status DataServer::Impl::Authorize(grpc::ServerContext* ctx) {
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

grpc::Status DataServer::Impl::AuthorizeLocalUser(grpc::ServerContext* ctx) {
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

std::string DataServer::Impl::PeerKey(grpc::ServerContext* ctx) {
  if (const std::optional<uid_t> uid = server_internal::LocalPeerUid(ctx->peer(), listen_host, listen_port)) {
    return StrCat("local user ", server_internal::DescribeUid(*uid));
  }
  return PeerHost(ctx->peer());
}

absl::StatusOr<std::string> DataServer::Impl::EnterJob(grpc::ServerContext* ctx, const std::string& job, bool stream) {
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

void DataServer::Impl::WarmCache() {
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

void DataServer::Impl::Reap() {
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

DataServer::Impl::StreamSlot::~StreamSlot() {
  {
    absl::MutexLock lock(&server_->mu);
    server_->streams.erase(entry_);
    server_->UpdateHealth();
  }
  server_->metrics->streams_active.Decrement();
}

DataServer::Impl::MemoryReservation::~MemoryReservation() {
  absl::MutexLock lock(&server_->mu);
  server_->memory_reserved -= bytes_;
  server_->memory_holders -= 1;
  server_->metrics->memory_reserved_bytes.Set(static_cast<double>(server_->memory_reserved));
}

grpc::Status DataServer::Impl::Admit(ActiveStream* entry, std::optional<StreamSlot>* slot) {
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

void DataServer::Impl::UpdateHealth() {
  if (server == nullptr || shutting_down) return;
  const bool serving = static_cast<int>(streams.size()) < o.max_streams;
  if (health_serving == serving) return;
  if (auto* health = server->GetHealthCheckService()) {
    health->SetServingStatus(serving);
    health_serving = serving;
  }
}

uint32_t DataServer::Impl::ReserveStripes(uint32_t wanted) {
  absl::MutexLock lock(&mu);
  const int room = o.max_streams - stripe_slots;
  const uint32_t k = room < 2 ? 0 : std::min<uint32_t>(wanted, static_cast<uint32_t>(room));
  stripe_slots += static_cast<int>(k);
  UpdateHealth();
  return k;
}

void DataServer::Impl::ReleaseStripes(uint32_t k) {
  absl::MutexLock lock(&mu);
  stripe_slots -= static_cast<int>(k);
  UpdateHealth();
}

grpc::Status DataServer::Impl::ReserveMemory(uint64_t bytes, std::optional<MemoryReservation>* out) {
  absl::MutexLock lock(&mu);
  if (bytes <= memory_budget && memory_reserved <= memory_budget - bytes) {
    memory_reserved += bytes;
    memory_holders += 1;
    metrics->memory_reserved_bytes.Set(static_cast<double>(memory_reserved));
    out->emplace(this, bytes);
    return grpc::Status::OK;
  }
  return Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                StrCat("this stream would hold about ", bytes, " bytes; the ", memory_holders,
                       " streams running hold ", memory_reserved, " of this server's memory "
                       "budget of ", memory_budget, " bytes (", memory_budget_source,
                       "): retry when a stream ends (the client does, until its reconnect "
                       "timeout), use another server, or lower pipeline.queue_bytes or the "
                       "batch size"));
}

bool DataServer::Impl::MemoryReservation::Grow(uint64_t bytes) {
  absl::MutexLock lock(&server_->mu);
  const uint64_t budget = server_->memory_budget;
  if (bytes > budget || server_->memory_reserved > budget - bytes) return false;
  server_->memory_reserved += bytes;
  bytes_ += bytes;
  server_->metrics->memory_reserved_bytes.Set(static_cast<double>(server_->memory_reserved));
  return true;
}

grpc::Status DataServer::Impl::StreamRaw(grpc::ServerContext* ctx, const pb::StreamBatchesRequest* req,
                                         Writer* writer) {
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
    result = ServedStream(*this, ctx, *req, writer, &entry, job).Serve(&outcome);
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

StopFn DataServer::Impl::StreamOver(grpc::ServerContext* ctx, const ActiveStream* entry) {
  return [this, ctx, entry] {
    absl::MutexLock lock(&mu);
    return shutting_down || ctx->IsCancelled() || (entry != nullptr && entry->stalled);
  };
}

grpc::Status DataServer::Impl::ServeStripe(grpc::ServerContext* ctx, const pb::StreamBatchesRequest& req, Writer* writer) {
  std::shared_ptr<StripeSession> session = carriers.stripes.Find(req.stripe_token());
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

grpc::Status DataServer::Impl::Stalled() const {
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      StrCat("the client took no batch for ", o.stream_progress_timeout_seconds,
                             " s (--stream-progress-timeout): the stream is ended to free its slot"));
}

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

namespace {

// The listener's protection (docs/serving.md "Who may connect"): beyond loopback, a bearer token
// over TLS or verified client certificates; the local-user options only where they choose.
absl::Status CheckProtection(const ServerOptions& o, bool tls) {
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
  return absl::OkStatus();
}

// Every option's range and the listener's protection, before anything is opened.
absl::Status CheckOptions(const ServerOptions& o) {
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
  RETURN_IF_ERROR(CheckProtection(o, tls));
  if (!(o.job_idle_seconds >= 0) || o.job_idle_seconds > 1e9) {
    return absl::InvalidArgumentError(StrCat("--job-idle-seconds must be at least 0, not ", o.job_idle_seconds));
  }
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
  return absl::OkStatus();
}

}  // namespace

absl::Status DataServer::Impl::LoadData() {
  if (!o.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(std::string t, ReadTokenFile(o.auth_token_file));
    if (t.size() < 16) {
      return absl::InvalidArgumentError(StrCat("token file ", o.auth_token_file, " holds ", t.size(),
                                               " characters; use at least 16 (openssl rand -hex 32)"));
    }
    token = t;
  }
  ASSIGN_OR_RETURN(source, Source::Open(o.dataset));
  for (const std::string& path : o.config_paths) {
    ASSIGN_OR_RETURN(std::string text, ReadLocalFile(path, "config"));
    const std::string name = std::filesystem::path(path).stem().string();
    for (const auto& c : configs) {
      if (c->name == name) {
        return absl::InvalidArgumentError(StrCat("two configs are named '", name, "' (", path,
                                                 "): configs are named by file stem"));
      }
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Config> c, ResolveConfig(*source, name, text, path));
    if (const std::string w = NaiveOrderWarning(*source, c->spec, c->options); !w.empty()) {
      spdlog::warn("config {}: {}", path, w);
    }
    // Validate against the dataset once, and learn the epoch's size for Info.
    PipelineOptions po = c->options;
    po.threads = 1;
    absl::StatusOr<std::unique_ptr<Pipeline>> p = Pipeline::Create(*source, c->spec, po, Cursor{});
    if (!p.ok()) return Annotate(p.status(), path);
    c->samples_per_epoch = (*p)->num_samples();
    c->steps_per_epoch = (*p)->steps_per_epoch();
    configs.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status DataServer::Impl::BudgetMemory() {
  ASSIGN_OR_RETURN(metrics, ServerMetrics::Create(o.metrics_listen, o.version));
  if (o.limits.server_memory_bytes != 0) {
    memory_budget = o.limits.server_memory_bytes;
    memory_budget_source = "--server-memory-bytes";
  } else {
    const SystemMemory sys = ProbeSystemMemory();
    const uint64_t quarters = sys.bytes / 4 * 3;
    memory_budget = quarters > o.frame_cache_bytes ? quarters - o.frame_cache_bytes : 0;
    memory_budget_source = StrCat("3/4 of ", sys.bytes, " bytes from ", sys.source,
                                  o.frame_cache_bytes ? " less --frame-cache-bytes" : "",
                                  "; set --server-memory-bytes");
    if (memory_budget == 0) {
      return absl::InvalidArgumentError(StrCat(
          "no memory left for streams: ", memory_budget_source,
          sys.bytes == 0 ? " (the machine's memory could not be read)" : ""));
    }
  }
  metrics->memory_budget_bytes.Set(static_cast<double>(memory_budget));
  spdlog::info("memory budget for all streams: {} bytes ({})", memory_budget, memory_budget_source);
  metrics->ExposeStorage([source = source.get()] { return source->storage_stats(); });
  return absl::OkStatus();
}

absl::Status DataServer::Impl::SetUpDecoding() {
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
    cpu_slots = std::make_shared<CpuSlots>(slots);
    metrics->cpu_slots.Set(slots);
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
  ASSIGN_OR_RETURN(frame_cache, MakeFrameCache(fcc));
  if (frame_cache) metrics->ExposeFrameCache([cache = frame_cache] { return cache->stats(); });
  if (frame_cache && o.frame_cache_prefault && !configs.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
    const uint64_t made = PrefaultFrameCache(*source, configs.front()->spec, *frame_cache, threads);
    spdlog::info("frame cache: {} bytes pre-faulted for config '{}' in {:.2f} s", made, configs.front()->name,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return absl::OkStatus();
}

absl::Status DataServer::Impl::Listen() {
  const bool tls = !o.tls_cert_file.empty();
  const bool unix_listener = o.listen.rfind("unix:", 0) == 0;
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
  builder.RegisterService(this);
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
  server = builder.BuildAndStart();
  if (unix_listener) umask(umask_before);
  if (!server || port == 0) {
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
  address = o.listen.rfind("unix:", 0) == 0 ? o.listen
                                              : o.listen.substr(0, o.listen.rfind(':') + 1) + std::to_string(port);
  listen_host = o.listen.substr(0, o.listen.rfind(':'));
  listen_port = static_cast<uint16_t>(port);
  carriers.listen_host = listen_host;
  carriers.listen_port = listen_port;
  if (unix_listener) {
    std::optional<gid_t> group;
    if (!o.allow_gids.empty()) group = o.allow_gids.front();
    const mode_t mode = o.loopback_open ? 0666 : group ? 0660 : 0600;
    if (absl::Status s = server_internal::RestrictUnixSocket(o.listen.substr(5), mode, group); !s.ok()) {
      server->Shutdown();
      return s;
    }
  }
  if (auto* health = server->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus(kServiceName, true);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Start(ServerOptions o) {
  RETURN_IF_ERROR(CheckOptions(o));
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  const bool unix_listener = o.listen.rfind("unix:", 0) == 0;
  const bool by_credentials = !o.auth_token_file.empty() || !o.tls_client_ca_file.empty();
  m.check_local_user = IsLoopbackAddress(o.listen) && !unix_listener && !o.loopback_open && !by_credentials;
  m.local_users.uids.assign(o.allow_uids.begin(), o.allow_uids.end());
  m.local_users.gids.assign(o.allow_gids.begin(), o.allow_gids.end());
  m.jobs = std::make_unique<server_internal::JobRegistry>(
      kMaxJobSlots, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.job_idle_seconds)));
  m.o = std::move(o);
  m.carriers.shared_memory = m.o.shared_memory;
  m.carriers.reserve_stripes = [&m](uint32_t wanted) { return m.ReserveStripes(wanted); };
  m.carriers.release_stripes = [&m](uint32_t calls) { m.ReleaseStripes(calls); };
  RETURN_IF_ERROR(m.LoadData());
  RETURN_IF_ERROR(m.BudgetMemory());
  RETURN_IF_ERROR(m.SetUpDecoding());
  RETURN_IF_ERROR(m.Listen());
  // Released batch buffers kept for reuse are memory no stream accounts for: bound them by one
  // stream's budget.
  HostBuffer::SetPoolLimit(static_cast<size_t>(std::min(m.o.limits.stream_memory_bytes, uint64_t{2} << 30)));
  m.reaper = std::make_unique<WorkerPool>("conveyor-reaper", 1, [&m](int) { m.Reap(); });
  if (m.frame_cache && m.o.frame_cache_warm_threads > 0) {
    m.warmer = std::make_unique<WorkerPool>("conveyor-cache-warm", 1, [&m](int) { m.WarmCache(); });
  }
  return std::unique_ptr<DataServer>(new DataServer(std::move(impl)));
}

}  // namespace conveyor
