#include "server/internal/served_stream.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/format.h"

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

ServedStream::ServedStream(DataServer::Impl& server, grpc::ServerContext* ctx, const pb::StreamBatchesRequest& req,
                           DataServer::Impl::Writer* writer, ActiveStream* entry, std::string job)
    : server_(server), ctx_(ctx), req_(req), writer_(writer), entry_(entry), job_(std::move(job)) {}

ServedStream::~ServedStream() {
  // Before the pipeline goes (however the stream ended, an exception too): the reaper never
  // cancels a pipeline that is gone.
  if (!pipeline_) return;
  absl::MutexLock lock(&server_.mu);
  if (auto it = server_.streams.find(entry_); it != server_.streams.end()) it->second.pipeline = nullptr;
}

grpc::Status ServedStream::Serve(std::string* outcome) {
  outcome_ = outcome;
  *outcome_ = "rejected";
  if (grpc::Status s = ResolveRequest(); !s.ok()) return s;
  max_message_ = req_.max_message_bytes() == 0
                     ? server_.o.max_message_bytes
                     : std::clamp<uint64_t>(req_.max_message_bytes(), kMinMessageBytes, kMaxMessageCap);
  po_ = config_->options;
  po_.frame_cache = server_.frame_cache;
  po_.cpu_slots = server_.cpu_slots;
  po_.consumer = req_.consumer();
  po_.consumers = req_.consumers();
  po_.threads = server_.o.threads;
  po_.queue_bytes = std::min(po_.queue_bytes, server_.o.queue_bytes);
  po_.pinned = false;
  spec_ = config_->spec;
  if (grpc::Status s = CheckCeilings(); !s.ok()) return s;
  if (grpc::Status s = server_.ReserveMemory(stream_bytes_, &reservation_); !s.ok()) return s;
  *outcome_ = "ok";
  std::unique_ptr<PayloadSink> sink;
  if (grpc::Status s = Open(&sink); !s.ok()) return s;
  return SendAll(*sink);
}

grpc::Status ServedStream::ResolveRequest() {
  const Manifest& m = server_.source->manifest();
  if (!req_.dataset().empty() && req_.dataset() != m.name && req_.dataset() != m.fingerprint) {
    return server_.Reject(grpc::StatusCode::NOT_FOUND,
                          StrCat("unknown dataset '", req_.dataset().substr(0, 256), "': this server serves '",
                                 m.name, "' (fingerprint ", m.fingerprint, ")"));
  }
  if (req_.consumers() == 0) {
    return server_.Reject(grpc::StatusCode::INVALID_ARGUMENT, "consumers must be at least 1");
  }
  if (req_.consumer() >= req_.consumers()) {
    return server_.Reject(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("consumer index ", req_.consumer(), " is out of range for ", req_.consumers(),
                                 " consumers (0 <= consumer < consumers)"));
  }
  if (grpc::Status s = PickConfig(); !s.ok()) return s;
  if (req_.schedule_version() > kScheduleVersionCurrent) {
    return server_.Reject(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("schedule_version ", req_.schedule_version(), " is unknown to this server (",
                                 server_.o.version, "): it knows 1 to ", kScheduleVersionCurrent));
  }
  if (req_.schedule_version() != 0 && req_.schedule_version() != config_->options.order.version) {
    // The config's own source: a file's relative paths (a tokenizer model) resolve from it.
    absl::StatusOr<std::shared_ptr<Config>> c = ResolveConfig(
        *server_.source, config_->name, config_->text, config_->spec.config_source, req_.schedule_version());
    if (!c.ok()) return server_.Reject(ToGrpc(c.status()).error_code(), std::string(c.status().message()));
    config_ = *c;
  }
  return CheckPin();
}

