#include "pipeline/pipeline.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "base/cancel.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "decoders/yaml_config.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Bytes of one sample's tensors, from the spec and the manifest (text counted as 256 bytes).
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
      default:
        total += 256;
    }
  }
  return std::max<uint64_t>(total, 1);
}

// Bytes of the distinct frames one block of `block_steps` anchor steps needs, all cameras.
uint64_t EstimateBlockFrameBytes(const SampleSpec& spec, const Manifest& m, uint64_t block_steps) {
  const double anchor_rate = std::max(1e-9, m.streams[spec.anchor_stream].rate);
  uint64_t total = 0;
  for (const StreamSpec& s : spec.streams) {
    if (s.kind != pb::VIDEO) continue;
    const StreamInfo& info = m.streams[s.stream];
    const auto [lo, hi] = std::minmax_element(s.deltas.begin(), s.deltas.end());
    const double span_s = static_cast<double>(block_steps) / anchor_rate + (*hi - *lo);
    const uint64_t frames = static_cast<uint64_t>(std::ceil(span_s * std::max(info.rate, 1.0))) + 1;
    int64_t h = s.height, w = s.width;
    if (h == 0 || s.augment.crop.has_value()) {
      h = info.shape.size() >= 2 ? std::max(info.shape[0], info.shape[1]) : 1;
      w = h;
    }
    total += frames * static_cast<uint64_t>(h * w * 3);
  }
  return total;
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
        RETURN_IF_ERROR(yaml::CheckKeys(source, s, "pipeline.schedule",
                                        {"mode", "block_steps", "window_blocks"}));
        std::string mode = "gop";
        if (s["mode"]) mode = s["mode"].as<std::string>();
        if (mode != "naive" && mode != "gop") {
          return yaml::ConfigError(source, s["mode"], StrCat("pipeline.schedule.mode is '", mode,
                                                     "'; expected naive or gop"));
        }
        if (mode == "naive") {
          order = OrderOptions{};
        } else {
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

struct Pipeline::Impl : public FrameCache {
  struct Task {
    bool prefetch = false;
    uint64_t seq = 0;        // sample tasks: output order
    uint64_t window_id = 0;  // the window whose frames it needs or fills
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

  const Dataset& dataset;
  SampleSpec spec;
  PipelineOptions opt;
  SampleIndex index;
  uint64_t key = 0;
  uint64_t n = 0, batch = 0, local = 0, steps = 0;
  bool scheduled = false;
  uint64_t max_inflight = 0;
  Cursor start;
  Clock::time_point created = Clock::now();

  mutable std::mutex mu;
  std::condition_variable work_cv;    // workers: a task or budget became available
  std::condition_variable result_cv;  // Next(): a result arrived
  std::condition_variable window_cv;  // sample tasks: a window's frames are ready
  bool cancelled = false;
  std::atomic<bool> cancel_flag{false};  // `cancelled` for blocking I/O in workers (base/cancel.h)
  absl::Status fatal;  // a worker failed outside any one sample: the pipeline is over
  // Generation: the next position to turn into tasks, as (epoch, step, j).
  uint64_t gen_epoch = 0, gen_step = 0, gen_j = 0, gen_seq = 0;
  bool gen_done = false;
  std::deque<Task> pending;
  std::map<uint64_t, Window> windows;  // by window id
  std::map<uint64_t, Result> results;  // by seq
  uint64_t next_seq = 0;                // the next sample Next() hands out
  uint64_t results_bytes = 0, cache_bytes = 0;
  PipelineStats stats;
  std::map<uint64_t, std::unique_ptr<EpochOrder>> orders;  // by epoch, the ones in use
  std::vector<std::thread> workers;
  std::vector<AssemblerStats> worker_stats;

  Impl(const Dataset& d, SampleSpec s, PipelineOptions o) : dataset(d), spec(std::move(s)), opt(std::move(o)) {}
  ~Impl() override { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      cancelled = true;
      cancel_flag = true;
    }
    work_cv.notify_all();
    result_cv.notify_all();
    window_cv.notify_all();
    for (auto& t : workers) {
      if (t.joinable()) t.join();
    }
    workers.clear();
  }

  static uint64_t FrameKey(uint64_t episode, int stream, int64_t frame) {
    return (episode << 24) ^ (static_cast<uint64_t>(stream) << 56) ^ static_cast<uint64_t>(frame);
  }

  // FrameCache: frames of the windows whose prefetch finished.
  std::shared_ptr<const RgbImage> Find(uint64_t episode, int stream, int64_t frame) const override {
    std::lock_guard<std::mutex> lock(mu);
    const uint64_t k = FrameKey(episode, stream, frame);
    for (const auto& [id, w] : windows) {
      auto it = w.frames.find(k);
      if (it != w.frames.end()) return it->second;
    }
    return nullptr;
  }

  const EpochOrder& OrderFor(uint64_t epoch) {  // mu held
    auto it = orders.find(epoch);
    if (it == orders.end()) {
      it = orders.emplace(epoch, std::make_unique<EpochOrder>(n, key, epoch, opt.order)).first;
      while (orders.size() > 2) orders.erase(orders.begin());
    }
    return *it->second;
  }

  uint64_t WindowId(uint64_t epoch, uint64_t w) const { return epoch * (uint64_t{1} << 40) + w; }

  // Turns the next stretch of positions into tasks (mu held). Naive: one sample. Scheduled: the
  // rest of this consumer's positions in the current window, preceded by their blocks' prefetch.
  void Generate() {
    if (gen_done) return;
    if (opt.max_epochs > 0 && gen_epoch >= opt.max_epochs) {
      gen_done = true;
      return;
    }
    const EpochOrder& order = OrderFor(gen_epoch);
    auto position = [&](uint64_t step, uint64_t j) { return step * batch + opt.consumer * local + j; };
    auto advance = [&] {
      ++gen_seq;
      if (++gen_j == local) {
        gen_j = 0;
        if (++gen_step == steps) {
          gen_step = 0;
          ++gen_epoch;
        }
      }
    };
    if (!scheduled) {
      Task t;
      t.seq = gen_seq;
      t.sample = order.SampleAt(position(gen_step, gen_j));
      pending.push_back(std::move(t));
      advance();
      return;
    }
    const uint64_t epoch = gen_epoch;
    const uint64_t w = order.WindowOf(position(gen_step, gen_j));
    const uint64_t end = std::min(order.WindowEnd(w), steps * batch);
    const uint64_t id = WindowId(epoch, w);
    std::vector<Task> samples;
    std::map<uint64_t, std::vector<uint64_t>> blocks;  // block -> samples
    while (gen_epoch == epoch && position(gen_step, gen_j) < end) {
      Task t;
      t.seq = gen_seq;
      t.window_id = id;
      t.sample = order.SampleAt(position(gen_step, gen_j));
      blocks[order.BlockOf(t.sample)].push_back(t.sample);
      samples.push_back(std::move(t));
      advance();
    }
    Window& win = windows[id];
    win.prefetch_left += static_cast<int>(blocks.size());
    win.samples_left += samples.size();
    for (auto& [block, list] : blocks) {
      Task t;
      t.prefetch = true;
      t.window_id = id;
      std::sort(list.begin(), list.end());
      t.block_samples = std::move(list);
      pending.push_back(std::move(t));
    }
    for (Task& t : samples) pending.push_back(std::move(t));
  }

  // Blocks until a task may run (mu held through `lock`). False when cancelled or done.
  bool TakeTask(std::unique_lock<std::mutex>& lock, Task* out, double* idle) {
    while (true) {
      if (cancelled) return false;
      if (pending.empty()) Generate();
      if (pending.empty()) return false;  // max_epochs reached
      Task& front = pending.front();
      bool ok = true;
      if (front.prefetch) {
        // At most two windows hold frames: the one being assembled and the next.
        size_t older = 0;
        for (const auto& [wid, w] : windows) older += wid < front.window_id ? 1 : 0;
        ok = older <= 1;
      } else {
        ok = front.seq < next_seq + max_inflight;
      }
      if (ok) {
        *out = std::move(front);
        pending.pop_front();
        return true;
      }
      const auto t0 = Clock::now();
      work_cv.wait(lock);
      *idle += Seconds(t0, Clock::now());
    }
  }

  // A worker never lets an exception escape (it would terminate the process and every other
  // stream with it): a throw while assembling a sample becomes that sample's error; anything
  // else ends this pipeline with `fatal`, which Next() returns.
  void Worker(size_t id) {
    CancelScope scope(&cancel_flag);  // Cancel() aborts this worker's storage reads in flight
    try {
      WorkerLoop(id);
    } catch (const std::exception& e) {
      Fail(absl::InternalError(StrCat("pipeline worker ", id, " failed: ", e.what())));
    } catch (...) {
      Fail(absl::InternalError(StrCat("pipeline worker ", id, " failed with an unknown exception")));
    }
  }

  void Fail(absl::Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (fatal.ok()) fatal = std::move(s);
      cancelled = true;
      cancel_flag = true;
    }
    work_cv.notify_all();
    result_cv.notify_all();
    window_cv.notify_all();
  }

  static absl::StatusOr<Sample> AssembleNoThrow(SampleAssembler& assembler, uint64_t sample,
                                                uint64_t seed, uint64_t epoch) {
    try {
      return assembler.Assemble(sample, seed, epoch);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(StrCat("out of memory assembling sample ", sample));
    } catch (const std::exception& e) {
      return absl::InternalError(StrCat("sample ", sample, ": ", e.what()));
    }
  }

  void WorkerLoop(size_t id) {
    SampleAssembler assembler(dataset, spec, index);
    if (scheduled) assembler.set_frame_cache(this);
    double idle = 0, decode = 0, assemble = 0;
    std::vector<FrameRequest> needed;
    std::vector<RgbImage> images;
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (!TakeTask(lock, &task, &idle)) break;
      }
      if (task.prefetch) {
        const auto t0 = Clock::now();
        // Union of the frames the block's samples need, per (episode, stream); one pass each.
        std::map<std::pair<uint64_t, size_t>, FrameRequest> merged;
        for (uint64_t s : task.block_samples) {
          if (!assembler.NeededFrames(s, &needed).ok()) continue;  // the sample task reports it
          for (FrameRequest& r : needed) {
            FrameRequest& m = merged[{r.episode, r.spec_stream}];
            m.episode = r.episode;
            m.spec_stream = r.spec_stream;
            m.stream = r.stream;
            m.frames.insert(m.frames.end(), r.frames.begin(), r.frames.end());
          }
        }
        std::vector<std::pair<uint64_t, std::shared_ptr<const RgbImage>>> decoded;
        for (auto& [k, r] : merged) {
          std::sort(r.frames.begin(), r.frames.end());
          r.frames.erase(std::unique(r.frames.begin(), r.frames.end()), r.frames.end());
          if (!assembler.DecodeFrames(r, &images).ok()) continue;  // the sample task reports it
          for (size_t i = 0; i < r.frames.size(); ++i) {
            decoded.emplace_back(FrameKey(r.episode, r.stream, r.frames[i]),
                                 std::make_shared<const RgbImage>(std::move(images[i])));
          }
        }
        decode += Seconds(t0, Clock::now());
        std::lock_guard<std::mutex> lock(mu);
        Window& w = windows[task.window_id];
        for (auto& [k, img] : decoded) {
          if (w.frames.emplace(k, img).second) {
            w.bytes += img->pixels.size();
            cache_bytes += img->pixels.size();
          }
        }
        stats.cache_bytes_peak = std::max(stats.cache_bytes_peak, cache_bytes);
        stats.queue_bytes_peak = std::max(stats.queue_bytes_peak, cache_bytes + results_bytes);
        if (--w.prefetch_left == 0) window_cv.notify_all();
        work_cv.notify_all();
        Publish(id, assembler, &idle, &decode, &assemble);
        continue;
      }
      if (scheduled) {
        std::unique_lock<std::mutex> lock(mu);
        const auto t0 = Clock::now();
        window_cv.wait(lock, [&] { return cancelled || windows[task.window_id].prefetch_left == 0; });
        idle += Seconds(t0, Clock::now());
        if (cancelled) break;
      }
      const auto t0 = Clock::now();
      Result r{AssembleNoThrow(assembler, task.sample, opt.seed, EpochOfSeq(task.seq)), 0};
      assemble += Seconds(t0, Clock::now());
      if (r.sample.ok()) r.bytes = r.sample->bytes();
      std::lock_guard<std::mutex> lock(mu);
      if (scheduled) {
        auto it = windows.find(task.window_id);
        if (it != windows.end() && --it->second.samples_left == 0 && it->second.prefetch_left == 0) {
          cache_bytes -= it->second.bytes;
          windows.erase(it);
          work_cv.notify_all();
        }
      }
      results_bytes += r.bytes;
      stats.queue_bytes_peak = std::max(stats.queue_bytes_peak, cache_bytes + results_bytes);
      results.emplace(task.seq, std::move(r));
      result_cv.notify_all();
      Publish(id, assembler, &idle, &decode, &assemble);
    }
    std::lock_guard<std::mutex> lock(mu);
    worker_stats[id] = assembler.stats();
  }

  // Hands a worker's counters to stats() (mu held).
  void Publish(size_t id, const SampleAssembler& a, double* idle, double* decode, double* assemble) {
    worker_stats[id] = a.stats();
    stats.worker_idle_seconds += *idle;
    stats.decode_seconds += *decode;
    stats.assemble_seconds += *assemble;
    *idle = *decode = *assemble = 0;
  }

  // The epoch a sample task's seq belongs to (augmentation draws depend on it).
  uint64_t EpochOfSeq(uint64_t seq) const {
    const uint64_t steps_from_start = seq / local + start.step;
    return start.epoch + steps_from_start / steps;
  }
};

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() {
  if (impl_) impl_->Stop();
}

