// Mixtures (docs/mixtures.md): the schedule gives every dataset floor or ceil of its share of
// every global batch and stays close to the share over any stretch; a mixture of three synthetic
// datasets of different cameras, dimensions and rates plus an imported one is exact at any
// thread and consumer count and from any resume cursor (mid-epoch, across a member's epoch
// boundary); streams a dataset lacks arrive as padding; bad mixtures are refused with a message
// naming dataset and stream; `conveyor batches` and `conveyor serve` + `fetch` agree on it.
#include "shuffle/mixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <tuple>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "pipeline/pipeline.h"
#include "pipeline/source.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

// ---- the schedule alone ----------------------------------------------------------------------

TEST(MixtureScheduleTest, EveryBatchGetsFloorOrCeilOfEachShare) {
  const std::vector<std::vector<double>> cases = {
      {1, 1, 1}, {0.5, 0.25, 0.25}, {3, 1}, {0.7, 0.2, 0.07, 0.03}, {1, 2, 3, 4, 5, 6, 7}, {1}};
  for (const auto& w : cases) {
    for (uint64_t batch : {1ull, 7ull, 32ull, 100ull, 256ull}) {
      auto s = MixtureSchedule::Create(w, batch, 500, 12345);
      ASSERT_TRUE(s.ok()) << s.status();
      const double total = [&] { double t = 0; for (double x : w) t += x; return t; }();
      std::vector<uint64_t> sum(w.size(), 0);
      std::vector<uint32_t> c;
      for (uint64_t step = 0; step < 500; ++step) {
        s->Counts(step, &c);
        uint64_t all = 0;
        for (size_t k = 0; k < w.size(); ++k) {
          const double share = batch * w[k] / total;
          EXPECT_GE(c[k], std::floor(share) - 1e-9) << "batch " << batch << " step " << step;
          EXPECT_LE(c[k], std::ceil(share) + 1e-9) << "batch " << batch << " step " << step;
          all += c[k];
          sum[k] += c[k];
        }
        ASSERT_EQ(all, batch);
      }
      // Over 500 steps every dataset is within a few samples of its exact share (the
      // low-discrepancy sequence: not a random walk that drifts with sqrt(steps)).
      for (size_t k = 0; k < w.size(); ++k) {
        const double want = 500.0 * batch * w[k] / total;
        EXPECT_LE(std::abs(static_cast<double>(sum[k]) - want), 3.0)
            << "dataset " << k << " of " << w.size() << ", batch " << batch;
        EXPECT_EQ(sum[k], s->per_epoch()[k]);
      }
    }
  }
}

TEST(MixtureScheduleTest, PositionsAreABijectionOntoMemberRanks) {
  auto s = MixtureSchedule::Create({0.6, 0.3, 0.1}, 50, 40, 7);
  ASSERT_TRUE(s.ok()) << s.status();
  for (uint64_t epoch : {0ull, 3ull}) {
    for (uint64_t step = 0; step < 40; ++step) {
      const MixtureSchedule::Step st = s->At(epoch, step);
      std::set<std::pair<uint32_t, uint32_t>> seen;
      for (uint64_t p = 0; p < 50; ++p) {
        const uint32_t k = st.member(p), r = st.rank(p);
        ASSERT_LT(k, 3u);
        ASSERT_LT(r, st.counts()[k]);
        ASSERT_TRUE(seen.insert({k, r}).second) << "step " << step << " position " << p;
      }
    }
  }
  // Before() adds up the steps, and an epoch's counts repeat every epoch.
  std::vector<uint32_t> c;
  std::vector<uint64_t> b = s->Before(2, 0);
  for (uint64_t step = 0; step < 40; ++step) {
    EXPECT_EQ(b, s->Before(2, step));
    s->Counts(step, &c);
    for (size_t k = 0; k < 3; ++k) b[k] += c[k];
  }
  EXPECT_EQ(b, s->Before(3, 0));
}

