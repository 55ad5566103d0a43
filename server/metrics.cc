#include "server/metrics.h"

#include <exception>

#include "base/strings.h"

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

prometheus::Counter& Counter(prometheus::Registry& r, const char* name, const char* help) {
  return Counters(r, name, help).Add({});
}

}  // namespace

ServerMetrics::ServerMetrics(std::shared_ptr<prometheus::Registry> registry)
    : streams_active(Gauge(*registry, "conveyor_streams_active", "Batch streams being served")),
      queue_bytes(Gauge(*registry, "conveyor_queue_bytes",
                        "Samples and pre-decoded frames in flight in all streams' pipelines")),
      decode_amplification(Gauge(*registry, "conveyor_decode_amplification",
                                 "Video frames decoded per frame delivered, since start")),
      frames_decoded(Counter(*registry, "conveyor_video_frames_decoded_total", "Video frames decoded")),
      frames_delivered(Counter(*registry, "conveyor_video_frames_delivered_total",
                               "Video frames delivered in samples")),
      samples_skipped(Counter(*registry, "conveyor_samples_skipped_total",
                              "Samples skipped under on_error: skip (each is logged with its reason)")),
      send_blocked_seconds(Counter(*registry, "conveyor_consumer_wait_seconds_total",
                                   "Seconds streams waited for consumers to take data (backpressure)")),
      pipeline_wait_seconds(Counter(*registry, "conveyor_pipeline_wait_seconds_total",
                                    "Seconds streams waited for their pipelines (consumers starved)")),
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
                      "batch, idle, send)")),
      errors_(Counters(*registry_, "conveyor_errors_total", "Streams ended by an error, by reason")) {}

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
    try {
      m->exposer_ = std::make_unique<prometheus::Exposer>(listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(StrCat("cannot serve metrics on ", listen, ": ", e.what()));
    }
    m->exposer_->RegisterCollectable(registry);
    const std::vector<int> ports = m->exposer_->GetListeningPorts();
    const std::string host = listen.substr(0, listen.rfind(':'));
    m->address_ = ports.empty() ? listen : StrCat(host, ":", ports.front());
  }
  return m;
}

void ServerMetrics::StreamEnded(const std::string& outcome) { streams_.Add({{"outcome", outcome}}).Increment(); }
void ServerMetrics::RequestRejected(const std::string& code) { rejected_.Add({{"code", code}}).Increment(); }
void ServerMetrics::Batch(const std::string& job, uint64_t samples) {
  // Bounded label cardinality: the first kMaxJobLabels job names get series of their own, later
  // ones share "_other" (a client inventing a job name per request cannot grow the registry).
  std::string label = job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.count(job)) {
      if (jobs_.size() < kMaxJobLabels) {
        jobs_.insert(job);
      } else {
        label = "_other";
      }
    }
  }
  batches_.Add({{"job", label}}).Increment();
  job_samples_.Add({{"job", label}}).Increment(static_cast<double>(samples));
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
void ServerMetrics::Error(const std::string& reason) { errors_.Add({{"reason", reason}}).Increment(); }

}  // namespace conveyor
