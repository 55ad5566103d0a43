// Clips per video (`clips:` in the spec, docs/sampling.md "Clips per video"): a sample is one of
// an episode's clips of the epoch, K per video or one per stride, at anchors drawn from (seed,
// epoch, episode) so that the whole clip fits the episode. The anchors are pure functions: the
// same batches at any thread or consumer count, from any resume cursor, and in the coverage
// ledger's EpochSequence; a new set of clips each epoch.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "datasets/sample_index.h"
#include "pipeline/pipeline.h"
#include "pipeline/source.h"
#include "sample/sample_spec.h"
#include "shuffle/order.h"
#include "tests/support/batch_lines.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

class ClipsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // 10 episodes of 1.5 to 3 s at 24 fps (36 to 72 frames): every one holds a 16-frame clip.
    auto r = RunCommand(std::string(CONVEYOR_CLI) + " synth --quiet --out " +
                        ShellQuote(dir_->Join("ds")) +
                        " --episodes 10 --episode-seconds 1.5:3 --cameras 1 --fps 24 --size 64x48 "
                        "--seed 3");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto d = Dataset::Open(dir_->Join("ds"));
    ASSERT_TRUE(d.ok()) << d.status();
    dataset_ = d->release();
  }
  static void TearDownTestSuite() {
    delete dataset_;
    delete dir_;
  }

  static std::string Config(const std::string& clips) {
    return "anchor: cam0\n"
           "clips: " + clips + "\n"
           "streams:\n"
           "  cam0: {delta_timestamps: {start: 0.0, step: 0.041666666666666664, count: 16}}\n"
           "  instruction: {}\n";
  }
  static SampleSpec Spec(const std::string& clips) {
    auto s = SampleSpec::FromYaml(Config(clips), dataset_->manifest(), "clips.yaml");
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : SampleSpec{};
  }

  using Line = testing::BatchLine;
  static std::vector<Line> Run(const SampleSpec& spec, PipelineOptions o, Cursor start, int steps) {
    return testing::RunBatches(*dataset_, spec, std::move(o), start, steps);
  }
  static PipelineOptions Options(int threads, uint64_t batch = 5) {
    PipelineOptions o;
    o.seed = 7;
    o.global_batch_size = batch;
    o.threads = threads;
    o.queue_bytes = 32ull << 20;
    return o;
  }
  static uint32_t Length(uint64_t e) { return dataset_->episodes().length(e, 0); }

  static TempDir* dir_;
  static Dataset* dataset_;
};
TempDir* ClipsTest::dir_ = nullptr;
Dataset* ClipsTest::dataset_ = nullptr;

TEST_F(ClipsTest, TheSpecSaysHowFarAClipReaches) {
  const SampleSpec spec = Spec("{per_video: 1}");
  EXPECT_EQ(spec.clips.per_episode, 1u);
  EXPECT_EQ(spec.clips.back_steps, 0u);
  EXPECT_EQ(spec.clips.forward_steps, 15u);  // 16 frames at the anchor's 24 fps
  EXPECT_EQ(Spec("{stride: clip}").clips.stride, 16u);
  EXPECT_EQ(Spec("{stride: 5}").clips.stride, 5u);
  for (const std::string bad : {"{per_video: 1, stride: 4}", "{}", "{per_video: 0}", "{stride: -1}",
                                "{every: 2}", "3"}) {
    auto s = SampleSpec::FromYaml(Config(bad), dataset_->manifest(), "clips.yaml");
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(std::string(s.status().message()).find("clips"), std::string::npos) << s.status();
  }
}

// K stratified clips per episode, each whole inside its episode; the same for the same (key,
// epoch), another set in another epoch.
TEST_F(ClipsTest, PerVideoClipsFitTheirEpisodeAndMoveEachEpoch) {
  const SampleSpec spec = Spec("{per_video: 3}");
  auto index = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, spec.clips, 99);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 30u);
  EXPECT_EQ(index->short_episodes(), 0u);
  auto again = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, spec.clips, 99);
  auto other_key = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, spec.clips, 100);
  uint64_t moved = 0, other = 0;
  for (uint64_t s = 0; s < index->size(); ++s) {
    const auto at = index->Locate(s, 0);
    EXPECT_EQ(at.episode, s / 3);
    const uint32_t len = Length(at.episode);
    EXPECT_LE(at.step + 15u, len - 1) << "sample " << s << ": the clip runs past the episode";
    // Stratified: clip j of 3 lies in the j-th third of the valid anchors.
    const uint64_t anchors = len - 15;
    const uint64_t j = s % 3;
    EXPECT_GE(at.step, j * anchors / 3);
    EXPECT_LT(at.step, (j + 1) * anchors / 3 + 1);
    EXPECT_EQ(again->Locate(s, 0).step, at.step);
    moved += index->Locate(s, 1).step != at.step ? 1 : 0;
    other += other_key->Locate(s, 0).step != at.step ? 1 : 0;
  }
  EXPECT_GT(moved, 15u);  // anchors of 7 to 19 choices per third: most move
  EXPECT_GT(other, 15u);
}