absl::Status ResolveSchedule(const Dataset& dataset, const SampleSpec& spec,
                             PipelineOptions* options) {
  // Scheduling defaults: a block is about one group of pictures of anchor steps; a window as
  // many blocks as half the byte budget holds twice over.
  const Manifest& manifest = dataset.manifest();
  PipelineOptions& o = *options;
  if (o.order.block_steps == 0) {
    double gop_s = 1.0;
    for (const StreamSpec& s : spec.streams) {
      if (s.kind != pb::VIDEO || dataset.num_episodes() == 0) continue;
      auto ep = dataset.LoadEpisode(0);
      if (!ep.ok()) break;
      const auto& pk = (*ep)->streams(s.stream).packets();
      int keys = 0;
      for (uint32_t f : pk.flags()) keys += (f & 1) ? 1 : 0;
      const double rate = std::max(manifest.streams[s.stream].rate, 1.0);
      if (keys > 0) gop_s = static_cast<double>(pk.flags_size()) / keys / rate;
      break;
    }
    o.order.block_steps = std::max<uint64_t>(
        1, static_cast<uint64_t>(std::llround(gop_s * manifest.streams[spec.anchor_stream].rate)));
  }
  if (o.order.window_blocks == 0) {
    // Not divided by the consumer count: the order must not depend on it (a resized job
    // continues the same sequence), so the window is sized as if one consumer decoded it all.
    const uint64_t per_block =
        std::max<uint64_t>(1, EstimateBlockFrameBytes(spec, manifest, o.order.block_steps));
    o.order.window_blocks = std::clamp<uint64_t>(o.queue_bytes / 2 / (2 * per_block), 1, 4096);
  }
  return absl::OkStatus();
}

