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
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pipeline/frame_cache.h"
#include "storage/storage.h"

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
  prometheus::Gauge& memory_budget_bytes;    // ServerLimits::server_memory_bytes as resolved
  prometheus::Gauge& memory_reserved_bytes;  // the running streams' estimates
  prometheus::Gauge& cpu_slots;              // ServerOptions::cpu_slots as resolved (0: no bound)
  prometheus::Gauge& cpu_slots_in_use;       // workers computing now, all streams
  prometheus::Histogram& batch_send_seconds;

  // The per-job methods below take the label a job's series carry: its name while it holds one
  // of the server's job slots, "_other" when all are taken (server/internal/job_identity.h), so
  // a client inventing a job name per request cannot grow the registry. ForgetJob drops every
  // series of a job whose slot was reclaimed.
  void ForgetJob(const std::string& job_label);
  // A call refused for who it is (PERMISSION_DENIED): reason local_user or job_secret.
  void IdentityRefused(const std::string& reason);

  void StreamEnded(const std::string& outcome);          // ok, cancelled, shutdown, error
  // A stream or stripe stream ended by --stream-progress-timeout (its client took nothing).
  void StreamStalled();
  void StreamTransport(const std::string& transport);   // a stream started: grpc, shared_memory
  // Seconds a stream waited for its client to release shared memory (the client is behind).
  void SharedMemoryWait(double seconds);
  void RequestRejected(const std::string& code);         // grpc code name
  void DataPinRefused();  // a stream whose job pins other data (FAILED_PRECONDITION, reason data_pin)
  void Batch(const std::string& job_label, uint64_t samples);
  void Bytes(const std::string& modality, uint64_t bytes);  // video, image, audio, lowdim, ...
  void Samples(const std::string& modality, uint64_t samples);
  // Samples sent from each dataset (a mixture's members; the dataset's name otherwise).
  void DatasetSamples(const std::string& dataset, uint64_t samples);
  void Stage(const std::string& stage, double seconds);  // decode, assemble, batch, idle, send
  void Error(const std::string& job_label, const std::string& reason);
  void Skipped(const std::string& job_label, uint64_t samples);  // on_error: skip
  // Episodes and samples per epoch left out by the job's `quarantine:` (sample/quarantine.h).
  void Quarantined(const std::string& job_label, uint64_t episodes, uint64_t samples);
  // The coverage ledger (base/coverage.h) of a job's latest epoch here: its number, the samples
  // this server delivered in it, and the consumer slices they went to.
  void Coverage(const std::string& job_label, uint64_t epoch, uint64_t samples, uint64_t slices);
  void Frames(const std::string& job_label, uint64_t decoded, uint64_t delivered);
  void PipelineWait(const std::string& job_label, double seconds);  // the stream waiting for its pipeline
  void ConsumerWait(const std::string& job_label, double seconds);  // Write() waiting for the consumer
  // A client's report (ReportRequest): its steps, their wall time and the part spent waiting.
  void ClientReport(const std::string& job_label, uint64_t steps, double step_seconds,
                    double wait_seconds);
  // Each reported step's wait, into the histogram (JobWaits::kBucketBounds).
  void StepWaits(const std::string& job_label, const std::vector<float>& waits);
  // A job's window (JobWaits): p50, p99 and max step wait, the rank that waits most.
  void JobWaitSummary(const std::string& job_label, double p50, double p99, double max,
                      int64_t slowest_rank, double slowest_wait_share);
  // Exposes the dataset storage's counters (StorageStats: backend reads, bytes, retries,
  // connections; the node-local cache's hits, misses, bytes, corrupt entries, evictions) as
  // conveyor_storage_* counters, read from `stats` at each scrape. REQUIRES: what `stats` reads
  // outlives this object.
  void ExposeStorage(std::function<StorageStats()> stats);
  // conveyor_frame_cache_* (the decoded-frame cache shared by the server's streams), read from
  // `stats` at each scrape. Same REQUIRES as ExposeStorage.
  void ExposeFrameCache(std::function<FrameCacheStats()> stats);

 private:
  explicit ServerMetrics(std::shared_ptr<prometheus::Registry> registry);
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Collectable> storage_;
  std::shared_ptr<prometheus::Collectable> frame_cache_;
  std::string address_;
  prometheus::Family<prometheus::Counter>& streams_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& transport_;
  prometheus::Counter& shm_wait_;
  prometheus::Counter& stalled_;
  prometheus::Family<prometheus::Counter>& batches_;
  prometheus::Family<prometheus::Counter>& job_samples_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Counter>& dataset_samples_;
  prometheus::Family<prometheus::Counter>& stage_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Family<prometheus::Counter>& skipped_;
  prometheus::Family<prometheus::Counter>& frames_decoded_;
  prometheus::Family<prometheus::Counter>& frames_delivered_;
  prometheus::Family<prometheus::Counter>& pipeline_wait_;
  prometheus::Family<prometheus::Counter>& consumer_wait_;
  prometheus::Family<prometheus::Counter>& client_steps_;
  prometheus::Family<prometheus::Counter>& client_step_seconds_;
  prometheus::Family<prometheus::Counter>& client_wait_seconds_;
  prometheus::Family<prometheus::Histogram>& step_wait_;
  prometheus::Family<prometheus::Gauge>& quarantined_episodes_;
  prometheus::Family<prometheus::Gauge>& quarantined_samples_;
  prometheus::Family<prometheus::Gauge>& coverage_epoch_;
  prometheus::Family<prometheus::Gauge>& coverage_samples_;
  prometheus::Family<prometheus::Gauge>& coverage_slices_;
  prometheus::Family<prometheus::Gauge>& step_wait_window_;
  prometheus::Family<prometheus::Gauge>& slowest_rank_;
  prometheus::Family<prometheus::Gauge>& slowest_rank_share_;
};

}  // namespace conveyor