// stride: clips back to back from a random phase; an episode shorter than a clip gets one,
// padded, counted.
TEST_F(ClipsTest, StridedClipsAreBackToBackAndShortEpisodesAreCounted) {
  const SampleSpec spec = Spec("{stride: clip}");
  auto index = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, spec.clips, 5);
  ASSERT_TRUE(index.ok()) << index.status();
  uint64_t total = 0;
  std::set<uint32_t> phases;
  for (uint64_t e = 0; e < index->num_episodes(); ++e) {
    const uint32_t len = Length(e);
    const uint64_t n = (len - 16) / 16 + 1;
    ASSERT_EQ(index->EpisodeSamples(e), n) << "episode " << e << " of " << len << " frames";
    for (uint64_t epoch : {0u, 1u, 2u}) {
      const uint32_t first = index->Locate(index->EpisodeStart(e), epoch).step;
      phases.insert(first);
      for (uint64_t j = 0; j < n; ++j) {
        const auto at = index->Locate(index->EpisodeStart(e) + j, epoch);
        EXPECT_EQ(at.episode, e);
        EXPECT_EQ(at.step, first + 16 * j);
        EXPECT_LE(at.step + 15u, len - 1);
      }
    }
    total += n;
  }
  EXPECT_EQ(index->size(), total);
  EXPECT_GT(phases.size(), 3u);  // the phase is drawn, not always 0

  ClipSampling long_clips = spec.clips;
  long_clips.forward_steps = 59;  // 60-frame clips: the episodes of under 60 frames are short
  auto padded = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, long_clips, 5);
  ASSERT_TRUE(padded.ok());
  uint64_t want_short = 0;
  for (uint64_t e = 0; e < dataset_->num_episodes(); ++e) want_short += Length(e) < 60 ? 1 : 0;
  ASSERT_GT(want_short, 0u);
  EXPECT_EQ(padded->short_episodes(), want_short);
  for (uint64_t e = 0; e < dataset_->num_episodes(); ++e) {
    if (Length(e) < 60) EXPECT_EQ(padded->Locate(padded->EpisodeStart(e), 3).step, 0u);
  }
}

// An epoch is one clip per video: every episode once, no padded frame; a new clip next epoch.
TEST_F(ClipsTest, AnEpochIsOneWholeClipPerVideo) {
  const SampleSpec spec = Spec("{per_video: 1}");
  const auto lines = Run(spec, Options(2), {0, 0}, 4);  // 10 clips / 5 per batch: two epochs
  ASSERT_EQ(lines.size(), 4u);
  std::map<uint64_t, uint32_t> first_epoch;
  uint64_t moved = 0;
  for (const Line& l : lines) {
    for (const SampleId& id : l.ids) {
      if (l.cursor.epoch == 0) {
        EXPECT_TRUE(first_epoch.emplace(id.episode, id.step).second) << "episode twice: " << id.episode;
      } else {
        moved += first_epoch.at(id.episode) != id.step ? 1 : 0;
      }
    }
    const auto& pad = l.tensors.at("cam0_is_pad");
    EXPECT_EQ(pad.size(), 5u * 16);
    EXPECT_EQ(std::count(pad.begin(), pad.end(), 0), static_cast<long>(pad.size())) << "padded frames";
    EXPECT_EQ(l.tensors.at("cam0").size(), 5u * 16 * 48 * 64 * 3);
  }
  EXPECT_EQ(first_epoch.size(), 10u);
  EXPECT_GT(moved, 5u);
}

