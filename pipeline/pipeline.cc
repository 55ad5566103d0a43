// The pipeline (pipeline/pipeline.h): creation, the workers and Next(). The walk that turns the
// global positions into tasks is pipeline_plan.cc, a GOP window's frames window_prefetch.cc, the
// schedule's figures schedule_inputs.cc, the memory estimate memory_estimate.cc and the YAML
// merge pipeline_options.cc.
#include "pipeline/pipeline.h"

#include <algorithm>
#include <exception>
#include <new>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/synchronization/mutex.h"
#include "base/cancel.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "pipeline/internal/pipeline_impl.h"
#include "pipeline/internal/spec_figures.h"

namespace conveyor {

void Pipeline::Impl::CancelLocked() {
  cancelled = true;
  if (pool) pool->Cancel();
  work_cv.SignalAll();
  result_cv.SignalAll();
  window_cv.SignalAll();
  plan_cv.SignalAll();
}

void Pipeline::Impl::Stop() {
  {
    absl::MutexLock lock(&mu);
    CancelLocked();
  }
  pool.reset();  // joins
  planner.reset();
}

void Pipeline::Impl::Worker(size_t id) {
  try {
    WorkerLoop(id);
  } catch (const std::exception& e) {
    Fail(absl::InternalError(StrCat("pipeline worker ", id, " failed: ", e.what())));
  } catch (...) {
    Fail(absl::InternalError(StrCat("pipeline worker ", id, " failed with an unknown exception")));
  }
}

void Pipeline::Impl::Fail(absl::Status s) {
  absl::MutexLock lock(&mu);
  if (fatal.ok()) fatal = std::move(s);
  CancelLocked();
}

absl::StatusOr<Sample> Pipeline::Impl::AssembleNoThrow(SampleAssembler& assembler, const Task& task) const {
  try {
    absl::StatusOr<Sample> s = assembler.Assemble(task.sample, opt.seed, task.member_epoch);
    if (s.ok() && source.is_mixture()) {
      RETURN_IF_ERROR(source.Conform(task.member, spec, members[task.member]->bound, layout, &*s));
    }
    if (!s.ok() && source.is_mixture()) {
      return Annotate(s.status(), StrCat("mixture dataset '", source.member(task.member).name, "'"));
    }
    return s;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(StrCat("out of memory assembling sample ", task.sample));
  } catch (const std::exception& e) {
    return absl::InternalError(StrCat("sample ", task.sample, ": ", e.what()));
  }
}

void Pipeline::Impl::WorkerLoop(size_t id) {
  // One assembler per member, made when the member's first task arrives.
  std::vector<std::unique_ptr<SampleAssembler>> assemblers(members.size());
  auto assembler_for = [&](uint32_t k) -> SampleAssembler& {
    if (!assemblers[k]) {
      Member& m = *members[k];
      assemblers[k] = std::make_unique<SampleAssembler>(*m.dataset, m.bound.spec, m.index);
      if (m.scheduled) assemblers[k]->set_window_prefetch(&m.prefetch);
    }
    return *assemblers[k];
  };
  double idle = 0, decode = 0, assemble = 0, slot_wait = 0;
  std::vector<FrameRequest> needed;
  std::vector<RgbImage> images;
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu);
      if (!TakeTask(&task, &idle)) break;
    }
    SampleAssembler& assembler = assembler_for(task.member);
    if (task.prefetch) {
      const auto t0 = PipelineClock::now();
      std::optional<CpuSlotHold> slot(std::in_place, opt.cpu_slots.get());
      const auto t1 = PipelineClock::now();
      DecodedBlock block = DecodeBlock(assembler, task, &needed, &images);
      slot.reset();
      slot_wait += Seconds(t0, t1);
      decode += Seconds(t1, PipelineClock::now());
      absl::MutexLock lock(&mu);
      AddToWindow(task, &block);
      Publish(id, assemblers, &idle, &decode, &assemble, &slot_wait);
      continue;
    }
    const bool scheduled = members[task.member]->scheduled;
    if (scheduled) {
      absl::MutexLock lock(&mu);
      const auto t0 = PipelineClock::now();
      while (!cancelled && windows[task.window].prefetch_left != 0) window_cv.Wait(&mu);
      idle += Seconds(t0, PipelineClock::now());
      if (cancelled) break;
    }
    const auto t0 = PipelineClock::now();
    std::optional<CpuSlotHold> slot(std::in_place, opt.cpu_slots.get());
    const auto t1 = PipelineClock::now();
    Result r{AssembleNoThrow(assembler, task), 0};
    slot.reset();
    slot_wait += Seconds(t0, t1);
    assemble += Seconds(t1, PipelineClock::now());
    if (r.sample.ok()) r.bytes = r.sample->bytes();
    absl::MutexLock lock(&mu);
    if (scheduled) {
      auto it = windows.find(task.window);
      if (it != windows.end() && --it->second.samples_left == 0 && it->second.prefetch_left == 0) {
        prefetch_bytes -= it->second.bytes;
        windows.erase(it);
        work_cv.SignalAll();
      }
    }
    results_bytes += r.bytes;
    stats.queue_bytes_peak = std::max(stats.queue_bytes_peak, prefetch_bytes + results_bytes);
    results.emplace(task.seq, std::move(r));
    result_cv.SignalAll();
    Publish(id, assemblers, &idle, &decode, &assemble, &slot_wait);
  }
  absl::MutexLock lock(&mu);
  Publish(id, assemblers, &idle, &decode, &assemble, &slot_wait);
}