// One the server was started with, or the request's own (a oneof: never both).
grpc::Status ServedStream::PickConfig() {
  if (req_.has_config_yaml()) {
    absl::StatusOr<std::shared_ptr<Config>> c =
        ResolveConfig(*server_.source, "inline", req_.config_yaml(), "request config");
    if (!c.ok()) return server_.Reject(ToGrpc(c.status()).error_code(), std::string(c.status().message()));
    config_ = *c;
    return grpc::Status::OK;
  }
  const std::string& name = req_.config_name();
  for (const auto& c : server_.configs) {
    if (name.empty() || c->name == name) {
      config_ = c;
      return grpc::Status::OK;
    }
  }
  std::vector<std::string> names;
  for (const auto& c : server_.configs) names.push_back(c->name);
  return server_.Reject(grpc::StatusCode::NOT_FOUND, StrCat("unknown config '", name.substr(0, 256),
                                                            "': this server has ", absl::StrJoin(names, ", ")));
}

// Refused here, before any work, so the refusal is counted and logged where the operator looks
// (the client checks it too).
grpc::Status ServedStream::CheckPin() {
  const Manifest& m = server_.source->manifest();
  if ((req_.expect_dataset_fingerprint().empty() || req_.expect_dataset_fingerprint() == m.fingerprint) &&
      (req_.expect_order_digest().empty() || req_.expect_order_digest() == config_->order_digest)) {
    return grpc::Status::OK;
  }
  spdlog::warn("refused a stream of job '{}' rank {}: it pins dataset {} order {}, this server serves {} "
               "order {}", req_.job().substr(0, 256), req_.consumer(), req_.expect_dataset_fingerprint().substr(0, 64),
               req_.expect_order_digest().substr(0, 12), m.fingerprint, config_->order_digest.substr(0, 12));
  server_.metrics->DataPinRefused();
  {
    absl::MutexLock lock(&server_.jobs_mu);
    ++server_.refused_data_pin[entry_->job_label];
  }
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, StrCat(
      "this server serves dataset ", m.name, " (fingerprint ", m.fingerprint,
      ", order ", config_->order_digest.substr(0, 12), ") but the job pins fingerprint ",
      req_.expect_dataset_fingerprint().empty() ? "(any)" : req_.expect_dataset_fingerprint().substr(0, 64),
      ", order ", req_.expect_order_digest().empty() ? "(any)" : req_.expect_order_digest().substr(0, 12),
      " (its checkpoint or its launcher's CONVEYOR_DATASET_FINGERPRINT / CONVEYOR_ORDER_DIGEST): its cursor "
      "names other samples here. Point the job at the data it trained on, or continue on purpose (Loader."
      "load_state_dict(state, allow_data_change=True); docs/python.md \"What a job pins\")"));
}

grpc::Status ServedStream::CheckCeilings() {
  const ServerLimits& l = server_.o.limits;
  const Manifest& m = server_.source->manifest();
  spec_.limits.max_pixels = std::min(spec_.limits.max_pixels, l.max_pixels);
  spec_.limits.max_frames_per_sample = std::min(spec_.limits.max_frames_per_sample, l.max_frames_per_sample);
  spec_.limits.max_audio_samples = std::min(spec_.limits.max_audio_samples, l.max_audio_samples);
  spec_.limits.max_sample_bytes =
      std::min<int64_t>(spec_.limits.max_sample_bytes, static_cast<int64_t>(l.max_sample_bytes));
  if (po_.global_batch_size > l.max_global_batch_size) {
    return server_.Reject(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("pipeline.global_batch_size is ", po_.global_batch_size,
                                 "; this server's ceiling is ", l.max_global_batch_size, " (--max-global-batch-size)"));
  }
  for (const StreamSpec& st : spec_.streams) {
    if (st.kind != format::v1::VIDEO && st.kind != format::v1::IMAGE) continue;
    if (static_cast<int64_t>(st.deltas.size()) > l.max_frames_per_sample) {
      return server_.Reject(grpc::StatusCode::INVALID_ARGUMENT,
                            StrCat("streams.", m.streams[st.stream].name, " asks for ", st.deltas.size(),
                                   " frames per sample; this server's ceiling is ", l.max_frames_per_sample,
                                   " (--max-frames-per-sample)"));
    }
    if (static_cast<int64_t>(st.height) * st.width > l.max_pixels) {
      return server_.Reject(grpc::StatusCode::INVALID_ARGUMENT,
                            StrCat("streams.", m.streams[st.stream].name, " asks for ", st.width, "x", st.height,
                                   " frames; this server's ceiling is ", l.max_pixels, " pixels (--max-pixels)"));
    }
  }
  const MemoryEstimate e = EstimateMemory(*server_.source, spec_, po_);
  if (e.sample_bytes > l.max_sample_bytes) {
    return server_.Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          StrCat("one sample of this config is about ", e.sample_bytes,
                                 " bytes; this server's ceiling is ", l.max_sample_bytes,
                                 " (--max-sample-bytes): ask for fewer or smaller frames"));
  }
  if (e.batch_bytes > l.max_batch_bytes) {
    return server_.Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          StrCat("one consumer batch of this config is about ", e.batch_bytes,
                                 " bytes; this server's ceiling is ", l.max_batch_bytes,
                                 " (--max-batch-bytes): use more consumers or a smaller batch"));
  }
  if (e.total > l.stream_memory_bytes) {
    return server_.Reject(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          StrCat("this stream would hold about ", e.total, " bytes (pre-decoded frames ",
                                 e.window_prefetch_bytes, ", samples in flight ", e.in_flight_bytes,
                                 ", batch buffers 2 x ", e.batch_bytes, "); this server gives a stream at most ",
                                 l.stream_memory_bytes,
                                 " (--stream-memory-bytes): lower pipeline.queue_bytes, the schedule's "
                                 "window_blocks or the batch size"));
  }
  stream_bytes_ = e.total;
  batch_bytes_ = e.batch_bytes;
  return grpc::Status::OK;
}

