// `conveyor batches`: runs the pipeline offline and prints one line per batch (cursor, sample
// ids or their hash, SHA-256 of the tensors), so anyone can check from outside what rank I of N
// sees at any step, and that it is the same at any thread count and from any resume cursor.
#include <cstdio>
#include <thread>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "base/status_macros.h"
#include "base/strings.h"
#include "format/format.h"
#include "format/npy.h"
#include "sample/quarantine.h"
#include "pipeline/naive_warning.h"
#include "pipeline/pipeline.h"
#include "shuffle/quality.h"
#include "tools/batch_line.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

std::vector<LineTensor> Tensors(const Batch& b) {
  std::vector<LineTensor> out;
  for (const TensorView& t : b.tensors) out.push_back({&t, b.data(t), t.bytes});
  return out;
}

std::vector<LineSample> Ids(const Batch& b) {
  std::vector<LineSample> out;
  for (const SampleId& id : b.ids) out.push_back({id.index, id.episode, id.step, id.dataset});
  return out;
}

// The pipeline options of a run: the config's, then the flags over them.
absl::StatusOr<PipelineOptions> RunOptions(const BatchesOptions& o, const std::string& text,
                                           const SampleSpec& spec, const Manifest& manifest) {
  PipelineOptions po;
  RETURN_IF_ERROR(po.MergeYaml(text, spec, manifest, o.config));
  if (o.consumers < 1 || o.consumer < 0) {
    return absl::InvalidArgumentError("--consumers must be >= 1 and --consumer >= 0");
  }
  po.consumer = static_cast<uint32_t>(o.consumer);
  po.consumers = static_cast<uint32_t>(o.consumers);
  if (o.threads >= 0) po.threads = o.threads;
  if (o.batch_size > 0) po.global_batch_size = static_cast<uint64_t>(o.batch_size);
  if (o.seed >= 0) po.seed = static_cast<uint64_t>(o.seed);
  const uint32_t version = o.schedule_version > 0 ? static_cast<uint32_t>(o.schedule_version) : po.order.version;
  if (version < 1 || version > kScheduleVersionCurrent) {
    return absl::InvalidArgumentError(
        StrCat("--schedule-version ", o.schedule_version, ": expected 1 to ", kScheduleVersionCurrent));
  }
  if (!o.schedule.empty()) po.schedule_given = true;  // asked for on the command line
  if (o.schedule == "naive") {
    po.order = OrderOptions{};
  } else if (o.schedule == "gop") {
    if (po.order.naive()) po.order = OrderOptions::AutoGop();
  } else if (!o.schedule.empty()) {
    return absl::InvalidArgumentError(StrCat("--schedule '", o.schedule, "': expected naive or gop"));
  }
  po.order.version = version;
  ASSIGN_OR_RETURN(po.frame_cache, MakeFrameCache(ToConfig(o.frame_cache)));
  return po;
}

// The order the batches came in (its shuffle quality), or a mixture's shares per dataset.
absl::Status PrintOrder(const Source& source, const SampleSpec& spec, const Pipeline& pipeline,
                        const PipelineStats& s, const Cursor& cursor) {
  const PipelineOptions& po = pipeline.options();
  if (source.is_mixture()) {
    // Per dataset: requested share, realized share, and how far through its own epochs the
    // mixture has gone at the last cursor.
    const std::vector<MixtureProgress> mix = pipeline.Mixture();
    std::fprintf(stderr, "  mixture %s (%zu datasets, %llu steps per epoch):\n",
                 source.manifest().name.c_str(), mix.size(),
                 static_cast<unsigned long long>(pipeline.steps_per_epoch()));
    for (size_t k = 0; k < mix.size(); ++k) {
      const MixtureProgress& p = mix[k];
      std::fprintf(stderr,
                   "    %-20s weight %.4f realized %.4f samples %llu of %llu, epochs %.3f\n",
                   p.name.c_str(), p.requested_share,
                   s.samples ? static_cast<double>(s.member_samples[k]) / s.samples : 0.0,
                   static_cast<unsigned long long>(s.member_samples[k]),
                   static_cast<unsigned long long>(p.samples_per_epoch), p.epochs);
    }
    return absl::OkStatus();
  }
  const Dataset& ds = source.dataset(0);
  // The order these batches came in: without the config's quarantined episodes, as the
  // pipeline built it (else the figures describe episodes that were never served).
  ASSIGN_OR_RETURN(const std::set<uint64_t> quarantined, QuarantinedEpisodes(spec, ds));
  const uint64_t key = OrderKey(ds.manifest().fingerprint, po.seed);
  ASSIGN_OR_RETURN(SampleIndex index,
                   SampleIndex::Build(ds, spec.anchor_stream, quarantined, spec.clips, key));
  const EpochOrder order(index.size(), key, cursor.epoch, po.order);
  const ShuffleQuality q = MeasureShuffle(order, index, cursor.epoch, po.global_batch_size, 1u << 20);
  std::fprintf(stderr,
               "  order (%s, schedule version %u, block %s%llu steps, window %llu blocks): "
               "same-episode neighbours %.4f (uniform shuffle %.4f), episodes per batch %.2f "
               "(uniform %.2f)\n",
               po.order.naive() ? "naive" : "gop", po.order.version, po.order.blocks ? "<= " : "",
               static_cast<unsigned long long>(po.order.block_steps),
               static_cast<unsigned long long>(po.order.window_blocks), q.same_episode_adjacent,
               q.same_episode_expected, q.episodes_per_batch, q.episodes_per_batch_expected);
  return absl::OkStatus();
}

