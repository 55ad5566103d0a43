// The pipeline's plan (pipeline/internal/pipeline_impl.h): what Create sets up before the workers
// start (options checked, schedule resolved, members and their sample indexes, the start cursor
// normalized), and the walk through the global positions that turns this consumer's slices of
// them into tasks, with each member's epoch orders built ahead by the planner thread.
#include <algorithm>
#include <iterator>
#include <tuple>

#include <spdlog/spdlog.h>

#include "base/status_macros.h"
#include "base/strings.h"
#include "pipeline/internal/pipeline_impl.h"
#include "pipeline/internal/spec_figures.h"
#include "shuffle/buckets.h"
#include "sample/quarantine.h"

namespace conveyor {

const EpochOrder& Pipeline::Impl::OrderFor(Member& m, uint64_t epoch) {
  auto it = m.orders.find(epoch);
  if (it == m.orders.end()) {
    if (m.order.blocks && !m.orders.empty()) ++stats.epoch_orders_built_late;
    it = KeepOrder(m, epoch, std::make_unique<EpochOrder>(m.index.size(), m.key, epoch, m.order));
  }
  return *it->second;
}

std::map<uint64_t, std::unique_ptr<EpochOrder>>::iterator Pipeline::Impl::KeepOrder(
    Member& m, uint64_t epoch, std::unique_ptr<EpochOrder> order) {
  m.orders.emplace(epoch, std::move(order));
  while (m.orders.size() > 3) m.orders.erase(m.orders.begin());
  return m.orders.find(epoch);
}

void Pipeline::Impl::PlanAhead(uint32_t k, uint64_t epoch) {
  Member& m = *members[k];
  // Without a BlockTable (naive, schedule version 1) an order is a KeyedPermutation: O(1).
  if (!m.order.blocks) return;
  if (!source.is_mixture() && opt.max_epochs > 0 && epoch >= opt.max_epochs) return;
  if (m.orders.count(epoch) || planning.count({k, epoch})) return;
  planning.insert({k, epoch});
  plans.emplace_back(k, epoch);
  plan_cv.Signal();
}

void Pipeline::Impl::Planner() {
  while (true) {
    uint32_t k = 0;
    uint64_t epoch = 0;
    {
      absl::MutexLock lock(&mu);
      while (!cancelled && plans.empty()) plan_cv.Wait(&mu);
      if (cancelled) return;
      std::tie(k, epoch) = plans.front();
      plans.pop_front();
    }
    Member& m = *members[k];
    auto order = std::make_unique<EpochOrder>(m.index.size(), m.key, epoch, m.order);
    absl::MutexLock lock(&mu);
    planning.erase({k, epoch});
    if (!m.orders.count(epoch)) {
      KeepOrder(m, epoch, std::move(order));
      ++stats.epoch_orders_planned_ahead;
    }
    work_cv.SignalAll();
  }
}

Pipeline::Impl::Walker Pipeline::Impl::WalkerAt(uint64_t epoch, uint64_t pos) const {
  Walker w;
  w.epoch = epoch;
  w.pos = pos;
  w.step = pos / batch;
  w.plan = schedule->At(w.epoch, w.step);
  w.base = source.is_mixture() ? schedule->Before(w.epoch, w.step)
                               : std::vector<uint64_t>{w.epoch * n + w.pos};
  return w;
}

void Pipeline::Impl::NextStep(Walker* w) const {
  for (size_t k = 0; k < w->base.size(); ++k) w->base[k] += w->plan.counts()[k];
  w->pos += batch;
  if (w->pos + batch > n) {
    w->pos = 0;
    ++w->epoch;
    if (!source.is_mixture()) w->base[0] = w->epoch * n;
  }
  w->step = w->pos / batch;
  w->plan = schedule->At(w->epoch, w->step);
}

Cursor Pipeline::Impl::CursorOfBatch(uint64_t k) const {
  Cursor c;
  if (k < first_epoch_steps) {
    c.epoch = start_epoch;
    c.position = start_pos + k * batch;
  } else {
    k -= first_epoch_steps;
    c.epoch = start_epoch + 1 + k / steps;
    c.position = (k % steps) * batch;
  }
  c.step = *c.position / batch;
  return c;
}

std::pair<uint32_t, uint64_t> Pipeline::Impl::PositionOf(const Walker& w, uint64_t j) const {
  const uint64_t p = opt.consumer * local + j;
  const uint32_t k = w.plan.member(p);
  return {k, w.base[k] + w.plan.rank(p)};
}

void Pipeline::Impl::RegisterWindow(const WindowKey& key, const EpochOrder& order) {
  Member& m = *members[key.member];
  const uint64_t first = key.epoch * m.epoch_len + order.WindowBegin(key.w);
  const uint64_t last = key.epoch * m.epoch_len + std::min(order.WindowEnd(key.w), m.epoch_len);
  std::map<uint64_t, std::vector<uint64_t>> blocks;  // block -> samples
  uint64_t count = 0;
  for (Walker w = gen; w.base[key.member] < last; NextStep(&w)) {
    if (opt.max_epochs > 0 && w.epoch >= opt.max_epochs) break;
    for (uint64_t j = 0; j < local; ++j) {
      const auto [k, c] = PositionOf(w, j);
      if (k != key.member || c < first || c >= last) continue;
      const uint64_t sample = order.SampleAt(c - key.epoch * m.epoch_len);
      blocks[order.BlockOf(sample)].push_back(sample);
      ++count;
    }
  }
  Window& win = windows[key];
  win.prefetch_left += static_cast<int>(blocks.size());
  win.samples_left += count;
  for (auto& [block, list] : blocks) {
    Task t;
    t.prefetch = true;
    t.member = key.member;
    t.window = key;
    std::sort(list.begin(), list.end());
    t.block_samples = std::move(list);
    pending.push_back(std::move(t));
  }
}

bool Pipeline::Impl::Generate() {
  if (gen_done) return true;
  if (opt.max_epochs > 0 && gen.epoch >= opt.max_epochs) {
    gen_done = true;
    return true;
  }
  for (uint64_t j = 0; j < local; ++j) {
    const auto [k, c] = PositionOf(gen, j);
    const uint64_t e = c / members[k]->epoch_len;
    if (!members[k]->orders.count(e) && planning.count({k, e})) return false;
  }
  std::vector<Task> tasks(local);
  for (uint64_t j = 0; j < local; ++j) {
    Task& t = tasks[j];
    const auto [k, c] = PositionOf(gen, j);
    Member& m = *members[k];
    t.seq = gen.seq + j;
    t.member = k;
    t.counter = c;
    t.member_epoch = c / m.epoch_len;
    t.sample = OrderFor(m, t.member_epoch).SampleAt(c % m.epoch_len);
    PlanAhead(k, t.member_epoch + 1);
  }
  std::sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) {
    return a.member != b.member ? a.member < b.member : a.counter < b.counter;
  });
  for (Task& t : tasks) {
    Member& m = *members[t.member];
    if (m.scheduled) {
      const EpochOrder& order = OrderFor(m, t.member_epoch);
      t.window = WindowKey{t.member, t.member_epoch, order.WindowOf(t.counter % m.epoch_len)};
      if (windows.find(t.window) == windows.end()) RegisterWindow(t.window, order);
    }
    pending.push_back(std::move(t));
  }
  gen.seq += local;
  NextStep(&gen);
  return true;
}