void ServedStream::FillStart(pb::StreamStart* st) const {
  st->set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
  st->set_server_version(server_.o.version);
  st->set_dataset_name(server_.source->manifest().name);
  st->set_dataset_fingerprint(server_.source->manifest().fingerprint);
  st->set_config_digest(config_->digest);
  st->set_order_digest(config_->order_digest);
  st->set_samples_per_epoch(pipeline_->num_samples());
  st->set_steps_per_epoch(pipeline_->steps_per_epoch());
  st->set_global_batch_size(po_.global_batch_size);
  st->set_max_epochs(po_.max_epochs);
  st->set_schedule_version(po_.order.version);
  CursorToProto(pipeline_->start(), st->mutable_start());
}

grpc::Status ServedStream::Open(std::unique_ptr<PayloadSink>* sink) {
  Cursor start{req_.start().epoch(), req_.start().step()};
  if (req_.start().has_position()) start.position = req_.start().position();
  absl::StatusOr<std::unique_ptr<Pipeline>> created = Pipeline::Create(*server_.source, spec_, po_, start);
  if (!created.ok()) {
    *outcome_ = "rejected";
    return server_.Reject(ToGrpc(created.status()).error_code(), std::string(created.status().message()));
  }
  pipeline_ = std::move(*created);
  {
    absl::MutexLock lock(&server_.mu);
    Registered& reg = server_.streams[entry_];
    reg.pipeline = pipeline_.get();
    reg.job_label = entry_->job_label;
    reg.queue_budget = po_.queue_bytes;
    if (server_.shutting_down) pipeline_->Cancel();
  }
  pb::StreamBatchesResponse first;
  FillStart(first.mutable_start());
  // The carrier (server/internal/carrier.h): the first the request asks for that grants; its
  // fields go in the stream start, and the payloads go in messages without one.
  const CarrierRequest carrier{
      .ctx = ctx_,
      .request = &req_,
      .who = StrCat("job=", job_, " consumer=", req_.consumer(), "/", req_.consumers()),
      .max_message = max_message_,
      .batch_bytes = batch_bytes_,
      .queue_bytes = po_.queue_bytes,
      .stream_bytes = stream_bytes_,
      .reserve_memory = [this](uint64_t bytes) { return reservation_->Grow(bytes); },
  };
  carrier_ = GrantCarrier(carrier, server_.carriers, first.mutable_start());
  // This job's series, created at 0 so that increase() and alerts see the first skip.
  const std::string& label = entry_->job_label;
  server_.metrics->Skipped(label, 0);
  const PipelineStats at_start = pipeline_->stats();
  server_.metrics->Quarantined(label, at_start.quarantined_episodes, at_start.quarantined_samples);
  server_.metrics->Frames(label, 0, 0);
  if (!writer_->Write(SerializeMessage(first))) return Finish(grpc::Status::CANCELLED, "cancelled");
  const StopFn stop = server_.StreamOver(ctx_, entry_);
  if (carrier_) {
    absl::StatusOr<std::unique_ptr<PayloadSink>> connected = carrier_->Connect(stop);
    if (absl::IsCancelled(connected.status())) return Finish(grpc::Status::CANCELLED, "cancelled");
    if (!connected.ok()) return Finish(ToGrpc(connected.status()), "error");
    *sink = *std::move(connected);
  }
  if (!*sink) *sink = MakeGrpcSink(max_message_);
  // A sink that builds the batches where it sends them (the same-host ring) polls stop() only
  // while it waits for the client to release room: that wait is what the progress timeout
  // measures.
  if (BatchBuffers buffers = (*sink)->buffers([entry = entry_, stop] {
        entry->Blocked();
        return stop();
      })) {
    pipeline_->SetBatchBuffers(std::move(buffers));
  }
  server_.metrics->StreamTransport(std::string((*sink)->transport()));
  return grpc::Status::OK;
}