// Where the bytes came from: storage reads and caches, and each dataset's episode reads.
void PrintStorage(const Source& source) {
  const StorageStats st = source.storage_stats();
  std::fprintf(stderr,
               "  storage: %llu reads, %llu bytes, %llu retries, %llu connections; cache hits "
               "%llu (%llu bytes), misses %llu (%llu bytes filled), corrupt %llu, evicted %llu "
               "bytes\n",
               static_cast<unsigned long long>(st.reads),
               static_cast<unsigned long long>(st.bytes_read),
               static_cast<unsigned long long>(st.retries),
               static_cast<unsigned long long>(st.connections_opened),
               static_cast<unsigned long long>(st.cache_hits),
               static_cast<unsigned long long>(st.cache_hit_bytes),
               static_cast<unsigned long long>(st.cache_misses),
               static_cast<unsigned long long>(st.cache_fill_bytes),
               static_cast<unsigned long long>(st.cache_corrupt),
               static_cast<unsigned long long>(st.cache_evicted_bytes));
  for (size_t k = 0; k < source.size(); ++k) {
    const std::optional<EpisodeReadStats> r = source.dataset(k).episode_read_stats();
    if (!r.has_value()) continue;
    std::fprintf(stderr,
                 "  episode reads (%s): %llu reads of %llu distinct episodes, %.1f MB for %.1f MB: "
                 "read amplification %.3f\n",
                 source.dataset(k).manifest().name.c_str(), static_cast<unsigned long long>(r->reads),
                 static_cast<unsigned long long>(r->distinct), r->bytes_read / 1e6,
                 r->distinct_bytes / 1e6, r->amplification());
  }
}

