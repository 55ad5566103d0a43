#include "server/metrics.h"
#include "server/internal/listen_holder.h"

#include <cmath>
#include <exception>

#include "base/strings.h"
#include "server/job_waits.h"

namespace conveyor {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& r, const char* name,
                                                  const char* help) {
  return BuildCounter().Name(name).Help(help).Register(r);
}

prometheus::Gauge& Gauge(prometheus::Registry& r, const char* name, const char* help) {
  return BuildGauge().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

ServerMetrics::ServerMetrics(std::shared_ptr<prometheus::Registry> registry)
    : streams_active(Gauge(*registry, "conveyor_streams_active", "Batch streams being served")),
      queue_bytes(Gauge(*registry, "conveyor_queue_bytes",
                        "Samples and pre-decoded frames in flight in all streams' pipelines")),
      decode_amplification(Gauge(*registry, "conveyor_decode_amplification",
                                 "Video frames decoded per frame delivered, since start")),
      memory_budget_bytes(Gauge(*registry, "conveyor_memory_budget_bytes",
                                "The memory all streams together may hold (--server-memory-bytes)")),
      memory_reserved_bytes(Gauge(*registry, "conveyor_memory_reserved_bytes",
                                  "The running streams' memory estimates, held against the budget")),
      cpu_slots(Gauge(*registry, "conveyor_cpu_slots",
                      "How many decode workers of all streams may compute at once (--cpu-slots; 0: no bound)")),
      cpu_slots_in_use(Gauge(*registry, "conveyor_cpu_slots_in_use",
                             "Decode workers computing now, all streams (at the last batch sent)")),
      batch_send_seconds(BuildHistogram()
                             .Name("conveyor_batch_send_seconds")
                             .Help("Seconds to write one batch to its consumer")
                             .Register(*registry)
                             .Add({}, prometheus::Histogram::BucketBoundaries{
                                          0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                          0.25, 0.5, 1, 2.5, 5, 10})),
      registry_(std::move(registry)),
      streams_(Counters(*registry_, "conveyor_streams_total", "Batch streams ended, by outcome")),
      rejected_(Counters(*registry_, "conveyor_requests_rejected_total",
                         "Requests refused before streaming, by gRPC status code")),
      transport_(Counters(*registry_, "conveyor_stream_transport_total",
                          "Batch streams started, by transport (grpc or shared_memory)")),
      shm_wait_(Counters(*registry_, "conveyor_shared_memory_wait_seconds_total",
                         "Seconds streams waited for their client to release shared memory").Add({})),
      stalled_(Counters(*registry_, "conveyor_streams_stalled_total",
                        "Streams and stripe streams ended because their client took no batch for "
                        "--stream-progress-timeout").Add({})),
      batches_(Counters(*registry_, "conveyor_batches_total", "Batches sent, by job")),
      job_samples_(Counters(*registry_, "conveyor_job_samples_total", "Samples sent, by job")),
      bytes_(Counters(*registry_, "conveyor_tensor_bytes_total",
                      "Tensor bytes sent, by modality (video, image, audio, lowdim, text, mask, packing)")),
      samples_(Counters(*registry_, "conveyor_samples_total",
                        "Samples sent, by modality (each sample counts once per modality it holds)")),
      dataset_samples_(Counters(*registry_, "conveyor_dataset_samples_total",
                                "Samples sent, by dataset (a mixture's member, docs/mixtures.md)")),
      stage_(Counters(*registry_, "conveyor_stage_seconds_total",
                      "Seconds spent per pipeline stage, summed over workers (decode, assemble, "
                      "batch, idle, cpu_slot_wait, send)")),
      errors_(Counters(*registry_, "conveyor_errors_total", "Streams ended by an error, by job and reason")),
      skipped_(Counters(*registry_, "conveyor_samples_skipped_total",
                        "Samples skipped under on_error: skip, by job (each is logged with its reason)")),
      frames_decoded_(Counters(*registry_, "conveyor_video_frames_decoded_total", "Video frames decoded, by job")),
      frames_delivered_(Counters(*registry_, "conveyor_video_frames_delivered_total",
                                 "Video frames delivered in samples, by job")),
      pipeline_wait_(Counters(*registry_, "conveyor_pipeline_wait_seconds_total",
                              "Seconds streams waited for their pipelines (consumers starved), by job")),
      consumer_wait_(Counters(*registry_, "conveyor_consumer_wait_seconds_total",
                              "Seconds streams waited for consumers to take data (backpressure), by job")),
      client_steps_(Counters(*registry_, "conveyor_client_steps_total",
                             "Training steps (batches taken) that clients reported, by job")),
      client_step_seconds_(Counters(*registry_, "conveyor_client_step_seconds_total",
                                    "Wall time of the steps clients reported, by job")),
      client_wait_seconds_(Counters(*registry_, "conveyor_client_wait_seconds_total",
                                    "Seconds clients reported waiting for data in those steps, by job")),
      step_wait_(BuildHistogram()
                     .Name("conveyor_client_step_wait_seconds")
                     .Help("Each reported step's wait for data in the client's Next(), by job")
                     .Register(*registry_)),
      quarantined_episodes_(BuildGauge()
                                .Name("conveyor_quarantined_episodes")
                                .Help("Episodes the job's quarantine file (conveyor check) leaves "
                                      "out of its order, by job")
                                .Register(*registry_)),
      quarantined_samples_(BuildGauge()
                               .Name("conveyor_quarantined_samples")
                               .Help("Samples per epoch those episodes would have given, by job")
                               .Register(*registry_)),
      coverage_epoch_(BuildGauge()
                          .Name("conveyor_coverage_epoch")
                          .Help("The latest epoch of a job's coverage ledger on this server")
                          .Register(*registry_)),
      coverage_samples_(BuildGauge()
                            .Name("conveyor_coverage_epoch_samples")
                            .Help("Samples this server delivered in the job's latest epoch (conveyor audit)")
                            .Register(*registry_)),
      coverage_slices_(BuildGauge()
                           .Name("conveyor_coverage_epoch_slices")
                           .Help("Consumer slices this server delivered to in the job's latest epoch")
                           .Register(*registry_)),
      step_wait_window_(BuildGauge()
                            .Name("conveyor_job_step_wait_window_seconds")
                            .Help("A step's wait for data over the reports of the last 60 s on this "
                                  "server, by job and quantile (0.5, 0.99, 1 = max)")
                            .Register(*registry_)),
      slowest_rank_(BuildGauge()
                        .Name("conveyor_job_slowest_rank")
                        .Help("The rank (consumer) that waited the largest share of its step time "
                              "for data in the last 60 s of reports on this server, by job")
                        .Register(*registry_)),
      slowest_rank_share_(BuildGauge()
                              .Name("conveyor_job_slowest_rank_wait_share")
                              .Help("That rank's share of its step time spent waiting for data, by job")
                              .Register(*registry_)) {}

absl::StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Create(const std::string& listen,
                                                                     const std::string& version) {
  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<ServerMetrics> m(new ServerMetrics(registry));
  BuildGauge()
      .Name("conveyor_build_info")
      .Help("Build information (always 1)")
      .Register(*registry)
      .Add({{"version", version}, {"protocol", "1"}})
      .Set(1);
  if (!listen.empty()) {
    // A bare port (or ":PORT") is a loopback address, as the banner says: the exposer would bind
    // every interface for it. Give HOST:PORT (0.0.0.0:PORT) to expose metrics beyond this host.
    const std::string bind = listen.find(':') == std::string::npos ? StrCat("127.0.0.1:", listen)
                             : listen.front() == ':'                ? StrCat("127.0.0.1", listen)
                                                                    : listen;
    try {
      m->exposer_ = std::make_unique<prometheus::Exposer>(bind);
    } catch (const std::exception& e) {
      const size_t colon = listen.rfind(':');
      const int port = colon == std::string::npos ? 0 : std::atoi(listen.c_str() + colon + 1);
      const std::string holder = port > 0 ? server_internal::ListenHolder(port) : std::string();
      return absl::UnavailableError(StrCat("cannot serve metrics on ", listen, ": ",
                                           holder.empty() ? std::string(e.what())
                                                          : StrCat("the address is in use by ", holder)));
    }
    m->exposer_->RegisterCollectable(registry);
    const std::vector<int> ports = m->exposer_->GetListeningPorts();
    const std::string host = bind.substr(0, bind.rfind(':'));
    m->address_ = ports.empty() ? bind : StrCat(host, ":", ports.front());
  }
  return m;
}

namespace {

// StorageStats as Prometheus counters, computed at scrape time (the storage keeps the counts).
class StorageCollectable final : public prometheus::Collectable {
 public:
  explicit StorageCollectable(std::function<StorageStats()> stats) : stats_(std::move(stats)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const StorageStats s = stats_();
    std::vector<prometheus::MetricFamily> out;
    auto counter = [&](const char* name, const char* help, uint64_t value) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = prometheus::MetricType::Counter;
      prometheus::ClientMetric m;
      m.counter.value = static_cast<double>(value);
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    counter("conveyor_storage_reads_total", "Range reads the storage backend completed", s.reads);
    counter("conveyor_storage_read_bytes_total", "Bytes the storage backend returned", s.bytes_read);
    counter("conveyor_storage_retries_total", "Storage requests retried after a transient failure",
            s.retries);
    counter("conveyor_storage_connections_total", "TCP connections opened to the storage backend",
            s.connections_opened);
    counter("conveyor_storage_cache_hits_total", "Blocks served from the node-local cache",
            s.cache_hits);
    counter("conveyor_storage_cache_misses_total", "Blocks fetched from the backend into the cache",
            s.cache_misses);
    counter("conveyor_storage_cache_hit_bytes_total", "Bytes of blocks served from the cache",
            s.cache_hit_bytes);
    counter("conveyor_storage_cache_fill_bytes_total", "Bytes of blocks written to the cache",
            s.cache_fill_bytes);
    counter("conveyor_storage_cache_corrupt_total",
            "Cache entries that failed their checksum (removed and fetched again)", s.cache_corrupt);
    counter("conveyor_storage_cache_evicted_bytes_total",
            "Bytes this process evicted from the cache to keep its bound", s.cache_evicted_bytes);
    return out;
  }

 private:
  const std::function<StorageStats()> stats_;
};

// The decoded-frame cache's counters and gauges, read at scrape time.
class FrameCacheCollectable final : public prometheus::Collectable {
 public:
  explicit FrameCacheCollectable(std::function<FrameCacheStats()> stats) : stats_(std::move(stats)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const FrameCacheStats s = stats_();
    std::vector<prometheus::MetricFamily> out;
    auto metric = [&](const char* name, const char* help, prometheus::MetricType type, uint64_t value) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      prometheus::ClientMetric m;
      if (type == prometheus::MetricType::Counter) {
        m.counter.value = static_cast<double>(value);
      } else {
        m.gauge.value = static_cast<double>(value);
      }
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    using T = prometheus::MetricType;
    metric("conveyor_frame_cache_hits_total", "Decoded frames found in the frame cache (not decoded)", T::Counter, s.hits);
    metric("conveyor_frame_cache_misses_total", "Frame cache lookups that missed (the block was decoded)", T::Counter, s.misses);
    metric("conveyor_frame_cache_bytes", "Bytes of decoded frames the frame cache holds", T::Gauge, s.bytes);
    metric("conveyor_frame_cache_max_bytes", "The frame cache's bound (--frame-cache-bytes)", T::Gauge, s.max_bytes);
    metric("conveyor_frame_cache_frames", "Decoded frames the frame cache holds", T::Gauge, s.frames);
    metric("conveyor_frame_cache_evicted_bytes_total", "Bytes evicted to admit other frames (lru)", T::Counter, s.evicted_bytes);
    metric("conveyor_frame_cache_rejected_total", "Frames not admitted because the cache was full (pin)", T::Counter, s.rejected);
    if (s.has_store) {
      const FrameStoreStats& d = s.store;
      metric("conveyor_frame_store_hits_total", "Frames read from the node's frame cache directory", T::Counter, d.hits);
      metric("conveyor_frame_store_misses_total", "Lookups in the node's frame cache directory that missed", T::Counter, d.misses);
      metric("conveyor_frame_store_published_total", "Frames this server wrote to the node's frame cache directory", T::Counter, d.published);
      metric("conveyor_frame_store_published_bytes_total", "Bytes of the entries this server wrote", T::Counter, d.published_bytes);
      metric("conveyor_frame_store_rejected_total", "Frames not admitted because the node's store was full (pin)", T::Counter, d.rejected);
      metric("conveyor_frame_store_evicted_bytes_total", "Bytes this server evicted from the node's store (lru)", T::Counter, d.evicted_bytes);
      metric("conveyor_frame_store_corrupt_total", "Entries that failed a check, removed and decoded again", T::Counter, d.corrupt);
      metric("conveyor_frame_store_write_errors_total", "Entries that could not be written (full disk, permissions)", T::Counter, d.write_errors);
      metric("conveyor_frame_store_bytes", "Bytes the node's frame cache directory holds (all processes)", T::Gauge, d.usage_bytes);
      metric("conveyor_frame_store_max_bytes", "The node's frame cache directory bound (--frame-cache-dir-bytes)", T::Gauge, d.max_bytes);
    }
    return out;
  }

 private:
  const std::function<FrameCacheStats()> stats_;
};

}  // namespace

void ServerMetrics::ExposeFrameCache(std::function<FrameCacheStats()> stats) {
  frame_cache_ = std::make_shared<FrameCacheCollectable>(std::move(stats));
  if (exposer_ != nullptr) exposer_->RegisterCollectable(frame_cache_);
}

void ServerMetrics::ExposeStorage(std::function<StorageStats()> stats) {
  storage_ = std::make_shared<StorageCollectable>(std::move(stats));
  if (exposer_ != nullptr) exposer_->RegisterCollectable(storage_);
}

void ServerMetrics::StreamEnded(const std::string& outcome) { streams_.Add({{"outcome", outcome}}).Increment(); }
void ServerMetrics::StreamTransport(const std::string& transport) {
  transport_.Add({{"transport", transport}}).Increment();
}
void ServerMetrics::SharedMemoryWait(double seconds) { shm_wait_.Increment(seconds); }
void ServerMetrics::StreamStalled() { stalled_.Increment(); }
void ServerMetrics::RequestRejected(const std::string& code) { rejected_.Add({{"code", code}}).Increment(); }
void ServerMetrics::DataPinRefused() {
  rejected_.Add({{"code", "FAILED_PRECONDITION"}, {"reason", "data_pin"}}).Increment();
}
namespace {

// Removes the series of `family` whose job label is `label`. `args`: what Add needs to make a
// metric of the family (Add returns the existing one, which Remove takes).
template <typename T, typename... Args>
void RemoveJobSeries(prometheus::Family<T>& family, const std::string& label, Args&&... args) {
  for (const prometheus::MetricFamily& f : family.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      prometheus::Labels labels;
      bool ours = false;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        labels[l.name] = l.value;
        ours |= l.name == "job" && l.value == label;
      }
      if (ours && family.Has(labels)) family.Remove(&family.Add(labels, std::forward<Args>(args)...));
    }
  }
}

}  // namespace