TEST(MixtureScheduleTest, RefusesBadWeights) {
  EXPECT_FALSE(MixtureSchedule::Create({}, 8, 10, 0).ok());
  EXPECT_FALSE(MixtureSchedule::Create({1, 0}, 8, 10, 0).ok());
  EXPECT_FALSE(MixtureSchedule::Create({1, -1}, 8, 10, 0).ok());
  EXPECT_FALSE(MixtureSchedule::Create({1, NAN}, 8, 10, 0).ok());
  auto tiny = MixtureSchedule::Create({1, 1e-12}, 8, 10, 0);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("raise its weight"), std::string::npos) << tiny.status();
}

// ---- a real mixture --------------------------------------------------------------------------

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// Three synthetic datasets and an imported one:
//   a: 2 cameras 64x48, state 14, 50 Hz, 3 episodes of 3 s        (450 samples)
//   b: 1 camera at 15 fps, state 7 (padded to 14), 10 Hz          (40 samples: many epochs)
//   c: 3 cameras 96x64 (cam2 serves as cam1), 25 Hz               (150 samples)
//   d: imported from files named top.mp4 / joints.npy / action.npy, no cam1 (60 samples)
class MixtureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string cli = CONVEYOR_CLI;
    auto synth = [&](const std::string& name, const std::string& flags) {
      auto r = RunCommand(cli + " synth --quiet --out " + ShellQuote(dir_->Join(name)) + " " + flags);
      ASSERT_EQ(r.exit_code, 0) << r.output;
    };
    synth("a", "--episodes 3 --episode-seconds 3 --cameras 2 --size 64x48 --state-dim 14 "
               "--action-dim 14 --lowdim-rate 50 --audio-codec none --seed 1");
    synth("b", "--episodes 2 --episode-seconds 2 --cameras 1 --size 64x48 --fps 15 --gop 15 "
               "--state-dim 7 --action-dim 14 --lowdim-rate 10 --audio-codec none --seed 2");
    synth("c", "--episodes 2 --episode-seconds 3 --cameras 3 --size 96x64 --state-dim 14 "
               "--action-dim 14 --lowdim-rate 25 --audio-codec none --seed 3");
    synth("e", "--episodes 2 --episode-seconds 3 --cameras 1 --size 64x48 --state-dim 14 "
               "--action-dim 14 --lowdim-rate 10 --audio-codec none --seed 4");
    // d: e's streams written out as ordinary files under other names, then imported.
    for (int ep = 0; ep < 2; ++ep) {
      const std::string folder = dir_->Join("files/ep_000" + std::to_string(ep));
      auto x = [&](const std::string& stream, const std::string& file) {
        auto r = RunCommand(cli + " extract " + ShellQuote(dir_->Join("e")) + " --episode " +
                            std::to_string(ep) + " --stream " + stream + " --out " +
                            ShellQuote(folder + "/" + file));
        ASSERT_EQ(r.exit_code, 0) << r.output;
      };
      ASSERT_EQ(RunCommand("mkdir -p " + ShellQuote(folder)).exit_code, 0);
      x("cam0", "top.mp4");
      x("observation.state", "joints.npy");
      x("action", "action.npy");
      WriteText(folder + "/episode.json",
                R"({"instruction": "stack the blocks", "rates": {"joints": 10, "action": 10}})");
    }
    auto r = RunCommand(cli + " import --quiet --from " + ShellQuote(dir_->Join("files")) +
                        " --out " + ShellQuote(dir_->Join("d")) + " --name imported");
    ASSERT_EQ(r.exit_code, 0) << r.output;

    WriteText(dir_->Join("mix.yaml"), R"(
mixture:
  name: robots
  tag: dataset_id
  pad: {observation.state: 14}
  datasets:
    - {name: a, uri: a, weight: 0.4}
    - {name: b, uri: b, weight: 0.2, missing: [cam1]}
    - {name: c, uri: c, weight: 0.2, streams: {cam1: cam2}}
    - name: d
      uri: d
      weight: 0.2
      tag: 7
      streams: {cam0: top, observation.state: joints}
      missing: [cam1]
)");
    config_ = R"(