MemoryEstimate EstimateMemory(const Dataset& dataset, const SampleSpec& spec,
                              const PipelineOptions& o) {
  const Manifest& manifest = dataset.manifest();
  auto mul = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return CheckedMul(a, b, &r) ? r : std::numeric_limits<uint64_t>::max();
  };
  auto add = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return CheckedAdd(a, b, &r) ? r : std::numeric_limits<uint64_t>::max();
  };
  MemoryEstimate e;
  e.sample_bytes = EstimateSampleBytes(spec, manifest);
  const uint64_t local = o.consumers > 0 ? o.global_batch_size / o.consumers : o.global_batch_size;
  e.batch_bytes = mul(local, e.sample_bytes);
  bool has_video = false;
  for (const StreamSpec& s : spec.streams) has_video = has_video || s.kind == pb::VIDEO;
  const bool scheduled = has_video && !o.order.naive();
  if (scheduled) {
    e.frame_cache_bytes =
        mul(2, mul(o.order.window_blocks, EstimateBlockFrameBytes(spec, manifest, o.order.block_steps)));
  }
  const uint64_t threads = o.threads > 0 ? static_cast<uint64_t>(o.threads)
                                         : std::max(1u, std::thread::hardware_concurrency());
  const uint64_t budget = scheduled ? o.queue_bytes / 2 : o.queue_bytes;
  e.in_flight_bytes = std::max(mul(add(local, 2 * threads), e.sample_bytes), budget);
  e.total = add(add(e.frame_cache_bytes, e.in_flight_bytes), mul(2, e.batch_bytes));
  return e;
}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(const Dataset& dataset,
                                                           const SampleSpec& spec,
                                                           PipelineOptions options, Cursor start) {
  auto impl = std::make_unique<Impl>(dataset, spec, std::move(options));
  Impl& m = *impl;
  PipelineOptions& o = m.opt;
  ASSIGN_OR_RETURN(m.index, SampleIndex::Build(dataset, m.spec.anchor_stream));
  m.n = m.index.size();
  if (o.consumers == 0 || o.consumer >= o.consumers) {
    return absl::InvalidArgumentError(StrCat("consumer index ", o.consumer, " is out of range for ",
                                             o.consumers, " consumers (0 <= consumer < consumers)"));
  }
  if (o.global_batch_size == 0 || o.global_batch_size % o.consumers != 0) {
    return absl::InvalidArgumentError(
        StrCat("global_batch_size ", o.global_batch_size, " is not a multiple of the ", o.consumers,
               " consumers: each consumer gets global_batch_size / consumers samples per step"));
  }
  m.batch = o.global_batch_size;
  m.local = m.batch / o.consumers;
  m.steps = m.n / m.batch;
  if (m.steps == 0) {
    return absl::InvalidArgumentError(StrCat("the dataset has ", m.n, " samples, fewer than one "
                                             "global batch of ", m.batch));
  }
  if (o.max_epochs > 0 && start.epoch >= o.max_epochs) {
    return absl::OutOfRangeError(StrCat("cursor ", start.epoch, ":", start.step,
                                        " is past the last epoch (max_epochs ", o.max_epochs, ")"));
  }
  if (start.step >= m.steps) {
    return absl::OutOfRangeError(StrCat("cursor ", start.epoch, ":", start.step, " is past the end "
                                        "of the epoch: an epoch has ", m.steps, " steps (0..",
                                        m.steps - 1, ")"));
  }
  RETURN_IF_ERROR(ResolveSchedule(dataset, m.spec, &o));
  const Manifest& manifest = dataset.manifest();
  bool has_video = false;
  for (const StreamSpec& s : m.spec.streams) has_video = has_video || s.kind == pb::VIDEO;
  m.scheduled = has_video && !o.order.naive();
  m.key = OrderKey(manifest.fingerprint, o.seed);
  const uint64_t sample_bytes = EstimateSampleBytes(m.spec, manifest);
  const uint64_t sample_budget = m.scheduled ? o.queue_bytes / 2 : o.queue_bytes;
  const int threads = o.threads > 0 ? o.threads
                                    : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  m.max_inflight = std::max<uint64_t>(m.local + 2 * threads, sample_budget / sample_bytes);
  m.start = start;
  m.gen_epoch = start.epoch;
  m.gen_step = start.step;
  m.worker_stats.resize(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    m.workers.emplace_back([&m, t] { m.Worker(static_cast<size_t>(t)); });
  }
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

uint64_t Pipeline::num_samples() const { return impl_->n; }
uint64_t Pipeline::steps_per_epoch() const { return impl_->steps; }
const PipelineOptions& Pipeline::options() const { return impl_->opt; }

void Pipeline::Cancel() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->cancelled = true;
    impl_->cancel_flag = true;
  }
  impl_->work_cv.notify_all();
  impl_->result_cv.notify_all();
  impl_->window_cv.notify_all();
}