// conveyor batches --stats: throughput, decoding, the order, stage times and storage (stderr).
absl::Status PrintStats(const BatchesOptions& o, const Source& source, const SampleSpec& spec,
                        const Pipeline& pipeline, const Cursor& cursor) {
  const PipelineStats s = pipeline.stats();
  const PipelineOptions& po = pipeline.options();
  std::fprintf(stderr,
               "stats: %llu batches, %llu samples (%llu skipped) in %.2f s = %.1f samples/s, "
               "%.1f MB/s\n",
               static_cast<unsigned long long>(s.batches), static_cast<unsigned long long>(s.samples),
               static_cast<unsigned long long>(s.skipped), s.seconds, s.samples / std::max(s.seconds, 1e-9),
               s.bytes / 1e6 / std::max(s.seconds, 1e-9));
  if (s.quarantined_episodes > 0) {
    std::fprintf(stderr, "  quarantine: %llu episodes (%llu samples per epoch) left out\n",
                 static_cast<unsigned long long>(s.quarantined_episodes),
                 static_cast<unsigned long long>(s.quarantined_samples));
  }
  std::fprintf(stderr,
               "  video: %llu frames decoded for %llu delivered: amplification %.3f; frame cache "
               "hits %llu, misses %llu; peak cache %.1f MB, peak queue %.1f MB; %llu frames "
               "decoded on NVDEC\n",
               static_cast<unsigned long long>(s.frames_decoded),
               static_cast<unsigned long long>(s.frames_delivered), s.amplification(),
               static_cast<unsigned long long>(s.prefetch_hits),
               static_cast<unsigned long long>(s.prefetch_misses), s.prefetch_bytes_peak / 1e6,
               s.queue_bytes_peak / 1e6, static_cast<unsigned long long>(s.frames_decoded_nvdec));
  if (po.frame_cache) {
    // Decoding saved: the hits at this run's own decode seconds per frame (when it decoded any).
    const std::string saved =
        s.frames_decoded > 0
            ? StrCat("about ", static_cast<int64_t>(s.frame_cache_hits * s.decode_seconds / s.frames_decoded * 10) / 10.0,
                     " s of decoding saved")
            : std::string("no frame decoded");
    std::fprintf(stderr, "  frame cache: %llu frames from the cache, %llu decoded into it (%s); %llu blocks not decoded at all; %s\n",
                 static_cast<unsigned long long>(s.frame_cache_hits),
                 static_cast<unsigned long long>(s.frame_cache_misses), saved.c_str(),
                 static_cast<unsigned long long>(s.blocks_from_frame_cache),
                 FrameCacheSummary(po.frame_cache->stats(), o.frame_cache.policy).c_str());
  }
  RETURN_IF_ERROR(PrintOrder(source, spec, pipeline, s, cursor));
  std::fprintf(stderr,
               "  stage seconds (summed over workers): decode blocks %.2f, assemble %.2f, worker "
               "idle %.2f; batching %.2f, consumer waited %.2f",
               s.decode_seconds, s.assemble_seconds, s.worker_idle_seconds, s.batch_seconds,
               s.wait_seconds);
  if (po.packing) std::fprintf(stderr, "; packing fill ratio %.4f", s.fill_ratio_sum / std::max<uint64_t>(1, s.batches));
  std::fprintf(stderr, "\n");
  PrintStorage(source);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunBatches(const BatchesOptions& o) {
  ASSIGN_OR_RETURN(std::unique_ptr<Source> source, Source::Open(o.dataset));
  const Manifest& manifest = source->manifest();
  if (o.config.empty()) return absl::InvalidArgumentError("--config is required");
  std::ifstream f(o.config, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open config ", o.config));
  std::stringstream text;
  text << f.rdbuf();
  ASSIGN_OR_RETURN(SampleSpec spec, SampleSpec::FromYaml(text.str(), manifest, o.config));
  ASSIGN_OR_RETURN(PipelineOptions po, RunOptions(o, text.str(), spec, manifest));
  ASSIGN_OR_RETURN(Cursor cursor, ParseCursor(o.cursor));
  if (o.steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  // Resolved here as Create would, so that --stats measures the order the batches follow.
  RETURN_IF_ERROR(ResolveSchedule(*source, spec, &po));
  if (const std::string w = NaiveOrderWarning(*source, spec, po); !w.empty()) {
    std::fprintf(stderr, "conveyor batches: warning: %s\n", w.c_str());
  }
  if (po.frame_cache && o.frame_cache.prefault) {
    const int threads = po.threads > 0 ? po.threads : static_cast<int>(std::thread::hardware_concurrency());
    PrefaultFrameCache(*source, spec, *po.frame_cache, threads);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline, Pipeline::Create(*source, spec, po, cursor));
  for (int64_t i = 0; i < o.steps; ++i) {
    absl::StatusOr<std::optional<Batch>> next = pipeline->Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) break;  // the end of the data (max_epochs)
    const Batch* b = &**next;
    const std::vector<LineTensor> tensors = Tensors(*b);
    const std::vector<LineSample> ids = Ids(*b);
    ASSIGN_OR_RETURN(std::string line, BatchLine(b->cursor.epoch, b->cursor.step, b->consumer,
                                                 b->consumers, ids, tensors, o.digest, o.ids));
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (!o.out.empty()) {
      const std::string dir = StrCat(o.out, "/", b->cursor.epoch, "-", b->cursor.step);
      std::filesystem::create_directories(dir);
      for (const TensorView& t : b->tensors) {
        RETURN_IF_ERROR(WriteNpyRaw(StrCat(dir, "/", t.name, ".npy"), t.shape, NumpyDescr(t.dtype),
                                    b->data(t), t.bytes));
      }
    }
  }
  if (o.stats) RETURN_IF_ERROR(PrintStats(o, *source, spec, *pipeline, cursor));
  return absl::OkStatus();
}

// `conveyor batches`: its flags and its run (tools/command.h).
class BatchesCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand(
        "batches", "Run the pipeline offline: one line per batch (cursor, sample ids, SHA-256)");
    c->add_option("dataset", o_.dataset, "Dataset path or URL")->required();
    c->add_option("--config", o_.config, "Config (YAML): streams, pipeline, packing")->required();
    c->add_option("--consumer", o_.consumer, "This consumer's index (rank)")->check(CLI::NonNegativeNumber);
    c->add_option("--consumers", o_.consumers, "Number of consumers (ranks)")->check(CLI::PositiveNumber);
    c->add_option("--cursor", o_.cursor, "Start at EPOCH:STEP, or EPOCH@POSITION (a sample position: any batch size)");
    c->add_option("--steps", o_.steps, "Batches to produce")->check(CLI::PositiveNumber);
    c->add_option("--threads", o_.threads, "Worker threads (0 = one per core)")->check(CLI::NonNegativeNumber);
    c->add_option("--batch-size", o_.batch_size, "Global batch size (overrides the config)")->check(CLI::PositiveNumber);
    c->add_option("--seed", o_.seed, "Seed (overrides the config)")->check(CLI::NonNegativeNumber);
    c->add_option("--schedule", o_.schedule, "naive or gop (overrides the config)");
    AddFrameCacheFlags(c, &o_.frame_cache);
    c->add_option("--schedule-version", o_.schedule_version,
                  "1 to 4: the schedule's version (overrides the config's; docs/pipeline.md)");
    c->add_flag("--digest", o_.digest, "Print the SHA-256 of each batch's tensors");
    c->add_flag("--ids", o_.ids, "Print every sample id (episode/step)");
    c->add_flag("--stats", o_.stats, "Print amplification, shuffle quality, fill ratio and stage times");
    c->add_option("--out", o_.out, "Write each batch's tensors as .npy under DIR/EPOCH-STEP/");
    return c;
  }
  absl::Status Run() override {
    return RunBatches(o_);
  }

 private:
  BatchesOptions o_;
};

std::unique_ptr<Command> NewBatchesCommand() {
  return std::make_unique<BatchesCommand>();
}

}  // namespace conveyor::tools