anchor: action
streams:
  cam0: {delta_timestamps: [-0.1, 0.0], size: [48, 64], augment: {hflip: 0.5}}
  cam1: {size: [48, 64]}
  observation.state: {normalize: mean_std}
  action: {delta_timestamps: {start: 0, step: 0.1, count: 4}}
  instruction: {}
pipeline: {seed: 3, global_batch_size: 12, schedule: {mode: gop, block_steps: 10, window_blocks: 3}}
)";
    WriteText(dir_->Join("config.yaml"), config_);
  }
  static void TearDownTestSuite() { delete dir_; }

  struct Line {
    Cursor cursor;
    std::vector<SampleId> ids;
    std::map<std::string, std::vector<uint8_t>> tensors;
    bool operator==(const Line&) const = default;
  };

  static std::unique_ptr<Source> Open() {
    auto s = Source::Open(dir_->Join("mix.yaml"));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static absl::StatusOr<std::pair<SampleSpec, PipelineOptions>> Config(const Source& src,
                                                                       const std::string& text) {
    absl::StatusOr<SampleSpec> spec = SampleSpec::FromYaml(text, src.manifest(), "config.yaml");
    if (!spec.ok()) return spec.status();
    PipelineOptions o;
    absl::Status st = o.MergeYaml(text, *spec, src.manifest(), "config.yaml");
    if (!st.ok()) return st;
    o.queue_bytes = 64ull << 20;
    return std::make_pair(*spec, o);
  }

  static std::vector<Line> Run(int threads, uint32_t consumer, uint32_t consumers, Cursor start,
                               int steps, const std::string& config = config_) {
    std::unique_ptr<Source> src = Open();
    std::vector<Line> out;
    if (!src) return out;
    auto c = Config(*src, config);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return out;
    PipelineOptions o = c->second;
    o.threads = threads;
    o.consumer = consumer;
    o.consumers = consumers;
    auto p = Pipeline::Create(*src, c->first, o, start);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return out;
    for (int i = 0; i < steps; ++i) {
      auto next = (*p)->Next();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) break;
      const Batch* b = &**next;
      Line l{b->cursor, b->ids, {}};
      for (const TensorView& t : b->tensors) l.tensors[t.name].assign(b->data(t), b->data(t) + t.bytes);
      out.push_back(std::move(l));
    }
    return out;
  }

  static TempDir* dir_;
  static std::string config_;
};
TempDir* MixtureTest::dir_ = nullptr;
std::string MixtureTest::config_;

TEST_F(MixtureTest, ManifestIsTheUnionUnderSharedNames) {
  std::unique_ptr<Source> src = Open();
  ASSERT_TRUE(src);
  EXPECT_TRUE(src->is_mixture());
  EXPECT_EQ(src->size(), 4u);
  const Manifest& m = src->manifest();
  EXPECT_EQ(m.name, "robots");
  EXPECT_EQ(m.fingerprint.size(), 16u);
  for (const char* s : {"cam0", "cam1", "observation.state", "action", "instruction"}) {
    EXPECT_GE(m.StreamIndex(s), 0) << s;
  }
  EXPECT_LT(m.StreamIndex("top"), 0);
  EXPECT_EQ(m.streams[m.StreamIndex("observation.state")].shape, (std::vector<int64_t>{14}));
  // The fingerprint covers the weights: another weight is another mixture (another order).
  std::string text;
  {
    std::ifstream f(dir_->Join("mix.yaml"));
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t at = text.find("weight: 0.4");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 11, "weight: 0.5");
  auto other = Source::MixtureFromYaml(text, "other.yaml", dir_->path());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->manifest().fingerprint, m.fingerprint);
}

