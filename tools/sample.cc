// `conveyor sample`: assembles samples as the training pipeline would and writes each one as
// .npy files plus meta.json, so people and outside tools (numpy, the ffmpeg CLI) can check them.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/json_text.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/worker_pool.h"
#include "sample/sample_assembler.h"
#include "pipeline/source.h"
#include "shuffle/order.h"
#include "format/npy.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

absl::Status WriteSample(const Sample& sample, const std::string& dir, uint64_t seed,
                         uint64_t epoch, const std::string& dataset) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(StrCat("cannot create ", dir, ": ", ec.message()));
  json meta = {{"index", sample.index},      {"episode", sample.episode},
               {"anchor_step", sample.step}, {"anchor_time_s", sample.time_s},
               {"seed", seed},               {"epoch", epoch}};
  if (!dataset.empty()) meta["dataset"] = dataset;  // a mixture's dataset
  json tensors = json::object();
  for (const OwnedTensor& t : sample.tensors) {
    tensors[t.name] = {{"dtype", std::string(DTypeName(t.dtype))}, {"shape", t.shape}};
    std::vector<uint8_t> shared;  // frames held by reference (OwnedTensor::frames), laid out
    if (!t.frames.empty()) {
      shared.resize(t.bytes());
      t.CopyTo(shared.data());
    }
    const std::vector<uint8_t>& bytes = t.frames.empty() ? t.data : shared;
    RETURN_IF_ERROR(WriteNpyRaw(StrCat(dir, "/", t.name, ".npy"), t.shape, NumpyDescr(t.dtype),
                                bytes.data(), bytes.size()));
    if (t.dtype == DType::kUint8 && t.shape.size() == 1 && t.role != TensorRole::kPaddingMask) {
      // Text: also readable as is.
      meta["text"][t.name] = std::string(t.data.begin(), t.data.end());
    }
  }
  meta["tensors"] = tensors;
  std::ofstream f(dir + "/meta.json", std::ios::trunc);
  f << JsonText(meta, 2) << "\n";
  if (!f) return absl::UnavailableError(StrCat("cannot write ", dir, "/meta.json"));
  return absl::OkStatus();
}

// The member of `source` whose samples --member names (0 without --member).
absl::StatusOr<size_t> FindMember(const Source& source, const SampleOptions& o) {
  if (o.member.empty()) return 0;
  std::string names;
  size_t member = 0;
  for (; member < source.size() && source.member(member).name != o.member; ++member) {
    StrAppend(&names, names.empty() ? "" : ", ", source.member(member).name);
  }
  if (member == source.size()) {
    return absl::NotFoundError(StrCat("--member '", o.member, "': ", o.dataset, " has ",
                                      source.is_mixture() ? "the datasets " : "the one dataset ",
                                      names));
  }
  return member;
}

// The sample indices to write: --indices as given, or --count of them from --start, every
// --stride (default: spread over the rest of the dataset).
absl::StatusOr<std::vector<uint64_t>> PickSamples(const SampleOptions& o, const SampleIndex& index,
                                                  const SampleSpec& spec) {
  std::vector<uint64_t> picks;
  if (!o.indices.empty()) {
    for (int64_t i : o.indices) {
      if (i < 0 || static_cast<uint64_t>(i) >= index.size()) {
        return absl::OutOfRangeError(
            StrCat("sample index ", i, " is out of range: the dataset has ", index.size(),
                   " samples (anchor '", spec.anchor, "')"));
      }
      picks.push_back(static_cast<uint64_t>(i));
    }
    return picks;
  }
  if (static_cast<uint64_t>(o.start) >= index.size()) {
    return absl::OutOfRangeError(StrCat("--start ", o.start, " is past the last sample (",
                                        index.size(), " samples)"));
  }
  const uint64_t left = index.size() - static_cast<uint64_t>(o.start);
  const uint64_t count = std::min<uint64_t>(static_cast<uint64_t>(o.count), left);
  const uint64_t stride =
      o.stride > 0 ? static_cast<uint64_t>(o.stride) : std::max<uint64_t>(1, left / count);
  for (uint64_t j = 0; j < count; ++j) {
    const uint64_t i = static_cast<uint64_t>(o.start) + j * stride;
    if (i >= index.size()) break;
    picks.push_back(i);
  }
  return picks;
}

// One member's samples as `conveyor sample` writes them: the spec bound to the member and the
// mixture's layout they are conformed to (a single dataset is the one-member case).
struct MemberSamples {
  const Source* source = nullptr;
  size_t member = 0;
  const SampleSpec* shared = nullptr;  // parsed against source->manifest()
  const std::vector<BoundMember>* bound = nullptr;
  const std::vector<SharedStream>* layout = nullptr;
  const SampleIndex* index = nullptr;  // of the member's dataset
  std::string member_name;             // "" for a single dataset
  const SampleSpec& spec() const { return (*bound)[member].spec; }
};

