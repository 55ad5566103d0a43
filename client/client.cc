#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/block_pool.h"
#include "base/status_macros.h"
#include "base/worker_pool.h"
#include "client/internal/carrier.h"
#include "client/internal/raw_stream.h"
#include "client/internal/wire.h"
#include "device/gpu.h"
#include "device/upload.h"
#include "conveyor/v1/service.grpc.pb.h"

namespace conveyor::client {
namespace {

namespace pb = ::conveyor::v1;
using wire::FromProto;
using wire::Message;
using wire::ParseMessage;
using Clock = std::chrono::steady_clock;

absl::Status FromGrpc(const grpc::Status& s, const std::string& server) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("server ", server, ": ", s.error_message()));
}

// Errors another server would repeat end the stream; everything else is a transport or server
// failure worth a reconnect.
bool Retryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::DATA_LOSS:
      return false;
    default:
      return true;
  }
}

std::shared_ptr<grpc::ChannelCredentials> Credentials(const ClientOptions& o) {
  if (!o.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = o.tls_ca_pem;
  ssl.pem_private_key = o.tls_key_pem;
  ssl.pem_cert_chain = o.tls_cert_pem;
  return grpc::SslCredentials(ssl);
}

// `stripe` >= 0: a channel for that stripe stream, on a connection of its own (its own subchannel
// pool, and an argument no other channel has).
std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& o, const std::string& target, int stripe = -1) {
  grpc::ChannelArguments args;
  if (stripe >= 0) {
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("conveyor.stripe", stripe);
  }
  // The server splits batches into messages of at most 64 MiB (its cap); nothing larger is read.
  args.SetMaxReceiveMessageSize(65 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);  // notice a dead server within ~15 s
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  return grpc::CreateCustomChannel(target, Credentials(o), args);
}

// A local server (loopback first in the list) is preferred; otherwise consumers are spread over
// the list (consumer i starts at server i mod n), so that ranks sharing one list share the load.
size_t FirstServer(const ClientOptions& o) {
  const std::string& s = o.servers.front();
  const bool local = s.rfind("127.", 0) == 0 || s.rfind("localhost:", 0) == 0 ||
                     s.rfind("[::1]:", 0) == 0 || s.rfind("unix:", 0) == 0 ||
                     s.rfind("ipv4:127.", 0) == 0;
  return local ? 0 : o.consumer % o.servers.size();
}

void AddMetadata(const ClientOptions& o, grpc::ClientContext* ctx) {
  ctx->AddMetadata("conveyor-protocol", std::to_string(ProtocolVersion()));
  if (!o.auth_token.empty()) ctx->AddMetadata("authorization", "Bearer " + o.auth_token);
  if (!o.job_secret.empty()) ctx->AddMetadata("conveyor-job-secret", o.job_secret);
}

// The batch's copy on the GPU, or null (no device delivery).
DeviceBatch* DeviceOf(const Batch& b) {
  return b.storage ? static_cast<BatchStorage*>(b.storage.get())->device.get() : nullptr;
}

}  // namespace