TEST_F(MixtureTest, EveryBatchHoldsEachDatasetsShare) {
  const std::vector<Line> lines = Run(2, 0, 1, Cursor{0, 0}, 60);  // past one mixture epoch
  ASSERT_EQ(lines.size(), 60u);
  const double share[4] = {0.4, 0.2, 0.2, 0.2};
  std::map<uint32_t, uint64_t> total;
  for (const Line& l : lines) {
    std::map<uint32_t, uint32_t> per;
    for (const SampleId& id : l.ids) ++per[id.dataset];
    for (uint32_t k = 0; k < 4; ++k) {
      EXPECT_GE(per[k], std::floor(12 * share[k])) << l.cursor.epoch << ":" << l.cursor.step;
      EXPECT_LE(per[k], std::ceil(12 * share[k])) << l.cursor.epoch << ":" << l.cursor.step;
      total[k] += per[k];
    }
  }
  EXPECT_EQ(total[0] + total[1] + total[2] + total[3], 60u * 12);
  // Each tensor is there for every sample, with the shared shapes (cam1 48x64 everywhere).
  const Line& l = lines[0];
  EXPECT_EQ(l.tensors.at("cam1").size(), 12u * 1 * 48 * 64 * 3);
  EXPECT_EQ(l.tensors.at("observation.state").size(), 12u * 1 * 14 * 4);
  EXPECT_EQ(l.tensors.at("observation.state_dim_is_pad").size(), 12u * 14);
  EXPECT_EQ(l.tensors.at("dataset_id").size(), 12u * 4);
}

TEST_F(MixtureTest, MissingStreamsArePaddingAndTagsNameTheDataset) {
  const std::vector<Line> lines = Run(2, 0, 1, Cursor{0, 0}, 8);
  ASSERT_EQ(lines.size(), 8u);
  bool saw[4] = {false, false, false, false};
  for (const Line& l : lines) {
    const auto& cam1_pad = l.tensors.at("cam1_is_pad");
    const auto& dim_pad = l.tensors.at("observation.state_dim_is_pad");
    const auto& cam1 = l.tensors.at("cam1");
    const auto& tags = l.tensors.at("dataset_id");
    const size_t frame = 48 * 64 * 3;
    for (size_t i = 0; i < l.ids.size(); ++i) {
      const uint32_t k = l.ids[i].dataset;
      saw[k] = true;
      int32_t tag = 0;
      std::memcpy(&tag, tags.data() + 4 * i, 4);
      EXPECT_EQ(tag, k == 3 ? 7 : static_cast<int32_t>(k));
      const bool lacks_cam1 = k == 1 || k == 3;
      EXPECT_EQ(cam1_pad[i], lacks_cam1 ? 1 : 0) << "dataset " << k;
      bool all_zero = true;
      for (size_t j = 0; j < frame; ++j) all_zero = all_zero && cam1[i * frame + j] == 0;
      EXPECT_EQ(all_zero, lacks_cam1) << "dataset " << k;
      // b's state has 7 dimensions: the last 7 of 14 are padding; the others have all 14.
      for (size_t d = 0; d < 14; ++d) {
        EXPECT_EQ(dim_pad[i * 14 + d], k == 1 && d >= 7 ? 1 : 0) << "dataset " << k << " dim " << d;
      }
    }
  }
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(saw[k]) << "dataset " << k << " never appeared";
}

