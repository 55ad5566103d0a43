// The server's Prometheus metrics (prometheus-cpp), all prefixed `conveyor_`. Names and units
// follow Prometheus conventions: counters end in _total, durations are seconds, sizes bytes.
// docs/serving.md lists them.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "readers/storage.h"

namespace conveyor {

class ServerMetrics {
 public:
  // `listen` empty: metrics are kept but not exposed.
  static absl::StatusOr<std::unique_ptr<ServerMetrics>> Create(const std::string& listen,
                                                                const std::string& version);
  std::string address() const { return address_; }

  prometheus::Gauge& streams_active;
  prometheus::Gauge& queue_bytes;          // pipelines' samples and frames in flight, all streams
  prometheus::Gauge& decode_amplification;  // frames decoded / frames delivered, since start
  prometheus::Counter& frames_decoded;
  prometheus::Counter& frames_delivered;
  prometheus::Counter& samples_skipped;     // on_error: skip
  prometheus::Counter& send_blocked_seconds;   // Write() waiting for the consumer (backpressure)
  prometheus::Counter& pipeline_wait_seconds;  // the stream waiting for its pipeline
  prometheus::Histogram& batch_send_seconds;

  void StreamEnded(const std::string& outcome);          // ok, cancelled, shutdown, error
  void RequestRejected(const std::string& code);         // grpc code name
  void Batch(const std::string& job, uint64_t samples);
  void Bytes(const std::string& modality, uint64_t bytes);  // video, image, audio, lowdim, ...
  void Samples(const std::string& modality, uint64_t samples);
  // Samples sent from each dataset (a mixture's members; the dataset's name otherwise).
  void DatasetSamples(const std::string& dataset, uint64_t samples);
  void Stage(const std::string& stage, double seconds);  // decode, assemble, batch, idle, send
  void Error(const std::string& reason);
  // Exposes the dataset storage's counters (StorageStats: backend reads, bytes, retries,
  // connections; the node-local cache's hits, misses, bytes, corrupt entries, evictions) as
  // conveyor_storage_* counters, read from `stats` at each scrape. REQUIRES: what `stats` reads
  // outlives this object.
  void ExposeStorage(std::function<StorageStats()> stats);

 private:
  explicit ServerMetrics(std::shared_ptr<prometheus::Registry> registry);
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Collectable> storage_;
  std::string address_;
  std::mutex mu_;  // Family::Add is thread-safe; this guards jobs_
  static constexpr size_t kMaxJobLabels = 256;
  std::set<std::string> jobs_ ABSL_GUARDED_BY(mu_);  // job names with series of their own
  prometheus::Family<prometheus::Counter>& streams_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& batches_;
  prometheus::Family<prometheus::Counter>& job_samples_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Counter>& dataset_samples_;
  prometheus::Family<prometheus::Counter>& stage_;
  prometheus::Family<prometheus::Counter>& errors_;
};

}  // namespace conveyor