grpc::Status ServedStream::Finish(grpc::Status status, const char* outcome) {
  server_.metrics->queue_bytes.Decrement(static_cast<double>(last_.queue_bytes));
  *outcome_ = outcome;
  return status;
}

grpc::Status ServedStream::SendAll(PayloadSink& sink) {
  const std::string& label = entry_->job_label;
  uint64_t sent = 0;
  Cursor cursor = pipeline_->start();
  for (;;) {
    if (req_.max_batches() && sent >= req_.max_batches()) return Finish(grpc::Status::OK, "ok");
    const auto t0 = Clock::now();
    absl::StatusOr<std::optional<Batch>> b = pipeline_->Next();
    server_.metrics->PipelineWait(label, Seconds(t0, Clock::now()));
    const PipelineStats now = pipeline_->stats();
    Account(last_, now);
    last_ = now;
    entry_->queue_bytes.store(now.queue_bytes);
    bool draining = false;
    {
      absl::MutexLock lock(&server_.mu);
      draining = server_.shutting_down;
    }
    if (draining) {
      return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 StrCat("server is shutting down; resume from cursor ", cursor.ToString(),
                                        " on another server")),
                    "shutdown");
    }
    if (entry_->stalled) return Finish(server_.Stalled(), "stalled");
    if (ctx_->IsCancelled()) return Finish(grpc::Status::CANCELLED, "cancelled");
    entry_->Progressed();
    if (!b.ok()) {
      spdlog::error("job={} consumer={}/{}: {}", job_, req_.consumer(), req_.consumers(),
                    std::string(b.status().message()));
      return Finish(ToGrpc(Annotate(b.status(), StrCat("batch ", cursor.ToString()))), "error");
    }
    if (!b->has_value()) return Finish(grpc::Status::OK, "ok");  // the real end: max_epochs
    const Batch& batch = **b;
    const auto t1 = Clock::now();
    entry_->Blocked();  // until the client takes the batch
    const absl::Status delivered = SendBatch(batch, sink);
    if (entry_->stalled) return Finish(server_.Stalled(), "stalled");
    entry_->Progressed();
    if (absl::IsCancelled(delivered)) return Finish(grpc::Status::CANCELLED, "cancelled");
    if (!delivered.ok()) {
      spdlog::error("job={} consumer={}/{}: {}", job_, req_.consumer(), req_.consumers(),
                    std::string(delivered.message()));
      return Finish(ToGrpc(Annotate(delivered, StrCat("batch ", cursor.ToString()))), "error");
    }
    const double send = Seconds(t1, Clock::now());
    server_.metrics->batch_send_seconds.Observe(send);
    server_.metrics->ConsumerWait(label, send);
    server_.metrics->Stage("send", send);
    ++sent;
    cursor = batch.next;
    RecordCoverage(batch);
  }
}