bool Pipeline::Impl::PrefetchMayStart(const Task& t) const {
  size_t older = 0;
  for (auto it = windows.lower_bound(WindowKey{t.member, 0, 0}); it != windows.end() && it->first < t.window;
       ++it) {
    ++older;
  }
  return older <= 1;
}

bool Pipeline::Impl::TakeLaterPrefetch(Task* out) {
  constexpr int kLookaheadSteps = 64;
  for (int generated = 0;; ++generated) {
    for (auto it = std::next(pending.begin()); it != pending.end(); ++it) {
      if (!it->prefetch) continue;
      if (!PrefetchMayStart(*it)) return false;
      *out = std::move(*it);
      pending.erase(it);
      return true;
    }
    if (gen_done || generated >= kLookaheadSteps || !Generate()) return false;
  }
}

bool Pipeline::Impl::TakeTask(Task* out, double* idle) {
  while (true) {
    if (cancelled) return false;
    if (pending.empty() && !Generate()) {  // waits for an order in the making
      const auto t0 = PipelineClock::now();
      work_cv.Wait(&mu);
      *idle += Seconds(t0, PipelineClock::now());
      continue;
    }
    if (pending.empty()) return false;  // max_epochs reached
    Task& front = pending.front();
    const bool ok = front.prefetch ? PrefetchMayStart(front) : front.seq < next_seq + max_inflight;
    // A sample whose window is still being decoded by other workers would only wait: decode a
    // block of the next window meanwhile (the tail of a window's prefetch otherwise leaves
    // workers idle at every window boundary). Which worker runs what never changes a byte.
    if (ok && !front.prefetch && members[front.member]->scheduled &&
        windows[front.window].prefetch_left != 0 && TakeLaterPrefetch(out)) {
      return true;
    }
    if (ok) {
      *out = std::move(front);
      pending.pop_front();
      return true;
    }
    const auto t0 = PipelineClock::now();
    work_cv.Wait(&mu);
    *idle += Seconds(t0, PipelineClock::now());
  }
}