// Each dataset's state is normalized with that dataset's own statistics (under its own stream
// name: d's are those of "joints"), not the mixture's: against the same batches without
// normalization, value for value, as sample_spec.cc computes it in float32.
TEST_F(MixtureTest, EachDatasetIsNormalizedWithItsOwnStatistics) {
  std::string raw_config = config_;
  const std::string norm = "observation.state: {normalize: mean_std}";
  const size_t at = raw_config.find(norm);
  ASSERT_NE(at, std::string::npos);
  raw_config.replace(at, norm.size(), "observation.state: {}");
  const std::vector<Line> normalized = Run(2, 0, 1, Cursor{0, 0}, 10);
  const std::vector<Line> raw = Run(2, 0, 1, Cursor{0, 0}, 10, raw_config);
  ASSERT_EQ(normalized.size(), 10u);
  ASSERT_EQ(raw.size(), 10u);
  const char* member[4] = {"a", "b", "c", "d"};
  const char* state[4] = {"observation.state", "observation.state", "observation.state", "joints"};
  std::vector<StreamStats> stats(4);
  for (int k = 0; k < 4; ++k) {
    auto src = Source::Open(dir_->Join(member[k]));
    ASSERT_TRUE(src.ok()) << src.status();
    auto it = (*src)->manifest().stats.find(state[k]);
    ASSERT_NE(it, (*src)->manifest().stats.end()) << member[k];
    stats[k] = it->second;
  }
  // Different robots: the datasets' means differ, so pooled statistics would show.
  EXPECT_NE(stats[0].mean[0], stats[1].mean[0]);
  int checked[4] = {0, 0, 0, 0};
  for (size_t b = 0; b < raw.size(); ++b) {
    ASSERT_EQ(raw[b].ids, normalized[b].ids) << "normalization changed the order";
    const auto& x = raw[b].tensors.at("observation.state");
    const auto& y = normalized[b].tensors.at("observation.state");
    for (size_t i = 0; i < raw[b].ids.size(); ++i) {
      const uint32_t k = raw[b].ids[i].dataset;
      const size_t dim = stats[k].mean.size();  // b: 7 of the 14 (the rest is padding)
      for (size_t d = 0; d < dim; ++d) {
        float v = 0, got = 0;
        std::memcpy(&v, x.data() + 4 * (i * 14 + d), 4);
        std::memcpy(&got, y.data() + 4 * (i * 14 + d), 4);
        const float want = (v - static_cast<float>(stats[k].mean[d])) *
                           static_cast<float>(1.0 / (stats[k].std[d] + 1e-8));
        EXPECT_FLOAT_EQ(got, want) << "dataset " << member[k] << " sample " << i << " dim " << d;
      }
      ++checked[k];
    }
  }
  for (int k = 0; k < 4; ++k) EXPECT_GT(checked[k], 0) << member[k];
}

// Packing takes a mixture's variable token counts: a dataset lacking cam1 (padding, which costs
// nothing) gives shorter samples. The packed batches hold the unpacked batches' samples, are the
// same at any thread count, and each sample's stream lengths say what its dataset has.
TEST_F(MixtureTest, PackedBatchesTakeEachDatasetsTokenCounts) {
  const std::string packed_config = config_ + R"(packing:
  max_tokens: 64
  tokens:
    cam0: {per_frame: 8}
    cam1: {per_frame: 8}
    observation.state: {per_step: 1}
    action: {per_step: 1}
)";
  const std::vector<Line> stacked = Run(2, 0, 1, Cursor{0, 0}, 6);
  const std::vector<Line> packed = Run(2, 0, 1, Cursor{0, 0}, 6, packed_config);
  ASSERT_EQ(packed.size(), 6u);
  EXPECT_EQ(Run(1, 0, 1, Cursor{0, 0}, 6, packed_config), packed);
  std::set<int32_t> cam1_lengths[4];
  for (size_t b = 0; b < packed.size(); ++b) {
    std::vector<SampleId> want = stacked[b].ids, got = packed[b].ids;
    auto by_index = [](const SampleId& x, const SampleId& y) {
      return std::tie(x.dataset, x.index) < std::tie(y.dataset, y.index);
    };
    std::sort(want.begin(), want.end(), by_index);
    std::sort(got.begin(), got.end(), by_index);
    EXPECT_EQ(got, want) << "step " << b << ": packing changed which samples the batch holds";
    const auto& lengths = packed[b].tensors.at("stream_lengths");  // int32 [n, K], spec order
    const size_t n = packed[b].ids.size(), k = lengths.size() / 4 / n;
    ASSERT_EQ(k, 5u);  // cam0, cam1, observation.state, action, instruction
    for (size_t i = 0; i < n; ++i) {
      int32_t cam1 = 0;
      std::memcpy(&cam1, lengths.data() + 4 * (i * k + 1), 4);
      cam1_lengths[packed[b].ids[i].dataset].insert(cam1);
    }
  }
  // a and c have cam1 (one frame, 8 tokens); b and d lack it: padding costs nothing.
  EXPECT_EQ(cam1_lengths[0], std::set<int32_t>{8});
  EXPECT_EQ(cam1_lengths[2], std::set<int32_t>{8});
  EXPECT_EQ(cam1_lengths[1], std::set<int32_t>{0});
  EXPECT_EQ(cam1_lengths[3], std::set<int32_t>{0});
}