void Pipeline::Impl::Publish(size_t id,
                             const std::vector<std::unique_ptr<SampleAssembler>>& assemblers,
                             double* idle, double* decode, double* assemble, double* slot_wait) {
  AssemblerStats sum;
  for (const auto& a : assemblers) {
    if (!a) continue;
    const AssemblerStats s = a->stats();
    sum.frames_decoded += s.frames_decoded;
    sum.frames_decoded_nvdec += s.frames_decoded_nvdec;
    sum.frames_delivered += s.frames_delivered;
    sum.prefetch_hits += s.prefetch_hits;
    sum.prefetch_misses += s.prefetch_misses;
  }
  worker_stats[id] = sum;
  stats.worker_idle_seconds += *idle;
  stats.decode_seconds += *decode;
  stats.assemble_seconds += *assemble;
  stats.cpu_slot_wait_seconds += *slot_wait;
  *idle = *decode = *assemble = *slot_wait = 0;
}
Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() {
  if (impl_) impl_->Stop();
}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(const Dataset& dataset,
                                                           const SampleSpec& spec,
                                                           PipelineOptions options, Cursor start) {
  std::unique_ptr<Source> source = Source::Of(dataset);
  const Source& ref = *source;
  ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, Create(ref, spec, std::move(options), start));
  p->impl_->owned_source = std::move(source);
  return p;
}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(const Source& source,
                                                           const SampleSpec& spec,
                                                           PipelineOptions options, Cursor start) {
  ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Prepare(source, spec, std::move(options), start));
  Impl& m = *impl;
  // Parsing the config asked nothing of this machine; whether it can decode each video stream
  // where the config puts it is asked here, before any work.
  for (const auto& mem : m.members) {
    RETURN_IF_ERROR(CheckVideoBackends(mem->bound.spec, mem->dataset->manifest()));
  }
  PipelineOptions& o = m.opt;
  const uint64_t sample_bytes = EstimateSampleBytes(m.spec, source.manifest(), o.largest_bucket_elements);
  bool scheduled = false;
  for (const auto& mem : m.members) scheduled = scheduled || mem->scheduled;
  const uint64_t sample_budget = scheduled ? o.queue_bytes / 2 : o.queue_bytes;
  const int threads = o.threads > 0 ? o.threads
                                    : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // A mixture issues a step's tasks in its members' order, not in batch order: twice a
  // consumer batch ahead keeps the next batch's tasks ahead of the budget gate.
  const uint64_t ahead = (source.is_mixture() ? 2 * m.local : m.local) + 2 * static_cast<uint64_t>(threads);
  m.max_inflight = std::max<uint64_t>(ahead, sample_budget / sample_bytes);
  {
    absl::MutexLock lock(&m.mu);
    m.gen = m.WalkerAt(m.start_epoch, m.start_pos);
    m.stats.member_samples.assign(m.members.size(), 0);
    m.worker_stats.resize(static_cast<size_t>(threads));
  }
  m.pool = std::make_unique<WorkerPool>("conveyor-work", threads,
                                        [&m](int t) { m.Worker(static_cast<size_t>(t)); });
  bool blocks = false;
  for (const auto& mem : m.members) blocks = blocks || mem->order.blocks != nullptr;
  if (blocks) m.planner = std::make_unique<WorkerPool>("conveyor-plan", 1, [&m](int) { m.Planner(); });
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