void Pipeline::Impl::CountBoundary(Cursor last, uint64_t next_seq) {
  if (opt.max_epochs > 0 && last.epoch + 1 >= opt.max_epochs) return;  // no next epoch
  ++stats.epoch_boundaries;
  const Walker w = WalkerAt(last.epoch + 1, 0);
  bool planned = true;
  for (uint64_t j = 0; j < local; ++j) {
    const auto [k, c] = PositionOf(w, j);
    planned = planned && members[k]->orders.count(c / members[k]->epoch_len) > 0;
    stats.next_epoch_samples_ready += results.count(next_seq + j);
  }
  if (planned) ++stats.boundaries_planned_ahead;
}
absl::Status Pipeline::Impl::AddMember(size_t k, BoundMember bound) {
  auto mem = std::make_unique<Member>();
  mem->dataset = &source.dataset(k);
  mem->bound = std::move(bound);
  ASSIGN_OR_RETURN(std::set<uint64_t> quarantined,
                   QuarantinedEpisodes(mem->bound.spec, *mem->dataset));
  mem->key = OrderKey(mem->dataset->manifest().fingerprint, opt.seed);
  ASSIGN_OR_RETURN(mem->index, SampleIndex::Build(*mem->dataset, mem->bound.spec.anchor_stream,
                                                  quarantined, mem->bound.spec.clips, mem->key));
  if (!quarantined.empty()) RETURN_IF_ERROR(CountQuarantine(*mem, quarantined));
  if (mem->index.short_episodes() > 0) {
    const ClipSampling& c = mem->bound.spec.clips;
    spdlog::warn("clips: {} episode(s) of {} are shorter than a clip ({} anchor steps): their clips "
                 "start at the first step and are padded (<stream>_is_pad)",
                 mem->index.short_episodes(), mem->dataset->uri(),
                 uint64_t{c.back_steps} + c.forward_steps + 1);
  }
  if (source.is_mixture() && mem->index.size() == 0) {
    return absl::InvalidArgumentError(StrCat("mixture dataset '", source.member(k).name,
                                             "' has no samples for anchor '", spec.anchor, "'"));
  }
  mem->order = source.is_mixture() ? opt.member_orders[k] : opt.order;
  // The pipeline version also decides how audio is decoded (docs/pipeline.md "Schedule
  // versions"): a job resumed under version 1 or 2 keeps its per-window audio.
  mem->bound.spec.audio_method =
      mem->order.version >= 3 ? AudioMethod::kChunks : AudioMethod::kPerWindow;
  // Likewise where video crops are cut: a job resumed under version 1 to 3 crops from RGB.
  mem->bound.spec.crop_method =
      mem->order.version >= 4 ? CropMethod::kInDecoder : CropMethod::kFromRgb;
  mem->scheduled = HasVideo(mem->bound.spec) && !mem->order.naive();
  if (opt.frame_cache) {
    mem->frame_cache_key = FrameCacheDatasetKey(mem->dataset->manifest());
    opt.frame_cache->NameDataset(mem->frame_cache_key, mem->dataset->uri());
  }
  mem->prefetch.impl = this;
  mem->prefetch.member = static_cast<uint32_t>(k);
  n += mem->index.size();
  members.push_back(std::move(mem));
  return absl::OkStatus();
}

absl::Status Pipeline::Impl::CountQuarantine(const Member& mem, const std::set<uint64_t>& quarantined) {
  // Never silent: the count is in the stats, and the log names the file and the episodes.
  ASSIGN_OR_RETURN(SampleIndex whole, SampleIndex::Build(*mem.dataset, mem.bound.spec.anchor_stream,
                                                         {}, mem.bound.spec.clips, mem.key));
  const uint64_t samples = whole.size() - mem.index.size();
  {
    absl::MutexLock lock(&mu);
    stats.quarantined_episodes += quarantined.size();
    stats.quarantined_samples += samples;
  }
  std::string list;
  for (uint64_t e : quarantined) StrAppend(&list, list.empty() ? "" : " ", e);
  spdlog::warn("quarantine {}: {} episode(s) of {} left out ({} samples per epoch): {}",
               mem.bound.spec.quarantine, quarantined.size(), mem.dataset->uri(), samples, list);
  return absl::OkStatus();
}