const TensorView* Batch::Find(std::string_view name) const {
  for (const TensorView& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t Batch::bytes() const {
  size_t n = 0;
  for (const TensorView& t : tensors) n += t.bytes;
  return n;
}

uint32_t ProtocolVersion() { return pb::PROTOCOL_VERSION_CURRENT; }

std::vector<std::string> ParseServers(std::string_view list) {
  std::string text(list);
  if (text.empty()) {
    if (const char* env = std::getenv("CONVEYOR_SERVERS")) text = env;
  }
  return absl::StrSplit(text, ',', absl::SkipEmpty());
}

absl::Status Batch::WaitOnStream(void* cuda_stream) const {
  DeviceBatch* d = DeviceOf(*this);
  return d == nullptr ? absl::OkStatus() : d->WaitOnStream(cuda_stream);
}

absl::Status Batch::RecordUse(void* cuda_stream) const {
  DeviceBatch* d = DeviceOf(*this);
  return d == nullptr ? absl::OkStatus() : d->RecordUse(cuda_stream);
}

absl::Status Batch::WaitDevice() const {
  DeviceBatch* d = DeviceOf(*this);
  return d == nullptr ? absl::OkStatus() : d->Wait();
}

bool Client::device_supported() { return ProbeGpus().devices > 0; }

absl::Status Client::CheckDevice(int device_index) {
  const GpuProbe& probe = ProbeGpus();
  if (probe.devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat("device delivery to CUDA device ", device_index,
                                                      " (cuda:", device_index, "): no usable GPU: ", probe.reason));
  }
  if (device_index < 0 || device_index >= probe.devices) {
    return absl::InvalidArgumentError(absl::StrCat("device delivery to CUDA device ", device_index,
                                                   ": there are ", probe.devices, " (0 to ", probe.devices - 1, ")"));
  }
  return absl::OkStatus();
}

struct Client::Impl {
  ClientOptions o;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::unique_ptr<Uploader> uploader;  // device delivery, else null
  std::shared_ptr<BlockPool> pool;  // batch blocks
  pid_t owner = getpid();  // the process whose threads `receiver` and `reporter` are (see ~Client)

  // Shared by the receiving thread, the reporting thread and the user's calls.
  mutable absl::Mutex mu;
  absl::CondVar cv;
  std::deque<Batch> queue ABSL_GUARDED_BY(mu);  // received, not yet handed out
  uint64_t queue_bytes ABSL_GUARDED_BY(mu) = 0;
  absl::Status final_status ABSL_GUARDED_BY(mu);  // set once the stream is over: OK at its end, else the error
  bool done ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* active ABSL_GUARDED_BY(mu) = nullptr;  // to cancel from the destructor
  // The current stream's payload source, so that Next() can tell the server it is starved.
  std::shared_ptr<PayloadSource> live_source ABSL_GUARDED_BY(mu);
  // Device delivery: the receiving thread waits for a device buffer that only the trainer can
  // give back (it holds them all), so a Next() with nothing queued would wait forever.
  bool device_starved ABSL_GUARDED_BY(mu) = false;
  Cursor delivered ABSL_GUARDED_BY(mu);                       // cursor() for the user
  uint32_t schedule_version ABSL_GUARDED_BY(mu) = 0;          // the first stream start's (0 until then)
  uint64_t global_batch_size ABSL_GUARDED_BY(mu) = 0;         // the first stream start's (0 until then)
  CoverageLedger coverage ABSL_GUARDED_BY(mu);                // what Next() returned
  ClientStats stats ABSL_GUARDED_BY(mu);

  // Steps since the last report, sent by `reporter`.
  struct PendingReport {
    uint64_t steps = 0;
    double wait_seconds = 0, step_seconds = 0;
    std::vector<float> step_waits;
  } pending ABSL_GUARDED_BY(mu);
  double wait_since_batch ABSL_GUARDED_BY(mu) = 0;      // Next() waits since the last batch (timeouts included)
  Clock::time_point last_batch_at ABSL_GUARDED_BY(mu);  // when Next() last returned a batch (or Create)

  // Declared last: destroyed (joined) first, while everything they use is alive.
  std::unique_ptr<WorkerPool> receiver;  // Run()
  std::unique_ptr<WorkerPool> reporter;  // Report()

  // Runs on its own thread: every report_interval_s, sends what Next() recorded to the server of
  // the current stream. Failures lose that report only; UNIMPLEMENTED (an older server) ends them.
  // Once the stream is over and every batch handed out, it sends what is left and exits, so a
  // finished client keeps no thread (a process that forks, as DataLoader workers do, has none in
  // a gRPC call).
  void Report() {
    absl::MutexLock lock(&mu);
    for (bool last = false; !last;) {
      const absl::Time deadline = absl::Now() + absl::Seconds(o.report_interval_s);
      while (!(stop || (done && queue.empty()))) {
        if (cv.WaitWithDeadline(&mu, deadline)) break;  // timed out
      }
      if (stop) return;
      last = done && queue.empty();
      if (pending.steps == 0 || stats.server.empty()) continue;
      PendingReport r = std::move(pending);
      pending = PendingReport{};
      const std::string target = stats.server;
      mu.Unlock();
      const grpc::Status st = SendReport(target, r);
      mu.Lock();
      if (st.ok()) ++stats.reports;
      if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) return;
    }
  }

  grpc::Status SendReport(const std::string& target, const PendingReport& r) const {
    pb::ReportRequest req;
    req.set_protocol_version(ProtocolVersion());
    req.set_job(o.job);
    req.set_consumer(o.consumer);
    req.set_consumers(o.consumers);
    req.set_steps(r.steps);
    req.set_wait_seconds(r.wait_seconds);
    req.set_step_seconds(r.step_seconds);
    const size_t keep = std::min<size_t>(r.step_waits.size(), 1024);
    for (size_t i = r.step_waits.size() - keep; i < r.step_waits.size(); ++i) {
      req.add_step_wait_seconds(r.step_waits[i]);
    }
    size_t index = 0;
    while (index + 1 < o.servers.size() && o.servers[index] != target) ++index;
    grpc::ClientContext ctx;
    AddMetadata(o, &ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    pb::ReportResponse resp;
    return pb::Conveyor::NewStub(channels[index])->Report(&ctx, req, &resp);
  }

  void Finish(absl::Status s) {
    absl::MutexLock lock(&mu);
    if (!done) {
      done = true;
      final_status = std::move(s);
    }
    cv.SignalAll();
  }

  // Where the receiving thread is in the global sequence, across streams and servers.
  struct Progress {
    Cursor expected;  // the next batch to receive
    uint64_t received = 0;
    std::optional<pb::StreamStart> first;  // the first stream's start: every later one must match it
    Clock::time_point last_progress = Clock::now();
    std::map<std::string, std::string> last_error;  // per server, for the final message
    int failures_in_row = 0;
    bool first_stream = true;
  };
  // How one stream ended.
  struct StreamEnd {
    bool stopped = false;   // the client is being destroyed or cancelled: nothing more to do
    absl::Status local;     // an error found by the client: final
    grpc::Status status;    // the server's status
    bool got_batch = false;
    grpc::Status retry;  // not OK: a stripe stream failed; the stream ends with this, and reconnects
  };
  // One stream's carriers, and the batch being received.
  struct Reassembly {
    CarrierStream carrier;                 // what the carriers are given
    std::vector<const Carrier*> offered;   // the carriers the request offers
    // Made from the stream start: the granted carrier, if any, then the messages. Empty before.
    std::vector<std::shared_ptr<PayloadSource>> sources;
    uint64_t batches = 0;             // completed on this stream
    PayloadSource* source = nullptr;  // the batch being received: its source, while it lasts
    pb::BatchHeader header;
    InboundPayload payload;
    void EndBatch() {
      source = nullptr;
      payload = InboundPayload{};
    }
  };

  // Runs in the background: one stream at a time, reconnecting on transport failures.
  void Run() {
    Progress p;
    p.expected = o.start;
    size_t server = FirstServer(o);
    for (;;) {
      // Every batch asked for has arrived (the stream failed before its end was confirmed): a
      // request for 0 more would mean "no limit", so end here.
      if (o.max_batches && p.received >= o.max_batches) return Finish(absl::OkStatus());
      const std::string& target = o.servers[server];
      StreamEnd end = Stream(server, &p);
      if (end.stopped) return;
      if (!end.local.ok()) return Finish(std::move(end.local));
      if (end.status.ok()) return Finish(absl::OkStatus());  // the server reached the real end
      if (!Retryable(end.status.error_code())) return Finish(FromGrpc(end.status, target));
      p.last_error[target] = absl::StrCat(
          absl::StatusCodeToString(static_cast<absl::StatusCode>(end.status.error_code())), ": ",
          end.status.error_message());
      const double idle = std::chrono::duration<double>(Clock::now() - p.last_progress).count();
      if (idle > o.reconnect_timeout_s) {
        std::string all;
        for (const auto& [s, e] : p.last_error) absl::StrAppend(&all, all.empty() ? "" : "; ", s, ": ", e);
        return Finish(absl::UnavailableError(absl::StrCat(
            "no server delivered a batch for ", static_cast<int>(idle), " s (", all,
            "); resume from cursor ", p.expected.ToString())));
      }
      if (!end.got_batch) ++p.failures_in_row;
      // Next server; back off once a whole round failed.
      server = (server + 1) % o.servers.size();
      if (p.failures_in_row >= static_cast<int>(o.servers.size())) {
        const int ms = std::min(2000, 50 << std::min(p.failures_in_row - static_cast<int>(o.servers.size()), 5));
        absl::MutexLock lock(&mu);
        const absl::Time deadline = absl::Now() + absl::Milliseconds(ms);
        while (!stop && !cv.WaitWithDeadline(&mu, deadline)) {
        }
        if (stop) return;
      }
    }
  }

  pb::StreamBatchesRequest Request(const Progress& p) const {
    pb::StreamBatchesRequest req;
    req.set_protocol_version(ProtocolVersion());
    req.set_job(o.job);
    req.set_dataset(o.dataset);
    req.set_consumer(o.consumer);
    req.set_consumers(o.consumers);
    req.mutable_start()->set_epoch(p.expected.epoch);
    req.mutable_start()->set_step(p.expected.step);
    if (p.expected.position) {
      req.mutable_start()->set_position(*p.expected.position);
      req.mutable_start()->set_has_position(true);
    }
    if (!o.config_yaml.empty()) req.set_config_yaml(o.config_yaml);
    if (!o.config_name.empty()) req.set_config_name(o.config_name);
    if (o.max_batches) req.set_max_batches(o.max_batches - p.received);
    req.set_max_message_bytes(o.max_message_bytes);
    // After the first start, every server is asked for the order that stream began with.
    req.set_schedule_version(p.first ? p.first->schedule_version() : o.schedule_version);
    req.set_expect_dataset_fingerprint(o.expect_dataset_fingerprint);
    req.set_expect_order_digest(o.expect_order_digest);
    return req;
  }

  // One StreamBatches call to o.servers[server], until it ends, fails or the client stops.
  StreamEnd Stream(size_t server, Progress* p) {
    const std::string& target = o.servers[server];
    StreamEnd end;
    grpc::ClientContext ctx;
    AddMetadata(o, &ctx);
    {
      absl::MutexLock lock(&mu);
      if (stop) {
        end.stopped = true;
        return end;
      }
      active = &ctx;
      stats.server = target;
      if (!p->first_stream) ++stats.reconnects;
    }
    p->first_stream = false;
    Reassembly r;
    r.carrier = CarrierStream{
        .options = &o,
        .target = target,
        .channel = [this, &target](uint32_t i) { return MakeChannel(o, target, static_cast<int>(i)); },
        .prepare = [this](grpc::ClientContext* c) { AddMetadata(o, c); },
        .allocate = [this, &target, p](uint64_t bytes) { return AllocateBlock(target, p->expected, bytes); },
        .stopped =
            [this] {
              absl::MutexLock lock(&mu);
              return stop;
            },
    };
    pb::StreamBatchesRequest request = Request(*p);
    std::string refused;
    r.offered = OfferCarriers(o, &request, &refused);
    if (!refused.empty()) {
      absl::MutexLock lock(&mu);
      stats.shared_memory_refused = refused;
    }
    // Raw messages: the payload is parsed straight into the batch block (client/internal/raw_stream.h).
    RawStream call(channels[server], &ctx, request.SerializeAsString());
    std::vector<grpc::Slice> slices;
    while (call.ok() && end.local.ok() && end.retry.ok() && !end.stopped) {
      grpc::ByteBuffer bb;
      if (!call.Read(&bb)) break;
      slices.clear();
      Message m;
      if (!bb.Dump(&slices).ok() || !ParseMessage(&slices, &m)) {
        end.local = absl::DataLossError(absl::StrCat("server ", target, " sent a malformed message"));
        break;
      }
      end.local = Receive(target, m, p, &r, &end);
    }
    if (!end.local.ok() || !end.retry.ok()) ctx.TryCancel();
    end.status = call.Finish();
    if (!end.retry.ok()) end.status = end.retry;
    {
      absl::MutexLock lock(&mu);
      live_source.reset();
    }
    // Outside `mu`: a stripe source cancels and joins its stripe streams, whose waits take `mu`.
    r.EndBatch();
    r.sources.clear();
    absl::MutexLock lock(&mu);
    active = nullptr;
    if (stop) end.stopped = true;
    return end;
  }

  // One message of a stream: the start, or part of a batch, which the batch's source places. An
  // error is final; a batch once whole is queued (end->stopped when the client stopped while the
  // queue was full).
  absl::Status Receive(const std::string& target, Message& m, Progress* p, Reassembly* r, StreamEnd* end) {
    if (m.start) return Start(target, *m.start, p, r);
    if (r->sources.empty()) {
      return absl::DataLossError(absl::StrCat("server ", target, " sent data before the stream start"));
    }
    {
      absl::MutexLock lock(&mu);
      ++stats.messages;
    }
    if (m.header) RETURN_IF_ERROR(BeginBatch(target, std::move(*m.header), p->expected, m, r));
    if (r->source == nullptr) {
      return absl::DataLossError(absl::StrCat("server ", target, " sent batch data without a header"));
    }
    const absl::Status taken = r->source->Take(m, &r->payload);
    if (absl::IsUnavailable(taken)) {  // the carrier failed: the stream reconnects
      end->retry = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(taken.message()));
      r->EndBatch();
      return absl::OkStatus();
    }
    if (absl::IsCancelled(taken)) {
      end->stopped = true;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(taken);
    if (!m.last) return absl::OkStatus();
    if (r->payload.filled != r->payload.bytes) {
      return absl::DataLossError(absl::StrCat("server ", target, ": batch ", p->expected.ToString(),
                                              " carried ", r->payload.filled, " payload bytes, its header says ",
                                              r->payload.bytes));
    }
    Batch cur;
    const bool in_shared_memory = r->payload.storage->source != nullptr;
    absl::Status st = Assemble(target, r->header, r->payload.storage, &cur);
    r->EndBatch();
    RETURN_IF_ERROR(st);
    p->expected = cur.next;
    ++p->received;
    ++r->batches;
    end->got_batch = true;
    p->last_progress = Clock::now();
    p->failures_in_row = 0;
    if (!Enqueue(std::move(cur), in_shared_memory)) end->stopped = true;
    // Time the consumer kept its queue full (a checkpoint, an evaluation) is not time without a
    // server: a server that ended the stream meanwhile (its progress timeout) is reconnected to.
    p->last_progress = Clock::now();
    return absl::OkStatus();
  }

  // The stream start: checked, then the carrier the server granted taken (before the first
  // batch: a server waits for the same-host region to be taken) and the stream's sources made.
  absl::Status Start(const std::string& target, const pb::StreamStart& s, Progress* p, Reassembly* r) {
    RETURN_IF_ERROR(CheckStart(target, s, p));
    std::string refused;
    ASSIGN_OR_RETURN(r->sources, AcceptCarriers(r->offered, r->carrier, s, &refused));
    absl::MutexLock lock(&mu);
    live_source = r->sources.front();
    stats.transport = std::string(r->sources.front()->transport());
    if (!refused.empty()) stats.shared_memory_refused = refused;
    return absl::OkStatus();
  }

  // A stream start: the same protocol, and after failover the same dataset and config.
  absl::Status CheckStart(const std::string& target, const pb::StreamStart& s, Progress* p) {
    if (s.protocol_version() != ProtocolVersion()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", target, " speaks Conveyor protocol ", s.protocol_version(),
          ", this client ", ProtocolVersion(), ": use a client and server of the same release"));
    }
    if ((!o.expect_dataset_fingerprint.empty() && s.dataset_fingerprint() != o.expect_dataset_fingerprint) ||
        (!o.expect_order_digest.empty() && s.order_digest() != o.expect_order_digest)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", target, " serves dataset ", s.dataset_name(), " (fingerprint ", s.dataset_fingerprint(),
          ", order ", s.order_digest().substr(0, 12), ") but the checkpoint this job resumes was taken on ",
          "fingerprint ", o.expect_dataset_fingerprint.empty() ? "(any)" : o.expect_dataset_fingerprint,
          ", order ", o.expect_order_digest.empty() ? "(any)" : o.expect_order_digest.substr(0, 12),
          ": its cursor names other samples here (another dataset or path, episodes added or a ",
          "re-import, another config). Point the job at the data it trained on, or continue on purpose ",
          "without the check (Loader.load_state_dict(state, allow_data_change=True); docs/python.md ",
          "\"What a job pins\")"));
    }
    if (p->first && (s.dataset_fingerprint() != p->first->dataset_fingerprint() ||
                     s.config_digest() != p->first->config_digest())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", target, " serves dataset ", s.dataset_name(), " (fingerprint ",
          s.dataset_fingerprint(), ", config ", s.config_digest().substr(0, 12),
          ") but this stream started on dataset ", p->first->dataset_name(), " (fingerprint ",
          p->first->dataset_fingerprint(), ", config ", p->first->config_digest().substr(0, 12),
          "): every listed server must serve the same dataset and config"));
    }
    // The stream's first batch: the cursor asked for, which the server may have normalized (a
    // position with no whole batch left in its epoch starts the next one).
    if (s.has_start()) {
      const Cursor start = FromProto(s.start());
      if (!p->expected.position && !(start.epoch == p->expected.epoch && start.step == p->expected.step)) {
        return absl::DataLossError(absl::StrCat("server ", target, " starts the stream at ", start.ToString(),
                                                " where ", p->expected.ToString(), " was asked for"));
      }
      p->expected = start;
    } else if (p->expected.position) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", target, " (", s.server_version(), ") predates position cursors and would read ",
          p->expected.ToString(), " as batch ", p->expected.epoch, ":", p->expected.step,
          ": upgrade the server, or resume from an EPOCH:STEP cursor at the batch size it was recorded with"));
    }
    if (!p->first) {
      p->first = s;
      absl::MutexLock lock(&mu);
      schedule_version = s.schedule_version();
      global_batch_size = s.global_batch_size();
      stats.dataset_name = s.dataset_name();
      stats.dataset_fingerprint = s.dataset_fingerprint();
      stats.config_digest = s.config_digest();
      stats.order_digest = s.order_digest();
    }
    return absl::OkStatus();
  }

  // A batch header: the batch due next, within the client's cap; the first source that carries it
  // places its payload.
  absl::Status BeginBatch(const std::string& target, pb::BatchHeader header, const Cursor& expected,
                          const Message& m, Reassembly* r) {
    const Cursor c = FromProto(header.cursor());
    if (!(c == expected)) {
      return absl::DataLossError(absl::StrCat("server ", target, " sent batch ", c.ToString(),
                                              " where ", expected.ToString(), " was due"));
    }
    // The server is not trusted with this process's memory: a batch larger than the client's cap
    // is refused before anything is allocated for it.
    if (header.payload_bytes() > o.max_batch_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "server ", target, " announced a batch of ", header.payload_bytes(),
          " bytes; this client accepts at most ", o.max_batch_bytes, " (ClientOptions::max_batch_bytes)"));
    }
    r->header = std::move(header);
    r->payload = InboundPayload{};
    r->payload.index = r->batches;
    r->payload.bytes = r->header.payload_bytes();
    r->source = nullptr;
    for (const std::shared_ptr<PayloadSource>& source : r->sources) {
      if (source->Carries(m)) {
        r->source = source.get();
        break;
      }
    }
    return absl::OkStatus();
  }

  // A block of the pool for batch `batch`'s payload (MessageSource, stripes).
  absl::StatusOr<std::shared_ptr<BatchStorage>> AllocateBlock(const std::string& target, const Cursor& batch,
                                                              uint64_t bytes) {
    auto storage = std::make_shared<BatchStorage>();
    storage->pool = pool;
    storage->block = TakeBlock(*pool, bytes, uploader != nullptr ? uploader->device() : -1);
    if (storage->block.data == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes for batch ",
                                                       batch.ToString(), " from server ", target));
    }
    return storage;
  }

  // Hands a whole batch to Next(); waits while the prefetch bound is reached (gRPC flow control
  // then stops the server). False when the client stopped meanwhile.
  bool Enqueue(Batch b, bool in_shared_memory) {
    const uint64_t bytes = b.bytes();
    absl::MutexLock lock(&mu);
    stats.batches++;
    if (in_shared_memory) stats.shared_memory_batches++;
    stats.bytes += bytes;
    queue_bytes += bytes;
    queue.push_back(std::move(b));
    cv.SignalAll();
    while (!stop && !(queue.size() < o.prefetch_batches && queue_bytes < o.prefetch_bytes)) cv.Wait(&mu);
    return !stop;
  }

  // Views into the batch block, checked against it.
  absl::Status Assemble(const std::string& target, const pb::BatchHeader& h,
                        const std::shared_ptr<BatchStorage>& storage, Batch* b) {
    b->cursor = FromProto(h.cursor());
    b->next = FromProto(h.next());
    b->consumer = h.consumer();
    b->consumers = h.consumers();
    b->server = target;
    b->ids.reserve(h.ids_size());
    for (const pb::SampleId& id : h.ids()) b->ids.push_back({id.index(), id.episode(), id.step(), id.dataset()});
    if (h.has_packing()) {
      b->packed_sequences = h.packing().sequences();
      b->fill_ratio = h.packing().fill_ratio();
    }
    b->tensors.reserve(h.tensors_size());
    for (const pb::TensorHeader& t : h.tensors()) {
      if (std::optional<std::string> bad = wire::CheckTensor(t, h.payload_bytes())) {
        return absl::DataLossError(absl::StrCat("server ", target, ": tensor ", t.name(), " ", *bad));
      }
      TensorView out;
      out.name = t.name();
      out.dtype = FromProto(t.dtype());
      out.shape.assign(t.shape().begin(), t.shape().end());
      out.role = FromProto(t.role());
      out.bytes = t.bytes();
      out.data = storage->data() + t.offset();
      b->tensors.push_back(std::move(out));
    }
    if (uploader) RETURN_IF_ERROR(Upload(target, h, storage, b));
    b->storage = storage;
    return absl::OkStatus();
  }

  // Device delivery: starts the batch's one copy to the GPU (device/upload.h) and points the
  // tensors' device_data into its device buffer. Runs on the receiving thread, as the batch
  // arrives, so the copy overlaps the trainer's work on the batches before it.
  absl::Status Upload(const std::string& target, const pb::BatchHeader& h,
                      const std::shared_ptr<BatchStorage>& storage, Batch* b) {
    HostBatch host;
    host.label = absl::StrCat("batch ", b->cursor.ToString(), " from server ", target);
    host.data = storage->data();
    host.size = h.payload_bytes();
    host.pinned = storage->source == nullptr && storage->block.kind == kPinnedBlock;
    host.tensors.reserve(b->tensors.size());
    for (const TensorView& t : b->tensors) {
      host.tensors.push_back(HostTensor{TensorDesc(t), static_cast<size_t>(t.data - storage->data()),
                                        t.bytes});
    }
    // Only this thread takes buffers, so none free now means Upload waits for the trainer to
    // drop a batch; Next() is told, so it does not wait for this batch in vain.
    const bool starved = uploader->free_buffers() == 0;
    if (starved) {
      absl::MutexLock lock(&mu);
      device_starved = true;
      cv.SignalAll();
    }
    absl::StatusOr<std::unique_ptr<DeviceBatch>> copy = uploader->Upload(std::move(host));
    if (starved) {
      absl::MutexLock lock(&mu);
      device_starved = false;
    }
    if (!copy.ok()) return copy.status();
    DeviceBatch& d = **copy;
    for (size_t i = 0; i < b->tensors.size(); ++i) b->tensors[i].device_data = d.tensors()[i].data;
    b->device = d.device();
    b->ready_event = d.ready_event();
    storage->device = *std::move(copy);
    return absl::OkStatus();
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("no server address given (--servers or CONVEYOR_SERVERS)");
  }
  if (options.consumers == 0 || options.consumer >= options.consumers) {
    return absl::InvalidArgumentError(absl::StrCat("consumer ", options.consumer, " of ",
                                                   options.consumers, ": need 0 <= consumer < consumers"));
  }
  if (!options.config_yaml.empty() && !options.config_name.empty()) {
    return absl::InvalidArgumentError("give a config or a config name, not both");
  }
  options.prefetch_batches = std::max<size_t>(1, options.prefetch_batches);
  // The launcher's pin (docs/launch.md "Pinning the data"): every rank it starts refuses a server
  // of other data, even on a fresh start without a checkpoint.
  for (auto [var, field] : {std::pair{"CONVEYOR_DATASET_FINGERPRINT", &options.expect_dataset_fingerprint},
                            std::pair{"CONVEYOR_ORDER_DIGEST", &options.expect_order_digest}}) {
    const char* v = std::getenv(var);
    if (options.pin_from_environment && field->empty() && v != nullptr) *field = v;
  }
  if (const char* v = std::getenv("CONVEYOR_JOB_SECRET"); options.job_secret.empty() && v != nullptr) {
    options.job_secret = v;
  }
  if (options.job_secret.size() > 256 ||
      std::any_of(options.job_secret.begin(), options.job_secret.end(), [](char c) { return c < 0x21 || c > 0x7e; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job secret (ClientOptions::job_secret or $CONVEYOR_JOB_SECRET) has ", options.job_secret.size(),
        " characters: give 1 to 256 printable ASCII characters without spaces (openssl rand -hex 16)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  impl->pool = std::make_shared<BlockPool>(impl->o.prefetch_batches + 2, SIZE_MAX, 0, FreeBlock);
  if (impl->o.device) {
    RETURN_IF_ERROR(CheckDevice(impl->o.device_index));
    if (impl->o.device_buffers == 0) impl->o.device_buffers = impl->o.prefetch_batches + 2;
    impl->o.device_buffers = std::min<size_t>(impl->o.device_buffers, 1024);
    absl::StatusOr<std::unique_ptr<Uploader>> uploader = Uploader::Create(
        {.device = impl->o.device_index, .buffers = static_cast<int>(impl->o.device_buffers), .require_gpu = true});
    if (!uploader.ok()) {
      return Annotate(uploader.status(), absl::StrCat("device delivery to CUDA device ", impl->o.device_index));
    }
    impl->uploader = *std::move(uploader);
  }
  for (const std::string& s : impl->o.servers) impl->channels.push_back(MakeChannel(impl->o, s));
  Impl* raw = impl.get();
  {
    absl::MutexLock lock(&impl->mu);
    impl->delivered = impl->o.start;
    impl->last_batch_at = Clock::now();
  }
  impl->receiver = std::make_unique<WorkerPool>("conveyor-recv", 1, [raw](int) { raw->Run(); });
  if (impl->o.report_interval_s > 0) {
    impl->reporter = std::make_unique<WorkerPool>("conveyor-report", 1, [raw](int) { raw->Report(); });
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::~Client() {
  if (getpid() != impl_->owner) {
    // A forked child (a DataLoader worker, multiprocessing) freeing the copy of a client it
    // inherited: the receiving thread and the gRPC call exist only in the parent, so joining
    // would throw (ESRCH) and abort the child. The child's copy is left as it is.
    (void)impl_.release();
    return;
  }
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stop = true;
    if (impl_->active) impl_->active->TryCancel();
    impl_->cv.SignalAll();
  }
  // A receiving thread waiting for a device buffer the trainer still holds returns at once.
  if (impl_->uploader) impl_->uploader->Cancel();
  impl_->receiver.reset();  // joins
  impl_->reporter.reset();
}

absl::StatusOr<std::optional<Batch>> Client::Next() { return Next(-1); }

absl::StatusOr<std::optional<Batch>> Client::Next(double timeout_s) {
  const auto t0 = Clock::now();
  absl::MutexLock lock(&impl_->mu);
  const absl::Time deadline = timeout_s < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Seconds(timeout_s);
  bool timed_out = false;
  // Waiting with nothing received: a trainer that keeps the batches it got may hold the whole
  // shared-memory ring, so the server is told to send the next ones in messages.
  const bool starved = impl_->queue.empty() && !impl_->done && impl_->live_source != nullptr;
  if (starved) impl_->live_source->SetStarved(true);
  // The receiving thread waits for a device buffer and every one is still held: only the trainer
  // can end that. device_starved alone is not enough: a batch dropped just before this call has
  // freed a buffer the receiving thread has not taken yet.
  auto holds_all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_->mu) {
    return impl_->device_starved && impl_->uploader != nullptr && impl_->uploader->free_buffers() == 0;
  };
  while (impl_->queue.empty() && !impl_->done && !timed_out && !holds_all()) {
    timed_out = impl_->cv.WaitWithDeadline(&impl_->mu, deadline);
  }
  if (starved && impl_->live_source) impl_->live_source->SetStarved(false);
  if (impl_->queue.empty() && !impl_->done && holds_all()) {
    // Not final: once the trainer drops a batch, the receiving thread goes on.
    return absl::ResourceExhaustedError(absl::StrCat(
        "the trainer holds all ", impl_->o.device_buffers, " device buffers of CUDA device ", impl_->o.device_index,
        " and asks for another batch: drop (or RecordUse and drop) a batch first, or raise "
        "ClientOptions::device_buffers"));
  }
  if (impl_->queue.empty() && !impl_->done) {
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    impl_->stats.wait_seconds += waited;
    impl_->wait_since_batch += waited;
    return absl::DeadlineExceededError(absl::StrCat("no batch within ", timeout_s, " s"));
  }
  const auto now = Clock::now();
  const double waited = std::chrono::duration<double>(now - t0).count();
  impl_->stats.wait_seconds += waited;
  impl_->wait_since_batch += waited;
  if (impl_->queue.empty()) {
    if (impl_->final_status.ok()) return std::optional<Batch>();  // the end
    return impl_->final_status;
  }
  Batch b = std::move(impl_->queue.front());
  impl_->queue.pop_front();
  impl_->queue_bytes -= b.bytes();
  impl_->delivered = b.next;
  impl_->coverage.Add(b.cursor, b.consumer, b.consumers, impl_->global_batch_size, b.ids);
  // One step for the reports: from the previous batch to this one, and the wait inside it.
  Impl::PendingReport& r = impl_->pending;
  ++r.steps;
  r.wait_seconds += impl_->wait_since_batch;
  r.step_seconds += std::chrono::duration<double>(now - impl_->last_batch_at).count();
  if (r.step_waits.size() < 4096) r.step_waits.push_back(static_cast<float>(impl_->wait_since_batch));
  impl_->wait_since_batch = 0;
  impl_->last_batch_at = now;
  impl_->cv.SignalAll();
  return std::optional<Batch>(std::move(b));
}

void Client::Cancel() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stop = true;
    if (impl_->active) impl_->active->TryCancel();
    if (!impl_->done) {
      impl_->done = true;
      impl_->final_status = absl::CancelledError("the client was cancelled");
    }
    impl_->queue.clear();
    impl_->queue_bytes = 0;
    impl_->cv.SignalAll();
  }
  if (impl_->uploader) impl_->uploader->Cancel();
}

Cursor Client::cursor() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->delivered;
}

std::vector<CoverageSlice> Client::coverage() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->coverage.Slices();
}

uint64_t Client::global_batch_size() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->global_batch_size;
}

uint32_t Client::schedule_version() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->schedule_version;
}

ClientStats Client::stats() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->stats;
}

absl::StatusOr<pb::InfoResponse> GetInfo(const ClientOptions& o) {
  if (o.servers.empty()) return absl::InvalidArgumentError("no server address given");
  absl::Status last;
  for (const std::string& s : o.servers) {
    grpc::ClientContext ctx;
    AddMetadata(o, &ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::InfoResponse resp;
    const grpc::Status st = pb::Conveyor::NewStub(MakeChannel(o, s))->Info(&ctx, pb::InfoRequest{}, &resp);
    if (st.ok()) return resp;
    last = FromGrpc(st, s);
    if (!Retryable(st.error_code())) return last;
  }
  return last;
}

}  // namespace conveyor::client
