// Info and Report: what a server tells about what it serves and about its jobs, and the data
// waits its clients report (docs/serving.md "The protocol" and "`conveyor top`").
#include <cmath>
#include <map>
#include <vector>

#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/format.h"
#include "server/internal/server_impl.h"

namespace conveyor {

namespace pb = ::conveyor::v1;

grpc::Status DataServer::Impl::Report(grpc::ServerContext* ctx, const pb::ReportRequest* req, pb::ReportResponse*) {
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

// Jobs: streams open here, totals, coverage, and the ranks' reports of the window.
void DataServer::Impl::AddJobs(pb::InfoResponse* r) {
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
}

void DataServer::Impl::AddFrameCache(pb::FrameCacheStatus* fc) {
  const FrameCacheStats fs = frame_cache->stats();
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

grpc::Status DataServer::Impl::Info(grpc::ServerContext* ctx, const pb::InfoRequest*, pb::InfoResponse* r) {
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
  AddJobs(r);
  r->set_wait_window_seconds(60);
  if (frame_cache) AddFrameCache(r->mutable_frame_cache());
  for (double b : JobWaits::kBucketBounds) r->add_wait_bucket_bounds(b);
  return grpc::Status::OK;
}

}  // namespace conveyor