absl::Status Pipeline::Impl::PlaceStart(const Cursor& start) {
  if (start.position) {
    if (*start.position > n) {
      return absl::OutOfRangeError(StrCat("cursor ", start.ToString(), " is past the end of the "
                                          "epoch: an epoch has ", n, " sample positions (0..",
                                          n - 1, ")"));
    }
    if (source.is_mixture() && *start.position % batch != 0) {
      return absl::InvalidArgumentError(StrCat(
          "cursor ", start.ToString(), " is not at a batch boundary of this mixture (global_batch_size ",
          batch, "): a mixture's order is laid out per global batch, so a mixture resumes only at "
          "the global batch size its cursor was recorded with (docs/mixtures.md)"));
    }
    start_epoch = start.epoch;
    start_pos = *start.position;
    if (start_pos + batch > n) {  // no whole batch left in the epoch
      ++start_epoch;
      start_pos = 0;
    }
  } else {
    if (start.step >= steps) {
      return absl::OutOfRangeError(StrCat("cursor ", start.epoch, ":", start.step, " is past the end "
                                          "of the epoch: an epoch has ", steps, " steps (0..",
                                          steps - 1, ")"));
    }
    start_epoch = start.epoch;
    start_pos = start.step * batch;
  }
  if (opt.max_epochs > 0 && start_epoch >= opt.max_epochs) {
    return absl::OutOfRangeError(StrCat("cursor ", start.ToString(),
                                        " is past the last epoch (max_epochs ", opt.max_epochs, ")"));
  }
  first_epoch_steps = (n - start_pos) / batch;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Pipeline::Impl>> Pipeline::Prepare(const Source& source,
                                                                   const SampleSpec& spec,
                                                                   PipelineOptions options,
                                                                   Cursor start) {
  auto impl = std::make_unique<Impl>(source, spec, std::move(options));
  Impl& m = *impl;
  PipelineOptions& o = m.opt;
  if (o.consumers == 0 || o.consumer >= o.consumers) {
    return absl::InvalidArgumentError(StrCat("consumer index ", o.consumer, " is out of range for ",
                                             o.consumers, " consumers (0 <= consumer < consumers)"));
  }
  if (o.global_batch_size == 0 || o.global_batch_size % o.consumers != 0) {
    return absl::InvalidArgumentError(
        StrCat("global_batch_size ", o.global_batch_size, " is not a multiple of the ", o.consumers,
               " consumers: each consumer gets global_batch_size / consumers samples per step"));
  }
  RETURN_IF_ERROR(ResolveSchedule(source, m.spec, &o));
  ASSIGN_OR_RETURN(std::vector<BoundMember> bound, source.Bind(m.spec));
  if (source.is_mixture()) {
    ASSIGN_OR_RETURN(m.layout, source.Layout(m.spec, bound));
  }
  m.batch = o.global_batch_size;
  m.local = m.batch / o.consumers;
  for (size_t k = 0; k < source.size(); ++k) RETURN_IF_ERROR(m.AddMember(k, std::move(bound[k])));
  m.steps = m.n / m.batch;
  if (m.steps == 0) {
    return absl::InvalidArgumentError(StrCat("the dataset has ", m.n, " samples, fewer than one "
                                             "global batch of ", m.batch));
  }
  // A member's counter c is sample position c % epoch_len of its epoch c / epoch_len: a mixture
  // member runs through all of its samples, epoch after epoch; so does a single dataset, whose
  // walk skips an epoch's last positions that do not fill a batch (NextStep).
  for (auto& mem : m.members) mem->epoch_len = mem->index.size();
  if (o.order.buckets) {
    // The whole groups of each bucket (shuffle/buckets.h): an epoch is a whole number of batches.
    m.n = o.order.buckets->EpochSize(o.order.bucket_group);
    m.members[0]->epoch_len = m.n;
    m.steps = m.n / m.batch;
    if (m.steps == 0) {
      return absl::InvalidArgumentError(StrCat(
          "buckets: no bucket has a whole group of ", o.order.bucket_group, " samples (",
          m.members[0]->index.size(), " samples in ", o.order.buckets->num_buckets(),
          " buckets): use fewer buckets or a smaller group"));
    }
    if (start.position && *start.position % m.batch != 0) {
      return absl::InvalidArgumentError(StrCat(
          "cursor ", start.ToString(), " is not at a batch boundary (global_batch_size ", m.batch,
          "): with buckets a batch must lie inside one group; resume at a position that is a "
          "multiple of a global_batch_size dividing buckets.group (docs/sampling.md \"Buckets\")"));
    }
  }
  RETURN_IF_ERROR(m.PlaceStart(start));
  ASSIGN_OR_RETURN(MixtureSchedule schedule,
                   MixtureSchedule::Create(source.weights(), m.batch, m.steps,
                                           OrderKey(source.manifest().fingerprint, o.seed)));
  m.schedule = std::move(schedule);
  return impl;
}

}  // namespace conveyor