// A delivered batch into the job's ledger, and the ledger's latest epoch into the metrics.
void ServedStream::RecordCoverage(const Batch& batch) {
  const std::string& label = entry_->job_label;
  uint64_t epoch = 0, samples = 0, slices = 0;
  {
    absl::MutexLock lock(&server_.jobs_mu);
    CoverageLedger& ledger = server_.coverage[label];
    ledger.Add(batch.cursor, batch.consumer, batch.consumers, po_.global_batch_size, batch.ids);
    epoch = batch.cursor.epoch;
    for (const CoverageSlice& s : ledger.Slices()) {
      if (s.epoch != epoch) continue;
      samples += s.samples;
      ++slices;
    }
  }
  server_.metrics->Coverage(label, epoch, samples, slices);
}

void ServedStream::Account(const PipelineStats& a, const PipelineStats& b) {
  ServerMetrics& metrics = *server_.metrics;
  const std::string& label = entry_->job_label;
  metrics.Stage("decode", b.decode_seconds - a.decode_seconds);
  metrics.Stage("assemble", b.assemble_seconds - a.assemble_seconds);
  metrics.Stage("batch", b.batch_seconds - a.batch_seconds);
  metrics.Stage("idle", b.worker_idle_seconds - a.worker_idle_seconds);
  metrics.Stage("cpu_slot_wait", b.cpu_slot_wait_seconds - a.cpu_slot_wait_seconds);
  if (server_.cpu_slots) metrics.cpu_slots_in_use.Set(server_.cpu_slots->stats().in_use);
  if (b.skipped > a.skipped) metrics.Skipped(label, b.skipped - a.skipped);
  const uint64_t decoded = b.frames_decoded > a.frames_decoded ? b.frames_decoded - a.frames_decoded : 0;
  const uint64_t delivered = b.frames_delivered > a.frames_delivered ? b.frames_delivered - a.frames_delivered : 0;
  if (decoded || delivered) metrics.Frames(label, decoded, delivered);
  server_.total_decoded += decoded;
  server_.total_delivered += delivered;
  if (decoded || delivered) {
    absl::MutexLock lock(&server_.jobs_mu);
    DataServer::Impl::JobTotals& t = server_.job_totals[label];
    t.frames_decoded += decoded;
    t.frames_delivered += delivered;
  }
  if (server_.total_delivered > 0) {
    metrics.decode_amplification.Set(static_cast<double>(server_.total_decoded) / server_.total_delivered);
  }
  metrics.queue_bytes.Increment(static_cast<double>(b.queue_bytes) - static_cast<double>(a.queue_bytes));
}

absl::Status ServedStream::SendBatch(const Batch& b, PayloadSink& sink) {
  ServerMetrics& metrics = *server_.metrics;
  const std::string& label = entry_->job_label;
  const double waited = sink.wait_seconds();
  RETURN_IF_ERROR(sink.Send(b, b.next, [this](const grpc::ByteBuffer& m) { return writer_->Write(m); }));
  if (sink.wait_seconds() > waited) metrics.SharedMemoryWait(sink.wait_seconds() - waited);
  std::map<std::string, uint64_t> modality_bytes;
  for (const TensorView& t : b.tensors) modality_bytes[Modality(t)] += t.bytes;
  metrics.Batch(label, b.ids.size());
  {
    absl::MutexLock lock(&server_.jobs_mu);
    server_.job_totals[label].samples += b.ids.size();
  }
  const Source& source = *server_.source;
  std::vector<uint64_t> per_dataset(source.size(), 0);
  for (const SampleId& id : b.ids) {
    if (id.dataset < per_dataset.size()) ++per_dataset[id.dataset];
  }
  for (size_t k = 0; k < per_dataset.size(); ++k) {
    if (per_dataset[k] > 0) metrics.DatasetSamples(source.member(k).name, per_dataset[k]);
  }
  for (const auto& [modality, bytes] : modality_bytes) {
    metrics.Bytes(modality, bytes);
    if (modality != "mask" && modality != "packing") metrics.Samples(modality, b.ids.size());
  }
  return absl::OkStatus();
}

std::string ServedStream::Modality(const TensorView& tensor) const {
  if (tensor.role == TensorRole::kPaddingMask) return "mask";
  const Source& source = *server_.source;
  const int i = source.manifest().StreamIndex(tensor.name);
  if (i < 0) return !source.tag_stream().empty() && tensor.name == source.tag_stream() ? "tag" : "packing";
  return std::string(format::StreamKindName(source.manifest().streams[i].kind));
}

}  // namespace conveyor
