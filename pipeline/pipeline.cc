#include "pipeline/pipeline.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "absl/synchronization/mutex.h"
#include "base/cancel.h"
#include "base/worker_pool.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "sample/quarantine.h"
#include "sample/tokenizer.h"
#include "sample/yaml_config.h"
#include "shuffle/buckets.h"
#include "shuffle/mixture.h"
#include "shuffle/schedule.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Bytes of one sample's tensors, from the spec and the manifest (text counted as 256 bytes, or
// 256 token ids without a max_tokens).
uint64_t EstimateSampleBytes(const SampleSpec& spec, const Manifest& m) {
  uint64_t total = 0;
  for (const StreamSpec& s : spec.streams) {
    const StreamInfo& info = m.streams[s.stream];
    switch (s.kind) {
      case pb::VIDEO:
      case pb::IMAGE: {
        int64_t h = s.height, w = s.width;
        if (h == 0 && info.shape.size() >= 2) {
          h = std::max(info.shape[0], info.shape[1]);  // rotation may swap them
          w = h;
        }
        for (const BucketSize& b : spec.buckets.sizes) {  // the largest bucket
          if (int64_t{b.height} * b.width > h * w) h = b.height, w = b.width;
        }
        total += s.deltas.size() * static_cast<uint64_t>(h * w * 3) *
                 (s.dtype == ImageDType::kFloat32 ? 4 : 1);
        total += s.deltas.size();
        break;
      }
      case pb::LOWDIM:
        total += s.deltas.size() * (info.shape.empty() ? 1 : info.shape[0]) * 4 + s.deltas.size();
        break;
      case pb::AUDIO: {
        const double rate = s.audio_rate > 0 ? s.audio_rate : info.rate;
        const uint64_t n = static_cast<uint64_t>(std::llround((s.window_end - s.window_start) * rate));
        const int64_t ch = s.audio_channels > 0 ? s.audio_channels : (info.shape.empty() ? 1 : info.shape[0]);
        total += n * ch * 4 + n;
        break;
      }
      default:  // text: 256 bytes, or its token ids (4 bytes each) up to the tokenizer's cap
        if (s.tokenizer != nullptr) {
          const int64_t cap = s.tokenizer->options().max_tokens;
          total += 4 * static_cast<uint64_t>(cap > 0 ? cap : 256);
        } else {
          total += 256;
        }
    }
  }
  return std::max<uint64_t>(total, 1);
}

}  // namespace