// What WriteSamples' workers did.
struct SampleRun {
  absl::Status first_error;
  std::vector<json> skipped;  // on_error: skip
  AssemblerStats total;
};

// Assembles and writes `picks` (slot j into OUT/j) on o.threads workers, each with its own
// assembler. The first error stops them, except a sample's own error under on_error: skip.
SampleRun WriteSamples(const SampleOptions& o, const MemberSamples& m,
                       const std::vector<uint64_t>& picks) {
  const int threads = o.threads > 0 ? o.threads
                                    : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0}, done{0};
  // What the workers share.
  struct Shared {
    absl::Mutex mu;
    absl::Status first_error ABSL_GUARDED_BY(mu);
    std::vector<json> skipped ABSL_GUARDED_BY(mu);
    AssemblerStats total ABSL_GUARDED_BY(mu);
  } state;
  const auto t0 = std::chrono::steady_clock::now();
  const SampleSpec& spec = m.spec();
  auto worker = [&] {
    SampleAssembler assembler(m.source->dataset(m.member), spec, *m.index);
    while (true) {
      const size_t j = next.fetch_add(1);
      if (j >= picks.size()) break;
      {
        absl::MutexLock lock(&state.mu);
        if (!state.first_error.ok()) break;
      }
      auto sample = assembler.Assemble(picks[j], o.seed, o.epoch);
      if (sample.ok()) {
        absl::Status c =
            m.source->Conform(m.member, *m.shared, (*m.bound)[m.member], *m.layout, &*sample);
        if (!c.ok()) sample = c;
      }
      absl::Status st = sample.ok()
                            ? WriteSample(*sample, StrCat(o.out, "/", absl::Dec(j, absl::kZeroPad6)),
                                          o.seed, o.epoch, m.member_name)
                            : sample.status();
      absl::MutexLock lock(&state.mu);
      if (!st.ok()) {
        if (spec.on_error == OnError::kSkip && !sample.ok()) {
          spdlog::warn("sample {} skipped (on_error: skip): {}", picks[j], st.ToString());
          state.skipped.push_back({{"slot", j}, {"index", picks[j]},
                                    {"reason", absl::StatusCodeToString(st.code())},
                                    {"error", std::string(st.message())}});
        } else if (state.first_error.ok()) {
          state.first_error = Annotate(st, StrCat("sample ", picks[j]));
        }
      }
      const size_t n = ++done;
      if (o.progress && (n % 16 == 0 || n == picks.size())) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "\rsample: %zu/%zu (%.1f samples/s)", n, picks.size(), n / std::max(s, 1e-9));
      }
    }
    absl::MutexLock lock(&state.mu);
    const AssemblerStats& a = assembler.stats();
    state.total.samples += a.samples;
    state.total.frames_decoded += a.frames_decoded;
    state.total.frames_delivered += a.frames_delivered;
    state.total.images_decoded += a.images_decoded;
    state.total.audio_windows += a.audio_windows;
  };
  WorkerPool("conveyor-sample", threads, [&](int) { worker(); }).Join();
  SampleRun run;
  absl::MutexLock lock(&state.mu);
  run.first_error = state.first_error;
  run.skipped = std::move(state.skipped);
  run.total = state.total;
  return run;
}

// OUT/summary.json, and the closing line on stderr with --progress.
void WriteSummary(const SampleOptions& o, const MemberSamples& m, size_t picked,
                  const SampleRun& run, double secs) {
  const AssemblerStats& total = run.total;
  json summary = {{"dataset", m.source->dataset(m.member).uri()},
                  {"samples_in_dataset", m.index->size()},
                  {"anchor", m.spec().anchor},
                  {"written", picked - run.skipped.size()},
                  {"skipped", run.skipped},
                  {"seconds", secs},
                  {"video_frames_decoded", total.frames_decoded},
                  {"video_frames_delivered", total.frames_delivered},
                  {"images_decoded", total.images_decoded},
                  {"audio_windows", total.audio_windows}};
  if (!m.member_name.empty()) summary["mixture"] = {{"file", o.dataset}, {"dataset", m.member_name}};
  std::ofstream f(o.out + "/summary.json", std::ios::trunc);
  f << JsonText(summary, 2) << "\n";
  if (o.progress) {
    std::fprintf(stderr,
                 "wrote %zu samples to %s (%zu skipped) in %.2f s; video: %llu frames decoded for "
                 "%llu delivered (%.2fx)\n",
                 picked - run.skipped.size(), o.out.c_str(), run.skipped.size(), secs,
                 static_cast<unsigned long long>(total.frames_decoded),
                 static_cast<unsigned long long>(total.frames_delivered),
                 total.frames_delivered ? static_cast<double>(total.frames_decoded) / total.frames_delivered : 0.0);
  }
}

}  // namespace