void ServerMetrics::ForgetJob(const std::string& job_label) {
  for (prometheus::Family<prometheus::Counter>* f :
       {&batches_, &job_samples_, &errors_, &skipped_, &frames_decoded_, &frames_delivered_, &pipeline_wait_,
        &consumer_wait_, &client_steps_, &client_step_seconds_, &client_wait_seconds_}) {
    RemoveJobSeries(*f, job_label);
  }
  for (prometheus::Family<prometheus::Gauge>* f :
       {&quarantined_episodes_, &quarantined_samples_, &coverage_epoch_, &coverage_samples_, &coverage_slices_,
        &step_wait_window_, &slowest_rank_, &slowest_rank_share_}) {
    RemoveJobSeries(*f, job_label);
  }
  RemoveJobSeries(step_wait_, job_label, prometheus::Histogram::BucketBoundaries{});
}
void ServerMetrics::IdentityRefused(const std::string& reason) {
  rejected_.Add({{"code", "PERMISSION_DENIED"}, {"reason", reason}}).Increment();
}
void ServerMetrics::Batch(const std::string& job_label, uint64_t samples) {
  batches_.Add({{"job", job_label}}).Increment();
  job_samples_.Add({{"job", job_label}}).Increment(static_cast<double>(samples));
}
void ServerMetrics::Bytes(const std::string& modality, uint64_t bytes) {
  bytes_.Add({{"modality", modality}}).Increment(static_cast<double>(bytes));
}
void ServerMetrics::Samples(const std::string& modality, uint64_t samples) {
  samples_.Add({{"modality", modality}}).Increment(static_cast<double>(samples));
}
void ServerMetrics::DatasetSamples(const std::string& dataset, uint64_t samples) {
  dataset_samples_.Add({{"dataset", dataset}}).Increment(static_cast<double>(samples));
}
void ServerMetrics::Stage(const std::string& stage, double seconds) {
  if (seconds > 0) stage_.Add({{"stage", stage}}).Increment(seconds);
}
void ServerMetrics::Error(const std::string& job_label, const std::string& reason) {
  errors_.Add({{"job", job_label}, {"reason", reason}}).Increment();
}
void ServerMetrics::Skipped(const std::string& job_label, uint64_t samples) {
  // Created at the stream's start (with 0), so that rate() and alerts see the series from 0.
  skipped_.Add({{"job", job_label}}).Increment(static_cast<double>(samples));
}
void ServerMetrics::Coverage(const std::string& job_label, uint64_t epoch, uint64_t samples,
                             uint64_t slices) {
  coverage_epoch_.Add({{"job", job_label}}).Set(static_cast<double>(epoch));
  coverage_samples_.Add({{"job", job_label}}).Set(static_cast<double>(samples));
  coverage_slices_.Add({{"job", job_label}}).Set(static_cast<double>(slices));
}