absl::Status PipelineOptions::MergeYaml(std::string_view yaml, const SampleSpec& spec,
                                        const Manifest& manifest, std::string_view source) {
  ASSIGN_OR_RETURN(YAML::Node root, yaml::Load(yaml, source));
  if (!root.IsMap()) return absl::OkStatus();
  try {
    if (const YAML::Node p = root["pipeline"]) {
      RETURN_IF_ERROR(yaml::CheckKeys(source, p, "pipeline",
                                      {"seed", "global_batch_size", "threads", "queue_bytes",
                                       "schedule", "max_epochs"}));
      // Ceilings that keep config arithmetic far from overflow (and a typo from asking for a
      // billion threads); a server applies its own, lower ceilings on top (server/server.h).
      auto uint = [&](const char* key, uint64_t min, uint64_t max, uint64_t* out) -> absl::Status {
        if (!p[key]) return absl::OkStatus();
        int64_t v = 0;
        try {
          v = p[key].as<int64_t>();
        } catch (const YAML::Exception&) {
          return yaml::ConfigError(source, p[key], StrCat("pipeline.", key, " must be an integer"));
        }
        if (v < static_cast<int64_t>(min) || static_cast<uint64_t>(v) > max) {
          return yaml::ConfigError(source, p[key], StrCat("pipeline.", key, " is ", v,
                                                          "; it must be in [", min, ", ", max, "]"));
        }
        *out = static_cast<uint64_t>(v);
        return absl::OkStatus();
      };
      constexpr uint64_t kAny = std::numeric_limits<int64_t>::max();
      RETURN_IF_ERROR(uint("seed", 0, kAny, &seed));
      RETURN_IF_ERROR(uint("global_batch_size", 1, kMaxGlobalBatchSize, &global_batch_size));
      RETURN_IF_ERROR(uint("queue_bytes", 1 << 20, kMaxQueueBytes, &queue_bytes));
      RETURN_IF_ERROR(uint("max_epochs", 0, kAny, &max_epochs));
      uint64_t t = static_cast<uint64_t>(threads);
      RETURN_IF_ERROR(uint("threads", 0, kMaxThreads, &t));
      threads = static_cast<int>(t);
      if (const YAML::Node s = p["schedule"]) {
        schedule_given = true;
        RETURN_IF_ERROR(yaml::CheckKeys(source, s, "pipeline.schedule",
                                        {"mode", "block_steps", "window_blocks", "version"}));
        uint32_t version = kScheduleVersionCurrent;
        if (s["version"]) {
          int64_t v = 0;
          try {
            v = s["version"].as<int64_t>();
          } catch (const YAML::Exception&) {
            v = -1;
          }
          if (v < 1 || v > kScheduleVersionCurrent) {
            return yaml::ConfigError(source, s["version"],
                                     "pipeline.schedule.version must be 1 (blocks of block_steps samples, "
                                     "as before 2026-11), 2 (whole GOPs per episode), 3 (version 2's "
                                     "order, audio decoded in chunks) or 4 (version 3, video crops cut "
                                     "in the decoder)");
          }
          version = static_cast<uint32_t>(v);
        }
        std::string mode = "gop";
        if (s["mode"]) mode = s["mode"].as<std::string>();
        if (mode != "naive" && mode != "gop") {
          return yaml::ConfigError(source, s["mode"], StrCat("pipeline.schedule.mode is '", mode,
                                                     "'; expected naive or gop"));
        }
        if (mode == "naive") {
          order = OrderOptions{};
          order.version = version;
        } else {
          order = OrderOptions{};
          order.version = version;
          order.block_steps = 0;  // 0 = auto, resolved in Create
          order.window_blocks = 0;
          auto sub = [&](const char* key, uint64_t* out) -> absl::Status {
            if (!s[key]) return absl::OkStatus();
            int64_t v = 0;
            try {
              v = s[key].as<int64_t>();
            } catch (const YAML::Exception&) {
              return yaml::ConfigError(source, s[key], StrCat("pipeline.schedule.", key, " must be an integer"));
            }
            if (v < 1 || static_cast<uint64_t>(v) > kMaxScheduleValue) {
              return yaml::ConfigError(source, s[key], StrCat("pipeline.schedule.", key, " is ", v,
                                                              "; it must be in [1, ", kMaxScheduleValue, "]"));
            }
            *out = static_cast<uint64_t>(v);
            return absl::OkStatus();
          };
          RETURN_IF_ERROR(sub("block_steps", &order.block_steps));
          RETURN_IF_ERROR(sub("window_blocks", &order.window_blocks));
        }
      }
    }
    if (const YAML::Node pk = root["packing"]) {
      ASSIGN_OR_RETURN(PackingSpec ps, PackingSpec::FromYaml(pk, spec, source, &manifest));
      if (ps.enabled) {
        packing = std::move(ps);
      } else {
        packing.reset();
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": ", e.msg));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

struct Pipeline::Impl {
  // Where a sample sits in its member's own sequence: member counter c -> (member epoch, position).
  struct WindowKey {
    uint32_t member = 0;
    uint64_t epoch = 0;  // the member's epoch
    uint64_t w = 0;
    auto operator<=>(const WindowKey&) const = default;
  };
  struct Task {
    bool prefetch = false;
    uint64_t seq = 0;        // sample tasks: output order
    uint32_t member = 0;
    uint64_t member_epoch = 0;
    uint64_t counter = 0;    // the member's sample counter (sorting within a step)
    WindowKey window;        // the window whose frames it needs or fills
    uint64_t sample = 0;
    std::vector<uint64_t> block_samples;  // prefetch: this consumer's samples of one block
  };
  struct Window {
    int prefetch_left = 0;
    uint64_t samples_left = 0;
    uint64_t bytes = 0;
    std::unordered_map<uint64_t, std::shared_ptr<const RgbImage>> frames;
  };
  struct Result {
    absl::StatusOr<Sample> sample;
    uint64_t bytes = 0;
  };
  // The frames of one member's windows, as its assemblers look them up.
  struct MemberPrefetch : public WindowPrefetch {
    const Impl* impl = nullptr;
    uint32_t member = 0;
    std::shared_ptr<const RgbImage> Find(uint64_t episode, int stream, int64_t frame) const override {
      absl::MutexLock lock(&impl->mu);
      const uint64_t k = FrameKey(episode, stream, frame);
      for (auto it = impl->windows.lower_bound(WindowKey{member, 0, 0});
           it != impl->windows.end() && it->first.member == member; ++it) {
        auto f = it->second.frames.find(k);
        if (f != it->second.frames.end()) return f->second;
      }
      return nullptr;
    }
  };
  struct Member {
    const Dataset* dataset = nullptr;
    BoundMember bound;
    SampleIndex index;
    OrderOptions order;
    uint64_t key = 0;
    std::string frame_cache_key;  // FrameCacheDatasetKey (empty without a frame cache)
    uint64_t epoch_len = 0;  // samples of one of its epochs in the sequence it feeds
    bool scheduled = false;
    MemberPrefetch prefetch;
    std::map<uint64_t, std::unique_ptr<EpochOrder>> orders;  // by member epoch; Impl::mu (OrderFor)
  };
  // This consumer's walk through the global positions, one global batch at a time: the batch
  // starts at sample position `pos` of epoch `epoch` (step = pos / batch).
  struct Walker {
    uint64_t epoch = 0, step = 0, pos = 0, seq = 0;
    MixtureSchedule::Step plan;
    std::vector<uint64_t> base;  // each member's counter at the start of this step
  };

  std::unique_ptr<Source> owned_source;
  const Source& source;
  SampleSpec spec;
  PipelineOptions opt;
  BatchBuffers batch_buffers;  // Next() only: where batches are built (null: HostBuffers)
  std::vector<SharedStream> layout;
  std::vector<std::unique_ptr<Member>> members;
  std::optional<MixtureSchedule> schedule;
  uint64_t n = 0, batch = 0, local = 0, steps = 0;
  uint64_t max_inflight = 0;
  // Where this pipeline's first batch starts: sample position start_pos of epoch start_epoch (the
  // start cursor normalized: a position with no whole batch left in its epoch is the next epoch's
  // 0), and how many batches its first epoch has from there.
  uint64_t start_epoch = 0, start_pos = 0, first_epoch_steps = 0;
  Clock::time_point created = Clock::now();

  // Everything below that workers and the consumer share is guarded by `mu` (checked by clang's
  // -Wthread-safety in ./run test); the fields above are set before the workers start.
  mutable absl::Mutex mu;
  absl::CondVar work_cv;    // workers: a task or budget became available
  absl::CondVar result_cv;  // Next(): a result arrived
  absl::CondVar window_cv;  // sample tasks: a window's frames are ready
  absl::CondVar plan_cv;    // the planner: an epoch order to build
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  absl::Status fatal ABSL_GUARDED_BY(mu);  // a worker failed outside any one sample: the pipeline is over
  Walker gen ABSL_GUARDED_BY(mu);          // the next global batch to turn into tasks
  bool gen_done ABSL_GUARDED_BY(mu) = false;
  std::deque<Task> pending ABSL_GUARDED_BY(mu);
  // Epoch orders to build ahead, off the lock (PlanAhead): queued, and queued or being built.
  std::deque<std::pair<uint32_t, uint64_t>> plans ABSL_GUARDED_BY(mu);  // (member, member epoch)
  std::set<std::pair<uint32_t, uint64_t>> planning ABSL_GUARDED_BY(mu);
  std::map<WindowKey, Window> windows ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Result> results ABSL_GUARDED_BY(mu);  // by seq
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;                // the next sample Next() hands out
  uint64_t results_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t prefetch_bytes ABSL_GUARDED_BY(mu) = 0;
  PipelineStats stats ABSL_GUARDED_BY(mu);
  std::vector<AssemblerStats> worker_stats ABSL_GUARDED_BY(mu);
  // The workers (base/worker_pool.h): its flag is the cancellation of their blocking reads.
  std::unique_ptr<WorkerPool> pool;
  // One thread that builds epoch orders ahead (PlanAhead); null when no member has GOP blocks.
  std::unique_ptr<WorkerPool> planner;

  Impl(const Source& src, SampleSpec s, PipelineOptions o)
      : source(src), spec(std::move(s)), opt(std::move(o)) {}
  ~Impl() { Stop(); }

  // Wakes every waiter; the workers' blocking reads give up (mu held).
  void CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    cancelled = true;
    if (pool) pool->Cancel();
    work_cv.SignalAll();
    result_cv.SignalAll();
    window_cv.SignalAll();
    plan_cv.SignalAll();
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu);
      CancelLocked();
    }
    pool.reset();  // joins
    planner.reset();
  }

  static uint64_t FrameKey(uint64_t episode, int stream, int64_t frame) {
    return (episode << 24) ^ (static_cast<uint64_t>(stream) << 56) ^ static_cast<uint64_t>(frame);
  }

  // Member m's order of `epoch`, built here when the planner did not build it first (mu held:
  // every worker and the consumer wait meanwhile, so only a pipeline's first epoch should come
  // this way; later ones are planned ahead, PlanAhead). An order costs O(blocks) to build: about 0.2 s for 300,000 GOP
  // blocks, 1 s for 3 million (a large LeRobot dataset with GOP 2).
  const EpochOrder& OrderFor(Member& m, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = m.orders.find(epoch);
    if (it == m.orders.end()) {
      if (m.order.blocks && !m.orders.empty()) ++stats.epoch_orders_built_late;
      it = KeepOrder(m, epoch, std::make_unique<EpochOrder>(m.index.size(), m.key, epoch, m.order));
    }
    return *it->second;
  }

  // Keeps the three latest epochs' orders of a member: the walker never needs an older one (its
  // member counters only grow, and the planner is never more than one epoch past them).
  std::map<uint64_t, std::unique_ptr<EpochOrder>>::iterator KeepOrder(
      Member& m, uint64_t epoch, std::unique_ptr<EpochOrder> order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    m.orders.emplace(epoch, std::move(order));
    while (m.orders.size() > 3) m.orders.erase(m.orders.begin());
    return m.orders.find(epoch);
  }

  // No epoch-boundary gap (issue 30 item 3): when the walker enters a member's epoch, the order
  // of its next epoch is queued for the planner thread to build without the lock, long before the
  // walker needs it; the walker waits for a plan in flight rather than building it again
  // (Generate). A thread of its own rather than a worker's task: at one worker thread, a worker
  // building a large order would stop decoding for as long (0.25 s per million blocks here).
  void PlanAhead(uint32_t k, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Member& m = *members[k];
    // Without a BlockTable (naive, schedule version 1) an order is a KeyedPermutation: O(1).
    if (!m.order.blocks) return;
    if (!source.is_mixture() && opt.max_epochs > 0 && epoch >= opt.max_epochs) return;
    if (m.orders.count(epoch) || planning.count({k, epoch})) return;
    planning.insert({k, epoch});
    plans.emplace_back(k, epoch);
    plan_cv.Signal();
  }

  // The planner thread: builds each queued order (no lock held while it is built) and hands it
  // to the walker.
  void Planner() {
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

  // A mixture's positions are whole batches (Create checks), so (epoch, step) places it; a single
  // dataset's member counter is epoch * n + position, at any position.
  Walker WalkerAt(uint64_t epoch, uint64_t pos) const {
    Walker w;
    w.epoch = epoch;
    w.pos = pos;
    w.step = pos / batch;
    w.plan = schedule->At(w.epoch, w.step);
    w.base = source.is_mixture() ? schedule->Before(w.epoch, w.step)
                                 : std::vector<uint64_t>{w.epoch * n + w.pos};
    return w;
  }

  // The next global batch: `batch` positions on, or the next epoch's first when fewer than
  // `batch` positions are left (the epoch's remainder is dropped).
  void NextStep(Walker* w) const {
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

  // The cursor of this pipeline's k-th batch (k = 0: the first), with its position.
  Cursor CursorOfBatch(uint64_t k) const {
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

  // The member and member counter of this consumer's j-th position in the walker's step.
  std::pair<uint32_t, uint64_t> PositionOf(const Walker& w, uint64_t j) const {
    const uint64_t p = opt.consumer * local + j;
    const uint32_t k = w.plan.member(p);
    return {k, w.base[k] + w.plan.rank(p)};
  }

  // Registers member k's window `key` and queues the prefetch of the frames this consumer's
  // samples of it need (mu held). Walks ahead from the current step to find those samples; the
  // walk stops once the member's counter passes the window's end.
  void RegisterWindow(const WindowKey& key, const EpochOrder& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
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

  // Turns this consumer's slice of the next global batch into tasks (mu held), each member's
  // samples in the order of its own sequence, so that its windows come in order; a window's
  // prefetch goes before its first sample.
  // False when the step needs an epoch order that the planner is still building (nothing
  // generated: wait for it).
  bool Generate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
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

  // At most two windows of a member hold frames: the one being assembled and the next.
  bool PrefetchMayStart(const Task& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    size_t older = 0;
    for (auto it = windows.lower_bound(WindowKey{t.member, 0, 0}); it != windows.end() && it->first < t.window;
         ++it) {
      ++older;
    }
    return older <= 1;
  }

  // The first prefetch task after the front, generating up to kLookaheadSteps steps ahead to find
  // one, taken when it may start.
  bool TakeLaterPrefetch(Task* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
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

  // Blocks until a task may run (mu held; released while it waits). False when cancelled or done.
  bool TakeTask(Task* out, double* idle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (true) {
      if (cancelled) return false;
      if (pending.empty() && !Generate()) {  // waits for an order in the making
        const auto t0 = Clock::now();
        work_cv.Wait(&mu);
        *idle += Seconds(t0, Clock::now());
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
      const auto t0 = Clock::now();
      work_cv.Wait(&mu);
      *idle += Seconds(t0, Clock::now());
    }
  }

  // A worker never lets an exception escape (it would terminate the process and every other
  // stream with it): a throw while assembling a sample becomes that sample's error; anything
  // else ends this pipeline with `fatal`, which Next() returns.
  // Runs under the pool's CancelScope: Cancel() aborts this worker's storage reads in flight.
  void Worker(size_t id) {
    try {
      WorkerLoop(id);
    } catch (const std::exception& e) {
      Fail(absl::InternalError(StrCat("pipeline worker ", id, " failed: ", e.what())));
    } catch (...) {
      Fail(absl::InternalError(StrCat("pipeline worker ", id, " failed with an unknown exception")));
    }
  }

  void Fail(absl::Status s) {
    absl::MutexLock lock(&mu);
    if (fatal.ok()) fatal = std::move(s);
    CancelLocked();
  }

  absl::StatusOr<Sample> AssembleNoThrow(SampleAssembler& assembler, const Task& task) const {
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

  // A block task's frames, decoded once or taken from the decoded-frame cache.
  struct DecodedBlock {
    std::vector<std::pair<uint64_t, std::shared_ptr<const RgbImage>>> frames;  // by FrameKey
    uint64_t from_cache = 0;         // frames the decoded-frame cache had
    uint64_t decoded_for_cache = 0;  // frames decoded and offered to it
    bool all_cached = true;          // no frame of the block was decoded
    bool empty = true;               // the block's samples need no frame
  };

  // Decodes the union of the frames a block's samples need, per (episode, stream), in one pass
  // each; frames the decoded-frame cache holds are not decoded. No lock held: a sample whose
  // frames fail here reports the error when it is assembled.
  DecodedBlock DecodeBlock(SampleAssembler& assembler, const Task& task,
                           std::vector<FrameRequest>* needed, std::vector<RgbImage>* images) {
    std::map<std::pair<uint64_t, size_t>, FrameRequest> merged;
    for (uint64_t s : task.block_samples) {
      if (!assembler.NeededFrames(s, task.member_epoch, needed).ok()) continue;  // the sample task reports it
      for (FrameRequest& r : *needed) {
        FrameRequest& m = merged[{r.episode, r.spec_stream}];
        m.episode = r.episode;
        m.spec_stream = r.spec_stream;
        m.stream = r.stream;
        m.frames.insert(m.frames.end(), r.frames.begin(), r.frames.end());
      }
    }
    DecodedBlock out;
    out.empty = merged.empty();
    for (auto& [k, r] : merged) {
      std::sort(r.frames.begin(), r.frames.end());
      r.frames.erase(std::unique(r.frames.begin(), r.frames.end()), r.frames.end());
      if (TakeCachedFrames(task.member, assembler, r, &out.frames)) {
        out.from_cache += r.frames.size();
        continue;
      }
      out.all_cached = false;
      if (opt.frame_cache) LendPrefaultedBuffers(task.member, r, images);
      if (!assembler.DecodeFrames(r, images).ok()) continue;  // the sample task reports it
      for (size_t i = 0; i < r.frames.size(); ++i) {
        auto img = std::make_shared<const RgbImage>(std::move((*images)[i]));
        if (opt.frame_cache) {
          opt.frame_cache->Insert(CacheKey(task.member, assembler, r, r.frames[i]), img);
          ++out.decoded_for_cache;
        }
        out.frames.emplace_back(FrameKey(r.episode, r.stream, r.frames[i]), std::move(img));
      }
    }
    return out;
  }

  // Decodes the frames the cache will keep into its pre-faulted buffers when it has them
  // (DecodedFrameCache::Prefault), so that keeping them costs this worker no page faults.
  void LendPrefaultedBuffers(uint32_t member, const FrameRequest& r, std::vector<RgbImage>* images) const {
    const Member& m = *members[member];
    const StreamSpec& s = m.bound.spec.streams[r.spec_stream];
    const uint64_t bytes = DecodedFrameBytes(s, m.dataset->manifest().streams[s.stream]);
    if (bytes == 0) return;
    if (images->size() < r.frames.size()) images->resize(r.frames.size());
    for (size_t i = 0; i < r.frames.size(); ++i) {
      std::vector<uint8_t>& px = (*images)[i].pixels;
      if (px.size() == bytes) continue;
      std::vector<uint8_t> b = opt.frame_cache->TakeBuffer(bytes);
      if (b.empty()) return;  // the pool is spent
      px = std::move(b);
    }
  }

  // Puts a decoded block's frames into its window's prefetch, counts them, and wakes the window's
  // sample tasks when it was the window's last block.
  void AddToWindow(const Task& task, DecodedBlock* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    stats.frame_cache_hits += block->from_cache;
    stats.frame_cache_misses += block->decoded_for_cache;
    if (opt.frame_cache && block->all_cached && !block->empty) ++stats.blocks_from_frame_cache;
    Window& w = windows[task.window];
    for (auto& [k, img] : block->frames) {
      if (w.frames.emplace(k, img).second) {
        w.bytes += img->pixels.size();
        prefetch_bytes += img->pixels.size();
      }
    }
    stats.prefetch_bytes_peak = std::max(stats.prefetch_bytes_peak, prefetch_bytes);
    stats.queue_bytes_peak = std::max(stats.queue_bytes_peak, prefetch_bytes + results_bytes);
    if (--w.prefetch_left == 0) window_cv.SignalAll();
    work_cv.SignalAll();
  }

  void WorkerLoop(size_t id) {
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
        const auto t0 = Clock::now();
        std::optional<CpuSlotHold> slot(std::in_place, opt.cpu_slots.get());
        const auto t1 = Clock::now();
        DecodedBlock block = DecodeBlock(assembler, task, &needed, &images);
        slot.reset();
        slot_wait += Seconds(t0, t1);
        decode += Seconds(t1, Clock::now());
        absl::MutexLock lock(&mu);
        AddToWindow(task, &block);
        Publish(id, assemblers, &idle, &decode, &assemble, &slot_wait);
        continue;
      }
      const bool scheduled = members[task.member]->scheduled;
      if (scheduled) {
        absl::MutexLock lock(&mu);
        const auto t0 = Clock::now();
        while (!cancelled && windows[task.window].prefetch_left != 0) window_cv.Wait(&mu);
        idle += Seconds(t0, Clock::now());
        if (cancelled) break;
      }
      const auto t0 = Clock::now();
      std::optional<CpuSlotHold> slot(std::in_place, opt.cpu_slots.get());
      const auto t1 = Clock::now();
      Result r{AssembleNoThrow(assembler, task), 0};
      slot.reset();
      slot_wait += Seconds(t0, t1);
      assemble += Seconds(t1, Clock::now());
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

  FrameCacheKey CacheKey(uint32_t member, const SampleAssembler& assembler, const FrameRequest& r,
                         int64_t frame) const {
    return FrameCacheKey{members[member]->frame_cache_key, r.episode, r.stream, frame,
                         assembler.DecodeSettingsKey(r.spec_stream)};
  }

  // All of `r`'s frames from the decoded-frame cache, appended to `out`; false (and nothing
  // appended) when any is missing: the decoder has to run from the keyframe anyway, and then
  // delivers them all.
  bool TakeCachedFrames(uint32_t member, const SampleAssembler& assembler, const FrameRequest& r,
                        std::vector<std::pair<uint64_t, std::shared_ptr<const RgbImage>>>* out) const {
    if (!opt.frame_cache || r.frames.empty()) return false;
    const size_t before = out->size();
    for (int64_t f : r.frames) {
      std::shared_ptr<const RgbImage> img = opt.frame_cache->Find(CacheKey(member, assembler, r, f));
      if (!img) {
        out->resize(before);
        return false;
      }
      out->emplace_back(FrameKey(r.episode, r.stream, f), std::move(img));
    }
    return true;
  }

  // The consumer takes epoch `last.epoch`'s last batch: is the next epoch's first batch (sequence
  // numbers from `next_seq`) already planned, and how much of it is assembled (stats()).
  void CountBoundary(Cursor last, uint64_t next_seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
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

  // Hands a worker's counters to stats().
  void Publish(size_t id, const std::vector<std::unique_ptr<SampleAssembler>>& assemblers,
               double* idle, double* decode, double* assemble, double* slot_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    AssemblerStats sum;
    for (const auto& a : assemblers) {
      if (!a) continue;
      const AssemblerStats s = a->stats();
      sum.frames_decoded += s.frames_decoded;
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
};

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() {
  if (impl_) impl_->Stop();
}

namespace {

bool HasVideo(const SampleSpec& spec) {
  for (const StreamSpec& s : spec.streams) {
    if (s.kind == pb::VIDEO) return true;
  }
  return false;
}

}  // namespace

// Buckets (shuffle/buckets.h): the group is the spec's, else the global batch size; a batch must
// lie inside a group. A mixture lays every batch out across its members by weight, which would
// mix buckets in a batch.
absl::Status ResolveBucketGroup(const Source& source, const SampleSpec& spec, PipelineOptions* o) {
  if (source.is_mixture()) {
    return absl::InvalidArgumentError(
        "buckets: a mixture puts every dataset's share in each global batch, so its batches cannot "
        "hold one bucket; bucket one dataset (a WebDataset folder of mixed resolutions), or mix "
        "datasets without buckets");
  }
  const uint64_t group = spec.buckets.group > 0 ? spec.buckets.group : o->global_batch_size;
  if (o->global_batch_size == 0 || group % o->global_batch_size != 0) {
    return absl::InvalidArgumentError(StrCat(
        "buckets.group ", group, " is not a multiple of global_batch_size ", o->global_batch_size,
        ": a global batch must lie inside one group of one bucket"));
  }
  if (o->order.bucket_group != 0 && o->order.bucket_group != group) {
    o->order.buckets.reset();  // resolved for another group size
  }
  o->order.bucket_group = group;
  return absl::OkStatus();
}

absl::Status ResolveSchedule(const Source& source, const SampleSpec& spec, PipelineOptions* options) {
  PipelineOptions& o = *options;
  if (spec.buckets.enabled()) RETURN_IF_ERROR(ResolveBucketGroup(source, spec, &o));
  if (!source.is_mixture()) return ResolveOrder(source.dataset(0), spec, o.queue_bytes, &o.order);
  if (o.member_orders.size() == source.size()) return absl::OkStatus();  // resolved before
  ASSIGN_OR_RETURN(std::vector<BoundMember> bound, source.Bind(spec));
  o.member_orders.assign(source.size(), o.order);
  for (size_t k = 0; k < source.size(); ++k) {
    // The members share the budget: each gets an equal part for its windows.
    RETURN_IF_ERROR(ResolveOrder(source.dataset(k), bound[k].spec, o.queue_bytes / source.size(),
                                 &o.member_orders[k]));
  }
  return absl::OkStatus();
}

absl::Status ResolveSchedule(const Dataset& dataset, const SampleSpec& spec, PipelineOptions* options) {
  return ResolveSchedule(*Source::Of(dataset), spec, options);
}

MemoryEstimate EstimateMemory(const Source& source, const SampleSpec& spec,
                              const PipelineOptions& o) {
  auto mul = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return CheckedMul(a, b, &r) ? r : std::numeric_limits<uint64_t>::max();
  };
  auto add = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return CheckedAdd(a, b, &r) ? r : std::numeric_limits<uint64_t>::max();
  };
  MemoryEstimate e;
  e.sample_bytes = EstimateSampleBytes(spec, source.manifest());
  const uint64_t local = o.consumers > 0 ? o.global_batch_size / o.consumers : o.global_batch_size;
  e.batch_bytes = mul(local, e.sample_bytes);
  bool scheduled = HasVideo(spec) && !o.order.naive();
  if (source.is_mixture()) {
    scheduled = false;
    for (const OrderOptions& mo : o.member_orders) scheduled = scheduled || (HasVideo(spec) && !mo.naive());
  }
  if (scheduled) {
    if (!source.is_mixture()) {
      e.window_prefetch_bytes = mul(2, mul(o.order.window_blocks,
                                       EstimateBlockFrameBytes(spec, source.manifest(), o.order.block_steps)));
    } else {
      for (size_t k = 0; k < source.size() && k < o.member_orders.size(); ++k) {
        // Each member holds at most two windows; its blocks are sized by its own rates.
        const OrderOptions& mo = o.member_orders[k];
        e.window_prefetch_bytes = add(e.window_prefetch_bytes,
                                  mul(2, mul(mo.window_blocks, EstimateBlockFrameBytes(
                                                                   spec, source.manifest(), mo.block_steps))));
      }
    }
  }
  const uint64_t threads = o.threads > 0 ? static_cast<uint64_t>(o.threads)
                                         : std::max(1u, std::thread::hardware_concurrency());
  const uint64_t budget = scheduled ? o.queue_bytes / 2 : o.queue_bytes;
  const uint64_t ahead = source.is_mixture() ? add(mul(2, local), 2 * threads) : add(local, 2 * threads);
  e.in_flight_bytes = std::max(mul(ahead, e.sample_bytes), budget);
  e.total = add(add(e.window_prefetch_bytes, e.in_flight_bytes), mul(2, e.batch_bytes));
  return e;
}

MemoryEstimate EstimateMemory(const Dataset& dataset, const SampleSpec& spec,
                              const PipelineOptions& o) {
  return EstimateMemory(*Source::Of(dataset), spec, o);
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
  for (size_t k = 0; k < source.size(); ++k) {
    auto mem = std::make_unique<Impl::Member>();
    mem->dataset = &source.dataset(k);
    mem->bound = std::move(bound[k]);
    ASSIGN_OR_RETURN(std::set<uint64_t> quarantined,
                     QuarantinedEpisodes(mem->bound.spec, *mem->dataset));
    mem->key = OrderKey(mem->dataset->manifest().fingerprint, o.seed);
    ASSIGN_OR_RETURN(mem->index, SampleIndex::Build(*mem->dataset, mem->bound.spec.anchor_stream,
                                                    quarantined, mem->bound.spec.clips, mem->key));
    if (!quarantined.empty()) {
      // Never silent: the count is in the stats, and the log names the file and the episodes.
      ASSIGN_OR_RETURN(SampleIndex whole,
                       SampleIndex::Build(*mem->dataset, mem->bound.spec.anchor_stream, {},
                                          mem->bound.spec.clips, mem->key));
      const uint64_t samples = whole.size() - mem->index.size();
      {
        absl::MutexLock lock(&m.mu);
        m.stats.quarantined_episodes += quarantined.size();
        m.stats.quarantined_samples += samples;
      }
      std::string list;
      for (uint64_t e : quarantined) StrAppend(&list, list.empty() ? "" : " ", e);
      spdlog::warn("quarantine {}: {} episode(s) of {} left out ({} samples per epoch): {}",
                   mem->bound.spec.quarantine, quarantined.size(), mem->dataset->uri(), samples,
                   list);
    }
    if (mem->index.short_episodes() > 0) {
      const ClipSampling& c = mem->bound.spec.clips;
      spdlog::warn("clips: {} episode(s) of {} are shorter than a clip ({} anchor steps): their clips "
                   "start at the first step and are padded (<stream>_is_pad)",
                   mem->index.short_episodes(), mem->dataset->uri(),
                   uint64_t{c.back_steps} + c.forward_steps + 1);
    }
    if (source.is_mixture() && mem->index.size() == 0) {
      return absl::InvalidArgumentError(StrCat("mixture dataset '", source.member(k).name,
                                               "' has no samples for anchor '", m.spec.anchor, "'"));
    }
    mem->order = source.is_mixture() ? o.member_orders[k] : o.order;
    // The pipeline version also decides how audio is decoded (docs/pipeline.md "Schedule
    // versions"): a job resumed under version 1 or 2 keeps its per-window audio.
    mem->bound.spec.audio_method =
        mem->order.version >= 3 ? AudioMethod::kChunks : AudioMethod::kPerWindow;
    // Likewise where video crops are cut: a job resumed under version 1 to 3 crops from RGB.
    mem->bound.spec.crop_method =
        mem->order.version >= 4 ? CropMethod::kInDecoder : CropMethod::kFromRgb;
    mem->scheduled = HasVideo(mem->bound.spec) && !mem->order.naive();
    if (o.frame_cache) {
      mem->frame_cache_key = FrameCacheDatasetKey(mem->dataset->manifest());
      o.frame_cache->NameDataset(mem->frame_cache_key, mem->dataset->uri());
    }
    mem->prefetch.impl = &m;
    mem->prefetch.member = static_cast<uint32_t>(k);
    m.n += mem->index.size();
    m.members.push_back(std::move(mem));
  }
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
  if (start.position) {
    if (*start.position > m.n) {
      return absl::OutOfRangeError(StrCat("cursor ", start.ToString(), " is past the end of the "
                                          "epoch: an epoch has ", m.n, " sample positions (0..",
                                          m.n - 1, ")"));
    }
    if (source.is_mixture() && *start.position % m.batch != 0) {
      return absl::InvalidArgumentError(StrCat(
          "cursor ", start.ToString(), " is not at a batch boundary of this mixture (global_batch_size ",
          m.batch, "): a mixture's order is laid out per global batch, so a mixture resumes only at "
          "the global batch size its cursor was recorded with (docs/mixtures.md)"));
    }
    m.start_epoch = start.epoch;
    m.start_pos = *start.position;
    if (m.start_pos + m.batch > m.n) {  // no whole batch left in the epoch
      ++m.start_epoch;
      m.start_pos = 0;
    }
  } else {
    if (start.step >= m.steps) {
      return absl::OutOfRangeError(StrCat("cursor ", start.epoch, ":", start.step, " is past the end "
                                          "of the epoch: an epoch has ", m.steps, " steps (0..",
                                          m.steps - 1, ")"));
    }
    m.start_epoch = start.epoch;
    m.start_pos = start.step * m.batch;
  }
  if (o.max_epochs > 0 && m.start_epoch >= o.max_epochs) {
    return absl::OutOfRangeError(StrCat("cursor ", start.ToString(),
                                        " is past the last epoch (max_epochs ", o.max_epochs, ")"));
  }
  m.first_epoch_steps = (m.n - m.start_pos) / m.batch;
  ASSIGN_OR_RETURN(MixtureSchedule schedule,
                   MixtureSchedule::Create(source.weights(), m.batch, m.steps,
                                           OrderKey(source.manifest().fingerprint, o.seed)));
  m.schedule = std::move(schedule);
  return impl;
}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(const Source& source,
                                                           const SampleSpec& spec,
                                                           PipelineOptions options, Cursor start) {
  ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Prepare(source, spec, std::move(options), start));
  Impl& m = *impl;
  PipelineOptions& o = m.opt;
  const uint64_t sample_bytes = EstimateSampleBytes(m.spec, source.manifest());
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
      const auto t0 = Clock::now();
      while (!m.cancelled && m.results.count(seq) == 0) m.result_cv.Wait(&m.mu);
      m.stats.wait_seconds += Seconds(t0, Clock::now());
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
  const auto t0 = Clock::now();
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
  m.stats.batch_seconds += Seconds(t0, Clock::now());
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
  s.seconds = Seconds(m.created, Clock::now());
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
    s.frames_delivered += a.frames_delivered;
    s.prefetch_hits += a.prefetch_hits;
    s.prefetch_misses += a.prefetch_misses;
  }
  return s;
}

}  // namespace conveyor