absl::Status RunSample(const SampleOptions& o) {
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.count <= 0 && o.indices.empty()) return absl::InvalidArgumentError("--count must be > 0");
  if (o.start < 0 || o.stride < 0) {
    return absl::InvalidArgumentError("--start and --stride must be >= 0");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Source> source, Source::Open(o.dataset));
  SampleSpec shared;
  if (o.config.empty()) {
    ASSIGN_OR_RETURN(shared, SampleSpec::Default(source->manifest()));
  } else {
    ASSIGN_OR_RETURN(shared, SampleSpec::FromFile(o.config, source->manifest()));
  }
  // A mixture: the samples of one of its datasets (--member), assembled with the config bound to
  // its streams and conformed to the mixture's layout, as a batch would hold them.
  ASSIGN_OR_RETURN(const size_t member, FindMember(*source, o));
  ASSIGN_OR_RETURN(std::vector<BoundMember> bound, source->Bind(shared));
  ASSIGN_OR_RETURN(std::vector<SharedStream> layout, source->Layout(shared, bound));
  const SampleSpec& spec = bound[member].spec;
  // As a pipeline does when it opens: whether this machine decodes each video stream where the
  // config puts it, before any sample.
  RETURN_IF_ERROR(CheckVideoBackends(spec, source->dataset(member).manifest()));
  // With clips, sample i of --epoch is the clip a pipeline with this --seed serves as sample i.
  const Dataset& ds = source->dataset(member);
  ASSIGN_OR_RETURN(SampleIndex index,
                   SampleIndex::Build(ds, spec.anchor_stream, {}, spec.clips,
                                      OrderKey(ds.manifest().fingerprint, o.seed)));
  if (index.size() == 0) return absl::FailedPreconditionError("the dataset has no samples");
  ASSIGN_OR_RETURN(std::vector<uint64_t> picks, PickSamples(o, index, spec));

  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) return absl::UnavailableError(StrCat("cannot create ", o.out, ": ", ec.message()));

  const MemberSamples m{source.get(), member, &shared, &bound, &layout, &index,
                        source->is_mixture() ? source->member(member).name : ""};
  const auto t0 = std::chrono::steady_clock::now();
  const SampleRun run = WriteSamples(o, m, picks);
  if (o.progress) std::fprintf(stderr, "\n");
  RETURN_IF_ERROR(run.first_error);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WriteSummary(o, m, picks.size(), run, secs);
  return absl::OkStatus();
}


// `conveyor sample`: its flags and its run (tools/command.h).
class SampleCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand(
        "sample", "Assemble samples as training sees them and write each as .npy files + meta.json");
    c->add_option("dataset", o_.dataset, "Dataset path or URL, or a mixture file")->required();
    c->add_option("--config", o_.config,
                   "Sample spec (YAML, see docs/sampling.md); default: every stream at t=0");
    c->add_option("--member", o_.member, "A mixture's dataset whose samples to write (default: the first)");
    c->add_option("--count", o_.count, "Number of samples")->check(CLI::PositiveNumber);
    c->add_option("--out", o_.out, "Output directory (one sub-folder per sample)")->required();
    c->add_option("--seed", o_.seed, "Augmentation seed");
    c->add_option("--epoch", o_.epoch, "Epoch (augmentation draws depend on it)");
    c->add_option("--start", o_.start, "First sample index")->check(CLI::NonNegativeNumber);
    c->add_option("--stride", o_.stride, "Step between sample indices (default: spread evenly)")
        ->check(CLI::NonNegativeNumber);
    c->add_option("--indices", o_.indices, "Explicit sample indices (comma-separated)")
        ->delimiter(',');
    c->add_option("--threads", o_.threads, "Worker threads (0 = one per core)")
        ->check(CLI::NonNegativeNumber);
    c->add_flag("--quiet", quiet_, "No progress output");
    return c;
  }
  absl::Status Run() override {
    o_.progress = !quiet_;
    return RunSample(o_);
  }

 private:
  SampleOptions o_;
  bool quiet_ = false;
};

std::unique_ptr<Command> NewSampleCommand() {
  return std::make_unique<SampleCommand>();
}

}  // namespace conveyor::tools