absl::StatusOr<std::vector<SampleId>> Pipeline::EpochSequence(const Source& source,
                                                              const SampleSpec& spec,
                                                              PipelineOptions options,
                                                              uint64_t epoch) {
  options.max_epochs = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Prepare(source, spec, std::move(options), Cursor{epoch, 0}));
  Impl& m = *impl;
  std::vector<SampleId> out;
  auto id = [&](uint32_t k, uint64_t counter) {
    Impl::Member& mem = *m.members[k];
    absl::MutexLock lock(&m.mu);  // OrderFor's (uncontended: no workers run)
    const uint64_t sample = m.OrderFor(mem, counter / mem.epoch_len).SampleAt(counter % mem.epoch_len);
    const SampleIndex::Location at = mem.index.Locate(sample, counter / mem.epoch_len);
    return SampleId{sample, at.episode, at.step, k};
  };
  if (!source.is_mixture()) {  // positions do not depend on the batch size: all of them
    out.reserve(m.n);
    for (uint64_t p = 0; p < m.n; ++p) out.push_back(id(0, epoch * m.n + p));
    return out;
  }
  out.reserve(m.steps * m.batch);
  Impl::Walker w = m.WalkerAt(epoch, 0);
  for (uint64_t s = 0; s < m.steps; ++s, m.NextStep(&w)) {
    for (uint64_t p = 0; p < m.batch; ++p) {
      const uint32_t k = w.plan.member(p);
      out.push_back(id(k, w.base[k] + w.plan.rank(p)));
    }
  }
  return out;
}

std::vector<MixtureProgress> Pipeline::Mixture() const {
  const Impl& m = *impl_;
  uint64_t next_seq = 0;
  {
    absl::MutexLock lock(&m.mu);
    next_seq = m.next_seq;
  }
  const Cursor at = m.CursorOfBatch(next_seq / m.local);
  const std::vector<uint64_t> before =
      m.source.is_mixture() ? m.schedule->Before(at.epoch, at.step)
                            : std::vector<uint64_t>{at.epoch * m.n + *at.position};
  std::vector<MixtureProgress> out;
  for (size_t k = 0; k < m.members.size(); ++k) {
    MixtureProgress p;
    p.name = m.source.member(k).name;
    p.requested_share = static_cast<double>(m.schedule->quota(k)) /
                        (static_cast<double>(m.batch) * 4294967296.0);
    p.samples_per_epoch = m.members[k]->index.size();
    p.epochs = static_cast<double>(before[k]) / static_cast<double>(std::max<uint64_t>(1, m.members[k]->epoch_len));
    out.push_back(std::move(p));
  }
  return out;
}

uint64_t Pipeline::num_samples() const { return impl_->n; }
uint64_t Pipeline::steps_per_epoch() const { return impl_->steps; }
Cursor Pipeline::start() const { return impl_->CursorOfBatch(0); }
const PipelineOptions& Pipeline::options() const { return impl_->opt; }

void Pipeline::Cancel() {
  absl::MutexLock lock(&impl_->mu);
  impl_->CancelLocked();
}