// Exactness: the same bits at one and three threads, from a resume cursor, and in consumer
// slices; EpochSequence (the coverage ledger's expected samples) is what the batches hold.
TEST_F(ClipsTest, ClipsAreExactAtAnyThreadCountResumeAndConsumerCount) {
  for (const std::string clips : {"{per_video: 2}", "{stride: 12}"}) {
    SCOPED_TRACE(clips);
    const SampleSpec spec = Spec(clips);
    const auto one = Run(spec, Options(1), {0, 0}, 6);
    const auto three = Run(spec, Options(3), {0, 0}, 6);
    ASSERT_EQ(one.size(), 6u);
    EXPECT_TRUE(one == three);
    const auto resumed = Run(spec, Options(2), one[3].cursor, 3);
    ASSERT_EQ(resumed.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(resumed[i] == one[3 + i]) << i;

    std::vector<SampleId> joined;
    for (uint32_t c = 0; c < 5; ++c) {
      PipelineOptions o = Options(1);
      o.consumer = c;
      o.consumers = 5;
      const auto part = Run(spec, o, {0, 0}, 2);
      ASSERT_EQ(part.size(), 2u);
      joined.insert(joined.end(), part[1].ids.begin(), part[1].ids.end());
    }
    EXPECT_EQ(joined, one[1].ids);

    std::unique_ptr<Source> source = Source::Of(*dataset_);
    auto seq = Pipeline::EpochSequence(*source, spec, Options(1), 1);
    ASSERT_TRUE(seq.ok()) << seq.status();
    std::vector<SampleId> epoch1;
    auto p = Pipeline::Create(*dataset_, spec, Options(2), {1, 0});
    ASSERT_TRUE(p.ok());
    // Whole batches of 5: the epoch's last partial batch (if any) is not served.
    for (size_t step = 0; step < seq->size() / 5; ++step) {
      auto b = (*p)->Next();
      ASSERT_TRUE(b.ok() && b->has_value());
      ASSERT_EQ((*b)->cursor.epoch, 1u);
      epoch1.insert(epoch1.end(), (*b)->ids.begin(), (*b)->ids.end());
    }
    seq->resize(epoch1.size());
    EXPECT_EQ(*seq, epoch1);
  }
}

// A mixture draws each dataset's clips with that dataset's own anchor rate: at 24 and 12 fps the
// same 16-frame clip reaches 15 and 8 anchor steps (the spec's deltas are in seconds), and every
// served clip fits its episode.
TEST_F(ClipsTest, AMixtureDrawsEachDatasetsClipsAtItsOwnRate) {
  auto r = RunCommand(std::string(CONVEYOR_CLI) + " synth --quiet --out " +
                      ShellQuote(dir_->Join("slow")) +
                      " --episodes 6 --episode-seconds 2 --cameras 1 --fps 12 --size 64x48 --seed 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  testing::WriteFile(dir_->Join("mix.yaml"),
                     "mixture:\n  datasets:\n"
                     "    - {name: fast, uri: ds, weight: 1}\n"
                     "    - {name: slow, uri: slow, weight: 1}\n");
  auto source = Source::Open(dir_->Join("mix.yaml"));
  ASSERT_TRUE(source.ok()) << source.status();
  auto spec = SampleSpec::FromYaml(Config("{per_video: 1}"), (*source)->manifest(), "clips.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto bound = (*source)->Bind(*spec);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ((*bound)[0].spec.clips.forward_steps, 15u);
  EXPECT_EQ((*bound)[1].spec.clips.forward_steps, 8u);  // ceil(15 / 24 s * 12 fps)
  auto p = Pipeline::Create(**source, *spec, Options(2, 4), {0, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  std::set<uint32_t> members;
  for (int step = 0; step < 4; ++step) {
    auto b = (*p)->Next();
    ASSERT_TRUE(b.ok() && b->has_value()) << b.status();
    for (const SampleId& id : (*b)->ids) {
      members.insert(id.dataset);
      const uint32_t len = (*source)->dataset(id.dataset).episodes().length(id.episode, 0);
      EXPECT_LE(id.step + (id.dataset == 0 ? 15u : 8u), len - 1) << "member " << id.dataset;
    }
    const TensorView* pad = nullptr;
    for (const TensorView& t : (*b)->tensors) pad = t.name == "cam0_is_pad" ? &t : pad;
    ASSERT_NE(pad, nullptr);
    const uint8_t* bits = (*b)->data(*pad);
    EXPECT_EQ(std::count(bits, bits + pad->bytes, 0), static_cast<long>(pad->bytes));
  }
  EXPECT_EQ(members.size(), 2u);
}

// The decode-once schedule cuts runs of consecutive anchor steps; clips have none, so asking
// for both is refused with the reason.
TEST_F(ClipsTest, AGopScheduleWithClipsIsRefused) {
  const SampleSpec spec = Spec("{per_video: 1}");
  PipelineOptions o = Options(1);
  o.order = OrderOptions::AutoGop();
  auto p = Pipeline::Create(*dataset_, spec, o, {0, 0});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("clips"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace conveyor