absl::StatusOr<std::optional<Batch>> Pipeline::Next() {
  Impl& m = *impl_;
  std::vector<Sample> samples;
  std::vector<SampleId> skipped;
  const uint64_t first = m.next_seq;
  const uint64_t steps_from_start = first / m.local + m.start.step;
  Cursor cursor{m.start.epoch + steps_from_start / m.steps, steps_from_start % m.steps};
  if (m.opt.max_epochs > 0 && cursor.epoch >= m.opt.max_epochs) return std::nullopt;  // the end
  {
    std::unique_lock<std::mutex> lock(m.mu);
    for (uint64_t seq = first; seq < first + m.local; ++seq) {
      const auto t0 = Clock::now();
      m.result_cv.wait(lock, [&] { return m.cancelled || m.results.count(seq) > 0; });
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
  }
  m.work_cv.notify_all();
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
    batch = PackSamples(std::move(samples), m.spec, *m.opt.packing, tokens, plan, m.opt.pinned);
  } else {
    batch = StackSamples(std::move(samples), m.spec, m.opt.pinned);
  }
  if (!batch.ok()) return Annotate(batch.status(), StrCat("batch ", cursor.epoch, ":", cursor.step));
  batch->cursor = cursor;
  batch->consumer = m.opt.consumer;
  batch->consumers = m.opt.consumers;
  std::lock_guard<std::mutex> lock(m.mu);
  m.stats.batch_seconds += Seconds(t0, Clock::now());
  ++m.stats.batches;
  m.stats.samples += batch->ids.size();
  m.stats.bytes += batch->bytes();
  m.stats.fill_ratio_sum += fill;
  return std::optional<Batch>(std::move(*batch));
}

PipelineStats Pipeline::stats() const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  PipelineStats s = m.stats;
  s.seconds = Seconds(m.created, Clock::now());
  s.queue_bytes = m.cache_bytes + m.results_bytes;
  for (const AssemblerStats& a : m.worker_stats) {
    s.frames_decoded += a.frames_decoded;
    s.frames_delivered += a.frames_delivered;
    s.cache_hits += a.cache_hits;
    s.cache_misses += a.cache_misses;
  }
  return s;
}

}  // namespace conveyor