TEST_F(MixtureTest, SameBatchesAtAnyThreadCountAndFromAnyCursor) {
  const std::vector<Line> full = Run(1, 0, 1, Cursor{0, 0}, 70);
  ASSERT_EQ(full.size(), 70u);
  EXPECT_EQ(Run(3, 0, 1, Cursor{0, 0}, 70), full);
  std::unique_ptr<Source> src = Open();
  ASSERT_TRUE(src);
  auto c = Config(*src, config_);
  ASSERT_TRUE(c.ok()) << c.status();
  auto p = Pipeline::Create(*src, c->first, c->second, Cursor{0, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  const uint64_t steps = (*p)->steps_per_epoch();
  EXPECT_EQ(steps, (450u + 40 + 150 + 60) / 12);
  // b (40 samples, 2-3 per batch) wraps into its second epoch around step 16: resume before,
  // at and after that boundary, mid-epoch, and in the second mixture epoch.
  for (uint64_t at : std::vector<uint64_t>{1, 15, 16, 17, 30, steps, steps + 3}) {
    const Cursor cur{at / steps, at % steps};
    const std::vector<Line> resumed = Run(2, 0, 1, cur, 5);
    ASSERT_EQ(resumed.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(resumed[i], full[at + i]) << "resumed at " << at;
  }
  // b really went through more than one of its epochs in that stretch.
  uint64_t from_b = 0;
  for (const Line& l : full) {
    for (const SampleId& id : l.ids) from_b += id.dataset == 1 ? 1 : 0;
  }
  EXPECT_GT(from_b, 2u * 40);
}

// A mixture's order is laid out per global batch (12 here): a position cursor at a batch boundary
// resumes it exactly; one inside a batch (a resume at another batch size) is refused, saying why.
TEST_F(MixtureTest, PositionCursorsResumeAtTheRecordedBatchSizeOnly) {
  const std::vector<Line> full = Run(1, 0, 1, Cursor{0, 0}, 12);
  ASSERT_EQ(full.size(), 12u);
  EXPECT_EQ(full[7].cursor, (Cursor{0, 7, 84}));
  EXPECT_EQ(Run(1, 0, 1, Cursor{0, 0, 84}, 5),
            std::vector<Line>(full.begin() + 7, full.begin() + 12));
  std::unique_ptr<Source> src = Open();
  ASSERT_TRUE(src);
  auto c = Config(*src, config_);
  ASSERT_TRUE(c.ok()) << c.status();
  auto p = Pipeline::Create(*src, c->first, c->second, Cursor{0, 0, 90});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(p.status().message()).find("not at a batch boundary of this mixture"),
            std::string::npos)
      << p.status();
}

TEST_F(MixtureTest, ConsumersSplitTheSameGlobalBatches) {
  const std::vector<Line> one = Run(2, 0, 1, Cursor{0, 5}, 6);
  ASSERT_EQ(one.size(), 6u);
  for (uint32_t n : {2u, 4u}) {
    std::vector<std::vector<Line>> parts;
    for (uint32_t i = 0; i < n; ++i) parts.push_back(Run(1, i, n, Cursor{0, 5}, 6));
    for (size_t s = 0; s < 6; ++s) {
      std::vector<SampleId> ids;
      for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(parts[i].size(), 6u);
        ids.insert(ids.end(), parts[i][s].ids.begin(), parts[i][s].ids.end());
      }
      EXPECT_EQ(ids, one[s].ids) << n << " consumers, step " << s;
      // The tensors too: consumer i's slice is bytes [i/n, (i+1)/n) of each stacked tensor.
      for (const auto& [name, bytes] : one[s].tensors) {
        std::vector<uint8_t> joined;
        for (uint32_t i = 0; i < n; ++i) {
          const auto& part = parts[i][s].tensors.at(name);
          joined.insert(joined.end(), part.begin(), part.end());
        }
        if (name == "instruction" || name == "instruction_mask") continue;  // padded per batch
        EXPECT_EQ(joined, bytes) << n << " consumers, step " << s << ", tensor " << name;
      }
    }
  }
}

TEST_F(MixtureTest, BadMixturesAreRefusedNamingDatasetAndStream) {
  auto refused = [&](const std::string& yaml, const std::string& want) {
    auto s = Source::MixtureFromYaml(yaml, "bad.yaml", dir_->path());
    std::string message;
    if (!s.ok()) {
      message = std::string(s.status().message());
    } else {
      auto c = Config(**s, config_);
      if (!c.ok()) {
        message = std::string(c.status().message());
      } else {
        auto p = Pipeline::Create(**s, c->first, c->second, Cursor{0, 0});
        if (p.ok()) return ::testing::AssertionFailure() << "accepted";
        message = std::string(p.status().message());
      }
    }
    if (message.find(want) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << want << "': " << message;
    }
    return ::testing::AssertionSuccess();
  };
  // A member that is not there is an error, never a thinner mixture.
  EXPECT_TRUE(refused("mixture: {datasets: [{name: a, uri: a}, {name: gone, uri: nowhere}]}", "'gone'"));
  // A stream the config asks for that a member neither has nor declares missing.
  EXPECT_TRUE(refused("mixture: {datasets: [{name: a, uri: a}, {name: b, uri: b}]}", "dataset 'b'"));
  // Shapes that cannot stack: b's state has 7 dimensions, a's 14, and no pad.
  EXPECT_TRUE(refused("mixture: {datasets: [{name: a, uri: a}, {name: b, uri: b, missing: [cam1]}]}",
                      "observation.state"));
  // A rename to a stream the member does not have.
  EXPECT_TRUE(refused("mixture: {datasets: [{name: a, uri: a, streams: {cam1: cam9}}]}", "cam9"));
  EXPECT_TRUE(refused("mixture: {datasets: [{name: a, uri: a, weight: 0}]}", "weight"));
  EXPECT_TRUE(refused("mixture: {datasets: [{name: a, uri: a}, {name: a, uri: c}]}", "used twice"));
  EXPECT_TRUE(refused("mixture: {datasets: [{name: a, uri: a, wieght: 2}]}", "wieght"));
}

TEST_F(MixtureTest, BatchesCliAndServedBatchesAgree) {
  const std::string cli = CONVEYOR_CLI;
  const std::string mix = ShellQuote(dir_->Join("mix.yaml"));
  const std::string cfg = ShellQuote(dir_->Join("config.yaml"));
  auto offline = RunCommand(cli + " batches " + mix + " --config " + cfg +
                            " --steps 6 --cursor 0:14 --digest --ids --stats");
  ASSERT_EQ(offline.exit_code, 0) << offline.output;
  EXPECT_NE(offline.output.find("mixture robots (4 datasets"), std::string::npos) << offline.output;
  EXPECT_NE(offline.output.find("realized"), std::string::npos) << offline.output;
  // Samples of the second dataset and later print as DATASET:EPISODE/STEP.
  EXPECT_NE(offline.output.find(" 1:"), std::string::npos) << offline.output;

  const std::string ready = dir_->Join("ready");
  RunCommand("rm -f " + ShellQuote(ready));
  auto server = RunCommand(cli + " serve " + mix + " --config " + cfg +
                           " --listen 127.0.0.1:0 --threads 2 --ready-file " + ShellQuote(ready) +
                           " > " + ShellQuote(dir_->Join("serve.log")) + " 2>&1 & echo $!");
  ASSERT_EQ(server.exit_code, 0);
  const std::string pid = server.output.substr(0, server.output.find('\n'));
  auto wait = RunCommand("for i in $(seq 300); do [ -s " + ShellQuote(ready) +
                         " ] && exit 0; sleep 0.1; done; exit 1");
  ASSERT_EQ(wait.exit_code, 0) << RunCommand("cat " + ShellQuote(dir_->Join("serve.log"))).output;
  auto addr = RunCommand("cut -d' ' -f1 " + ShellQuote(ready));
  const std::string address = addr.output.substr(0, addr.output.find('\n'));
  auto served = RunCommand(cli + " fetch --servers " + address + " --steps 6 --cursor 0:14 --digest --ids");
  RunCommand("kill " + pid);
  ASSERT_EQ(served.exit_code, 0) << served.output;
  // Every batch line of the server equals the offline one.
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      const std::string l = text.substr(at, nl - at);
      if (!l.empty() && std::isdigit(static_cast<unsigned char>(l[0])) &&
          l.find(" consumer ") != std::string::npos) {
        out.push_back(l);
      }
      at = nl + 1;
    }
    return out;
  };
  EXPECT_EQ(lines(served.output), lines(offline.output));
  EXPECT_EQ(lines(served.output).size(), 6u);
}