absl::StatusOr<std::optional<Batch>> Pipeline::Next() {
  Impl& m = *impl_;
  std::vector<Sample> samples;
  std::vector<SampleId> skipped;
  uint64_t first = 0;
  {
    absl::MutexLock lock(&m.mu);
    first = m.next_seq;  // written only here, by the one consumer thread
  }
  const Cursor cursor = m.CursorOfBatch(first / m.local);
  if (m.opt.max_epochs > 0 && cursor.epoch >= m.opt.max_epochs) return std::nullopt;  // the end
  {
    absl::MutexLock lock(&m.mu);
    for (uint64_t seq = first; seq < first + m.local; ++seq) {
      const auto t0 = PipelineClock::now();
      while (!m.cancelled && m.results.count(seq) == 0) m.result_cv.Wait(&m.mu);
      m.stats.wait_seconds += Seconds(t0, PipelineClock::now());
      if (m.cancelled) {
        if (!m.fatal.ok()) return m.fatal;
        return absl::CancelledError("the pipeline was cancelled");
      }
      auto node = m.results.extract(seq);
      Impl::Result& r = node.mapped();
      m.results_bytes -= r.bytes;
      if (!r.sample.ok()) {
        if (m.spec.on_error == OnError::kSkip) {
          ++m.stats.skipped;
          spdlog::warn("sample skipped (on_error: skip) at cursor {}:{}: {}", cursor.epoch,
                       cursor.step, r.sample.status().ToString());
          continue;
        }
        return Annotate(r.sample.status(), StrCat("batch ", cursor.epoch, ":", cursor.step));
      }
      samples.push_back(std::move(*r.sample));
    }
    m.next_seq = first + m.local;
    if (cursor.step + 1 == m.steps) m.CountBoundary(cursor, first + m.local);
    m.work_cv.SignalAll();
  }
  const auto t0 = PipelineClock::now();
  absl::StatusOr<Batch> batch;
  double fill = 0;
  if (samples.empty()) {  // every sample of this slice was skipped: an empty batch keeps the cursor
    batch = Batch{};
    batch->buffer = HostBuffer::Allocate(0, false);
  } else if (m.opt.packing) {
    ASSIGN_OR_RETURN(std::vector<int64_t> tokens, CountTokens(samples, m.spec, *m.opt.packing));
    const PackPlan plan = PackBestFitDecreasing(tokens, m.opt.packing->max_tokens,
                                                m.opt.packing->window);
    fill = plan.fill_ratio();
    batch = PackSamples(std::move(samples), m.spec, *m.opt.packing, tokens, plan, m.opt.pinned,
                        m.batch_buffers, m.opt.threads);
  } else {
    batch = StackSamples(std::move(samples), m.spec, m.opt.pinned, m.batch_buffers, m.opt.threads);
  }
  if (!batch.ok()) return Annotate(batch.status(), StrCat("batch ", cursor.epoch, ":", cursor.step));
  batch->cursor = cursor;
  batch->next = m.CursorOfBatch(first / m.local + 1);
  batch->consumer = m.opt.consumer;
  batch->consumers = m.opt.consumers;
  absl::MutexLock lock(&m.mu);
  m.stats.batch_seconds += Seconds(t0, PipelineClock::now());
  ++m.stats.batches;
  m.stats.samples += batch->ids.size();
  for (const SampleId& id : batch->ids) {
    if (id.dataset < m.stats.member_samples.size()) ++m.stats.member_samples[id.dataset];
  }
  m.stats.bytes += batch->bytes();
  m.stats.fill_ratio_sum += fill;
  return std::optional<Batch>(std::move(*batch));
}

void Pipeline::SetBatchBuffers(BatchBuffers buffers) { impl_->batch_buffers = std::move(buffers); }

PipelineStats Pipeline::stats() const {
  Impl& m = *impl_;
  absl::MutexLock lock(&m.mu);
  PipelineStats s = m.stats;
  s.seconds = Seconds(m.created, PipelineClock::now());
  s.queue_bytes = m.prefetch_bytes + m.results_bytes;
  // Counted up to 4 batches (at least 64 samples): a server reads stats() after every batch under
  // the lock the workers take to hand in their samples, and a reorder buffer of small samples can
  // hold hundreds of thousands of them (walking them all made a served stream of 16 workers
  // deliver 0.1-0.25 of the pipeline; bench/RESULTS.md).
  const uint64_t limit = std::max<uint64_t>(4 * m.local, 64);
  for (auto it = m.results.find(m.next_seq);
       it != m.results.end() && it->first == m.next_seq + s.samples_ready && s.samples_ready < limit;
       ++it) {
    ++s.samples_ready;
  }
  for (const AssemblerStats& a : m.worker_stats) {
    s.frames_decoded += a.frames_decoded;
    s.frames_decoded_nvdec += a.frames_decoded_nvdec;
    s.frames_delivered += a.frames_delivered;
    s.prefetch_hits += a.prefetch_hits;
    s.prefetch_misses += a.prefetch_misses;
  }
  return s;
}

}  // namespace conveyor