void ServerMetrics::Quarantined(const std::string& job_label, uint64_t episodes,
                                uint64_t samples) {
  quarantined_episodes_.Add({{"job", job_label}}).Set(static_cast<double>(episodes));
  quarantined_samples_.Add({{"job", job_label}}).Set(static_cast<double>(samples));
}
void ServerMetrics::Frames(const std::string& job_label, uint64_t decoded, uint64_t delivered) {
  frames_decoded_.Add({{"job", job_label}}).Increment(static_cast<double>(decoded));
  frames_delivered_.Add({{"job", job_label}}).Increment(static_cast<double>(delivered));
}
void ServerMetrics::PipelineWait(const std::string& job_label, double seconds) {
  pipeline_wait_.Add({{"job", job_label}}).Increment(seconds);
}
void ServerMetrics::ConsumerWait(const std::string& job_label, double seconds) {
  consumer_wait_.Add({{"job", job_label}}).Increment(seconds);
}
void ServerMetrics::StepWaits(const std::string& job_label, const std::vector<float>& waits) {
  static const prometheus::Histogram::BucketBoundaries kBounds(JobWaits::kBucketBounds.begin(),
                                                                JobWaits::kBucketBounds.end());
  prometheus::Histogram& h = step_wait_.Add({{"job", job_label}}, kBounds);
  for (float w : waits) h.Observe(std::isfinite(w) && w > 0 ? w : 0);
}
void ServerMetrics::JobWaitSummary(const std::string& job_label, double p50, double p99, double max,
                                   int64_t slowest_rank, double slowest_wait_share) {
  step_wait_window_.Add({{"job", job_label}, {"quantile", "0.5"}}).Set(p50);
  step_wait_window_.Add({{"job", job_label}, {"quantile", "0.99"}}).Set(p99);
  step_wait_window_.Add({{"job", job_label}, {"quantile", "1"}}).Set(max);
  slowest_rank_.Add({{"job", job_label}}).Set(static_cast<double>(slowest_rank));
  slowest_rank_share_.Add({{"job", job_label}}).Set(slowest_wait_share);
}
void ServerMetrics::ClientReport(const std::string& job_label, uint64_t steps, double step_seconds,
                                 double wait_seconds) {
  client_steps_.Add({{"job", job_label}}).Increment(static_cast<double>(steps));
  client_step_seconds_.Add({{"job", job_label}}).Increment(step_seconds);
  client_wait_seconds_.Add({{"job", job_label}}).Increment(wait_seconds);
}

}  // namespace conveyor