TEST_F(MixtureTest, SampleAndBenchTakeAMixture) {
  const std::string cli = CONVEYOR_CLI;
  const std::string mix = ShellQuote(dir_->Join("mix.yaml"));
  const std::string cfg = ShellQuote(dir_->Join("config.yaml"));
  // `conveyor sample --member`: one dataset's samples as a batch holds them, named in meta.json.
  const std::string out = dir_->Join("samples_b");
  auto r = RunCommand(cli + " sample " + mix + " --config " + cfg + " --member b --count 2 --quiet --out " +
                      ShellQuote(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string meta = RunCommand("cat " + ShellQuote(out + "/000000/meta.json")).output;
  EXPECT_NE(meta.find("\"dataset\": \"b\""), std::string::npos) << meta;
  EXPECT_NE(meta.find("cam1_is_pad"), std::string::npos) << meta;  // b lacks cam1: padding
  EXPECT_NE(meta.find("observation.state_dim_is_pad"), std::string::npos) << meta;
  auto unknown = RunCommand(cli + " sample " + mix + " --config " + cfg + " --member nope --count 1 --quiet --out " +
                            ShellQuote(dir_->Join("samples_x")));
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.output.find("a, b, c, d"), std::string::npos) << unknown.output;

  // `conveyor bench`: the end-to-end rows, with each dataset's requested and realized share.
  const std::string json_path = dir_->Join("bench.json");
  auto b = RunCommand(cli + " bench " + mix + " --config " + cfg + " --threads 1 --seconds 0.3 --json " +
                      ShellQuote(json_path));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string doc = RunCommand("cat " + ShellQuote(json_path)).output;
  EXPECT_NE(doc.find("\"realized_share\""), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"requested_share\""), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"gRPC to a client\""), std::string::npos) << doc;
  auto no_config = RunCommand(cli + " bench " + mix + " --threads 1 --seconds 0.1");
  EXPECT_NE(no_config.exit_code, 0);
  EXPECT_NE(no_config.output.find("is a mixture"), std::string::npos) << no_config.output;
}

}  // namespace
}  // namespace conveyor
