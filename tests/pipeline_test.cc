// The pipeline's contract: the order is a bijection that depends on (fingerprint, seed, epoch)
// only; batches are bit-identical at any thread count and from any resume cursor; consumers get
// disjoint slices whose union is the global batch (elastic resume); GOP scheduling decodes less
// and stays exact; memory stays within the budget; shutdown never hangs.
#include "pipeline/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "sample/sample_assembler.h"
#include "shuffle/order.h"
#include "shuffle/quality.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

// Version-1 style blocks and windows (1, 1: the naive order).
OrderOptions Order(uint64_t block_steps, uint64_t window_blocks) {
  OrderOptions o;
  o.block_steps = block_steps;
  o.window_blocks = window_blocks;
  return o;
}

DecodedFrameCache::Options CacheOptions(uint64_t max_bytes,
                                        DecodedFrameCache::Policy policy = DecodedFrameCache::Policy::kPinWhatFits) {
  DecodedFrameCache::Options o;
  o.max_bytes = max_bytes;
  o.policy = policy;
  return o;
}

TEST(OrderTest, KeyedPermutationIsABijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 7ull, 64ull, 1000ull, 4097ull, 65536ull}) {
    KeyedPermutation p(n, 42);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t y = p(i);
      ASSERT_LT(y, n);
      ASSERT_FALSE(seen[y]) << "n=" << n << " collision at " << i;
      seen[y] = true;
    }
  }
}

TEST(OrderTest, LargeDomainsCostNoMemory) {
  KeyedPermutation p(1'000'000'007ull, 7);  // 10^9 samples: O(1) per lookup
  std::set<uint64_t> some;
  for (uint64_t i = 0; i < 1000; ++i) some.insert(p(i * 999'983ull));
  EXPECT_EQ(some.size(), 1000u);
  for (uint64_t y : some) EXPECT_LT(y, 1'000'000'007ull);
}

TEST(OrderTest, EpochOrderIsABijectionInEveryMode) {
  for (OrderOptions o : {Order(1, 1), Order(50, 8), Order(7, 3), Order(64, 100)}) {
    for (uint64_t n : {1ull, 49ull, 50ull, 1234ull, 5000ull}) {
      EpochOrder order(n, 99, 3, o);
      std::vector<bool> seen(n, false);
      for (uint64_t p = 0; p < n; ++p) {
        const uint64_t s = order.SampleAt(p);
        ASSERT_LT(s, n) << o.block_steps << "/" << o.window_blocks << " n=" << n;
        ASSERT_FALSE(seen[s]) << o.block_steps << "/" << o.window_blocks << " n=" << n << " p=" << p;
        seen[s] = true;
      }
    }
  }
}

// Frame f(s) of anchor step s, as BlockTable defines it.
uint64_t FrameOf(uint64_t s, double frames_per_step) {
  return static_cast<uint64_t>(std::floor(static_cast<double>(s) * frames_per_step + 0.5));
}

// Schedule version 2's blocks tile every episode in order, never cross an episode's end, and
// every block but an episode's first needs frames from its own keyframe on: its samples reach
// back no further than the GOP boundary it starts at, and no further forward than the next one
// plus what they reach back.
TEST(OrderTest, BlockTableCutsEpisodesAtGopBoundaries) {
  const std::vector<uint64_t> starts = {0, 100, 100, 257, 300, 301};  // an empty and a 1-step episode
  for (GopBlocks gop : {GopBlocks{0.6, 3, 30}, GopBlocks{1.0, 0, 30}, GopBlocks{1.0, 5, 2},
                        GopBlocks{3.0, 0, 2}, GopBlocks{1.0 / 3, 1, 60}}) {
    SCOPED_TRACE(::testing::Message() << "frames/step " << gop.frames_per_step << " back " << gop.back_frames
                                      << " span " << gop.span_frames);
    const BlockTable t(starts, gop);
    ASSERT_EQ(t.num_samples(), 301u);
    uint64_t at = 0;
    for (uint64_t b = 0; b < t.num_blocks(); ++b) {
      ASSERT_EQ(t.BlockBegin(b), at) << "block " << b;
      at = t.BlockEnd(b);
      ASSERT_LE(t.BlockSize(b), t.max_block_size());
      if (t.BlockSize(b) == 0) continue;
      const uint64_t first = t.BlockBegin(b), last = t.BlockEnd(b) - 1;
      size_t e = 0;
      while (starts[e + 1] <= first) ++e;
      ASSERT_LT(last, starts[e + 1]) << "block " << b << " crosses the end of episode " << e;
      for (uint64_t s = first; s <= last; ++s) ASSERT_EQ(t.BlockOf(s), b) << "sample " << s;
      if (first == starts[e]) continue;  // an episode's first block starts at frame 0
      // A later block starts at the first step whose frame reaches a GOP boundary K (a multiple
      // of the span past back_frames): the step before it shows a frame before K, so every
      // frame the block needs (from f - back_frames on) lies at or after the keyframe K - back.
      const uint64_t f = FrameOf(first - starts[e], gop.frames_per_step);
      ASSERT_GE(f, gop.back_frames);
      const uint64_t k = gop.back_frames + (f - gop.back_frames) / gop.span_frames * gop.span_frames;
      EXPECT_LT(FrameOf(first - 1 - starts[e], gop.frames_per_step), k)
          << "block " << b << " starts at frame " << f << ", not at the first step past " << k;
      if (gop.frames_per_step <= 1) {
        EXPECT_EQ(f, k) << "block " << b << ": dense steps reach the boundary itself";
      }
    }
    EXPECT_EQ(at, 301u) << "the blocks do not tile the samples";
  }
}

// Version 2 is a bijection, and each window's positions hold exactly its blocks' samples (the
// blocks of permuted slots [w * W, (w + 1) * W)).
TEST(OrderTest, EpochOrderVersion2IsABijectionOfWholeBlocks) {
  const std::vector<uint64_t> starts = {0, 140, 141, 500, 512, 1000};
  auto table = std::make_shared<const BlockTable>(starts, GopBlocks{0.6, 3, 30});
  for (uint64_t window_blocks : {1ull, 3ull, 7ull, 1000ull}) {
    OrderOptions o;
    o.window_blocks = window_blocks;
    o.blocks = table;
    EpochOrder order(1000, 99, 4, o);
    std::vector<bool> seen(1000, false);
    for (uint64_t w = 0; w < order.num_windows(); ++w) {
      std::set<uint64_t> blocks;
      for (uint64_t p = order.WindowBegin(w); p < order.WindowEnd(w); ++p) {
        const uint64_t s = order.SampleAt(p);
        ASSERT_LT(s, 1000u);
        ASSERT_FALSE(seen[s]) << "W=" << window_blocks << " p=" << p;
        seen[s] = true;
        ASSERT_EQ(order.WindowOf(p), w);
        blocks.insert(order.BlockOf(s));
      }
      uint64_t held = 0;
      for (uint64_t b : blocks) held += table->BlockSize(b);
      EXPECT_EQ(held, order.WindowEnd(w) - order.WindowBegin(w)) << "window " << w << " holds part of a block";
      EXPECT_LE(blocks.size(), window_blocks);
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 1000);
  }
}

// The orders running jobs resume under: these values may never change for a released schedule
// version (a change belongs in a new version, docs/pipeline.md "Schedule versions").
TEST(OrderTest, ReleasedOrdersNeverChange) {
  const uint64_t key = OrderKey("3f2a9c0d5e7b1a24", 7);
  auto first = [](const EpochOrder& o) {
    std::vector<uint64_t> v;
    for (uint64_t p = 0; p < 10; ++p) v.push_back(o.SampleAt(p));
    return v;
  };
  EXPECT_EQ(first(EpochOrder(5000, key, 2, {})),
            (std::vector<uint64_t>{4724, 3120, 2329, 3007, 1273, 1108, 1, 3723, 3458, 4736}));
  OrderOptions v1 = Order(25, 4);
  v1.version = 1;
  EXPECT_EQ(first(EpochOrder(5000, key, 2, v1)),
            (std::vector<uint64_t>{1067, 3370, 1054, 1050, 3356, 1064, 1989, 1982, 1995, 1975}));
  OrderOptions v2 = Order(25, 4);
  v2.blocks = std::make_shared<const BlockTable>(std::vector<uint64_t>{0, 1200, 2950, 5000}, GopBlocks{0.6, 3, 30});
  EXPECT_EQ(first(EpochOrder(5000, key, 2, v2)),
            (std::vector<uint64_t>{476, 472, 3509, 3505, 2236, 464, 998, 3537, 3550, 3530}));
}

TEST(OrderTest, DependsOnSeedEpochAndFingerprint) {
  auto first = [](uint64_t key, uint64_t epoch) {
    EpochOrder o(10000, key, epoch, {});
    std::vector<uint64_t> v;
    for (uint64_t p = 0; p < 20; ++p) v.push_back(o.SampleAt(p));
    return v;
  };
  const uint64_t k = OrderKey("3f2a9c0d5e7b1a24", 0);
  EXPECT_EQ(first(k, 0), first(k, 0));
  EXPECT_NE(first(k, 0), first(k, 1));
  EXPECT_NE(first(k, 0), first(OrderKey("3f2a9c0d5e7b1a24", 1), 0));
  EXPECT_NE(first(k, 0), first(OrderKey("3f2a9c0d5e7b1a25", 0), 0));
}

// A small synthetic dataset shared by the pipeline tests: 4 episodes of 4 s, 2 cameras 64x48.
class PipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = RunCommand(std::string(CONVEYOR_CLI) + " synth --quiet --out " +
                        ShellQuote(dir_->Join("ds")) +
                        " --episodes 4 --episode-seconds 4 --cameras 2 --size 64x48 --seed 5");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto d = Dataset::Open(dir_->Join("ds"));
    ASSERT_TRUE(d.ok()) << d.status();
    dataset_ = d->release();
    auto s = SampleSpec::FromYaml(
        "streams:\n"
        "  cam0: {delta_timestamps: [-0.1, 0.0], augment: {hflip: 0.5, color_jitter: {brightness: 0.3}}}\n"
        "  cam1: {}\n"
        "  observation.state: {normalize: mean_std}\n"
        "  action: {delta_timestamps: {start: 0, step: 0.02, count: 10}}\n"
        "  instruction: {}\n",
        dataset_->manifest(), "test.yaml");
    ASSERT_TRUE(s.ok()) << s.status();
    spec_ = new SampleSpec(*s);
  }
  static void TearDownTestSuite() {
    delete spec_;
    delete dataset_;
    delete dir_;
  }

  struct Line {
    Cursor cursor;
    std::vector<SampleId> ids;
    std::map<std::string, std::vector<uint8_t>> tensors;
    bool operator==(const Line&) const = default;
  };

  static std::vector<Line> Run(PipelineOptions o, Cursor start, int steps) {
    auto p = Pipeline::Create(*dataset_, *spec_, o, start);
    EXPECT_TRUE(p.ok()) << p.status();
    std::vector<Line> out;
    if (!p.ok()) return out;
    for (int i = 0; i < steps; ++i) {
      auto next = (*p)->Next();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok()) break;
      EXPECT_TRUE(next->has_value()) << "the stream ended early";
      if (!next->has_value()) break;
      const Batch* b = &**next;
      Line l{b->cursor, b->ids, {}};
      for (const TensorView& t : b->tensors) {
        l.tensors[t.name].assign(b->data(t), b->data(t) + t.bytes);
      }
      out.push_back(std::move(l));
    }
    return out;
  }

  static PipelineOptions Options(int threads, bool gop) {
    PipelineOptions o;
    o.seed = 11;
    o.global_batch_size = 20;
    o.threads = threads;
    o.queue_bytes = 64ull << 20;
    if (gop) o.order = Order(25, 4);
    return o;
  }

  static TempDir* dir_;
  static Dataset* dataset_;
  static SampleSpec* spec_;
};
TempDir* PipelineTest::dir_ = nullptr;
Dataset* PipelineTest::dataset_ = nullptr;
SampleSpec* PipelineTest::spec_ = nullptr;

TEST_F(PipelineTest, SameBatchesAtOneAndTwoThreads) {
  for (bool gop : {false, true}) {
    const auto one = Run(Options(1, gop), {0, 0}, 6);
    const auto two = Run(Options(2, gop), {0, 0}, 6);
    ASSERT_EQ(one.size(), 6u);
    EXPECT_TRUE(one == two) << (gop ? "gop" : "naive");
  }
}

// A server's streams share CPU slots (base/cpu_slots.h): two pipelines of three workers each
// on one slot, read in turn, give the batches each gives alone, naive and GOP-scheduled.
TEST_F(PipelineTest, SharedCpuSlotsKeepBatchesBitIdentical) {
  for (bool gop : {false, true}) {
    const auto want = Run(Options(1, gop), {0, 0}, 4);
    ASSERT_EQ(want.size(), 4u);
    auto slots = std::make_shared<CpuSlots>(1);
    PipelineOptions o = Options(3, gop);
    o.cpu_slots = slots;
    PipelineOptions other = o;
    other.seed = 12;  // another job's stream on the same server
    auto a = Pipeline::Create(*dataset_, *spec_, o, {0, 0});
    auto b = Pipeline::Create(*dataset_, *spec_, other, {0, 0});
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<Line> got;
    for (int i = 0; i < 4; ++i) {
      for (Pipeline* p : {a->get(), b->get()}) {
        auto next = p->Next();
        ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
        if (p != a->get()) continue;
        Line l{(*next)->cursor, (*next)->ids, {}};
        for (const TensorView& t : (*next)->tensors) l.tensors[t.name].assign((*next)->data(t), (*next)->data(t) + t.bytes);
        got.push_back(std::move(l));
      }
    }
    EXPECT_TRUE(got == want) << (gop ? "gop" : "naive");
    const CpuSlots::Stats s = slots->stats();
    EXPECT_EQ(s.in_use_peak, 1);
    EXPECT_GE(s.acquires, 2u * 4u * 20u) << "every sample of both streams is assembled under a slot";
    EXPECT_GE((*a)->stats().cpu_slot_wait_seconds, 0.0);
  }
}

// The pipeline version decides how audio is decoded (docs/pipeline.md "Schedule versions"):
// versions 1 and 2 per window, 3 (the default) in chunks, so a job resumed under the version it
// recorded gets the audio bits it started with. Each batch row's audio equals the assembler's with
// that method; the synthetic audio is AAC from FFmpeg's encoder, whose PNS makes the methods
// differ (reported, not required).
TEST_F(PipelineTest, PipelineVersionDecidesTheAudioMethod) {
  auto s = SampleSpec::FromYaml(
      "streams:\n"
      "  cam0: {}\n"
      "  audio: {delta_timestamps: [-1.0, 0.0], rate: 16000, channels: 1}\n",
      dataset_->manifest(), "audio.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->audio_method, AudioMethod::kChunks);
  const auto index = SampleIndex::Build(*dataset_, s->anchor_stream);
  ASSERT_TRUE(index.ok()) << index.status();
  std::map<uint32_t, std::vector<uint8_t>> audio_of_version;
  for (uint32_t version : {0u, 1u, 2u, 3u}) {
    SCOPED_TRACE(version);
    PipelineOptions o = Options(2, true);
    if (version != 0) o.order.version = version;
    auto p = Pipeline::Create(*dataset_, *s, o, {0, 5});
    ASSERT_TRUE(p.ok()) << p.status();
    SampleSpec direct = *s;
    direct.audio_method = version == 1 || version == 2 ? AudioMethod::kPerWindow : AudioMethod::kChunks;
    SampleAssembler assembler(*dataset_, direct, *index);
    for (int step = 0; step < 2; ++step) {
      auto next = (*p)->Next();
      ASSERT_TRUE(next.ok() && next->has_value());
      const Batch& b = **next;
      const TensorView* audio = b.Find("audio");
      ASSERT_NE(audio, nullptr);
      const size_t row = audio->bytes / b.ids.size();
      const uint8_t* got = b.data(*audio);
      audio_of_version[version].insert(audio_of_version[version].end(), got, got + audio->bytes);
      for (size_t i = 0; i < b.ids.size(); ++i) {
        auto sample = assembler.Assemble(b.ids[i].index, o.seed, b.cursor.epoch);
        ASSERT_TRUE(sample.ok()) << sample.status();
        const auto t = std::find_if(sample->tensors.begin(), sample->tensors.end(),
                                    [](const OwnedTensor& t) { return t.name == "audio"; });
        ASSERT_NE(t, sample->tensors.end());
        ASSERT_EQ(t->data.size(), row);
        EXPECT_EQ(std::memcmp(t->data.data(), got + i * row, row), 0) << "row " << i;
      }
    }
  }
  EXPECT_EQ(audio_of_version[0], audio_of_version[3]);  // the default (4) chunks as 3 does
  std::printf("synthetic AAC audio: versions 2 and 3 %s\n",
              audio_of_version[2] == audio_of_version[3] ? "agree" : "differ (PNS)");
}

// The pipeline version decides where video crops are cut (docs/pipeline.md "Schedule versions"):
// versions 1 to 3 from the full-size RGB frame (through the window prefetch in GOP mode, as
// before), 4 (the default) in the decoder, so a job resumed under version 3 gets the crop bits it
// started with. Each batch row equals the assembler's with that method; the methods differ.
TEST_F(PipelineTest, PipelineVersionDecidesTheCropMethod) {
  auto s = SampleSpec::FromYaml(
      "streams:\n"
      "  cam0: {delta_timestamps: [-0.1, 0.0], size: [24, 32], augment: {random_resized_crop: "
      "{scale: [0.3, 0.9]}, hflip: 0.5}}\n"
      "  action: {}\n",
      dataset_->manifest(), "crop.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->crop_method, CropMethod::kInDecoder);
  const auto index = SampleIndex::Build(*dataset_, s->anchor_stream);
  ASSERT_TRUE(index.ok()) << index.status();
  std::map<uint32_t, std::vector<uint8_t>> pixels_of_version;
  for (uint32_t version : {0u, 3u, 4u}) {
    SCOPED_TRACE(version);
    PipelineOptions o = Options(2, true);
    if (version != 0) o.order.version = version;
    auto p = Pipeline::Create(*dataset_, *s, o, {0, 5});
    ASSERT_TRUE(p.ok()) << p.status();
    SampleSpec direct = *s;
    direct.crop_method = version == 3 ? CropMethod::kFromRgb : CropMethod::kInDecoder;
    SampleAssembler assembler(*dataset_, direct, *index);
    for (int step = 0; step < 2; ++step) {
      auto next = (*p)->Next();
      ASSERT_TRUE(next.ok() && next->has_value());
      const Batch& b = **next;
      const TensorView* cam = b.Find("cam0");
      ASSERT_NE(cam, nullptr);
      const size_t row = cam->bytes / b.ids.size();
      ASSERT_EQ(row, 2u * 24 * 32 * 3);
      const uint8_t* got = b.data(*cam);
      pixels_of_version[version].insert(pixels_of_version[version].end(), got, got + cam->bytes);
      for (size_t i = 0; i < b.ids.size(); ++i) {
        auto sample = assembler.Assemble(b.ids[i].index, o.seed, b.cursor.epoch);
        ASSERT_TRUE(sample.ok()) << sample.status();
        const OwnedTensor* t = sample->Find("cam0");
        ASSERT_NE(t, nullptr);
        ASSERT_EQ(t->data.size(), row);
        EXPECT_EQ(std::memcmp(t->data.data(), got + i * row, row), 0) << "row " << i;
      }
    }
  }
  EXPECT_EQ(pixels_of_version[0], pixels_of_version[4]);  // the default is version 4
  EXPECT_NE(pixels_of_version[3], pixels_of_version[4]);
}

// 800 samples / 20 = 40 steps an epoch. Breakpoints: start, mid-epoch, the last step, the first
// of the next epoch, and three resumes in a row.
TEST_F(PipelineTest, ResumeFromAnyCursorIsBitIdentical) {
  for (bool gop : {false, true}) {
    const auto full = Run(Options(2, gop), {0, 0}, 44);  // runs into epoch 1
    ASSERT_EQ(full.size(), 44u);
    EXPECT_EQ(full[39].cursor, (Cursor{0, 39, 780}));  // batches carry their sample position
    EXPECT_EQ(full[40].cursor, (Cursor{1, 0, 0}));
    for (uint64_t at : {0u, 17u, 39u, 40u}) {
      const Cursor c{at / 40, at % 40};
      const auto resumed = Run(Options(2, gop), c, 3);
      for (size_t i = 0; i < resumed.size(); ++i) {
        EXPECT_TRUE(resumed[i] == full[at + i]) << (gop ? "gop" : "naive") << " resume at " << at;
      }
    }
    // Three resumes in a row: 5 -> 9 -> 13 -> 17.
    std::vector<Line> chained;
    for (uint64_t at : {5u, 9u, 13u}) {
      const auto part = Run(Options(1, gop), {0, at}, 4);
      chained.insert(chained.end(), part.begin(), part.end());
    }
    for (size_t i = 0; i < chained.size(); ++i) EXPECT_TRUE(chained[i] == full[5 + i]) << i;
  }
}

// The global sample sequence of `steps` global batches from `start`: each step's consumer slices
// joined in consumer order, with the cursor of each global batch.
static std::vector<std::pair<Cursor, std::vector<SampleId>>> GlobalRun(
    const Dataset& dataset, const SampleSpec& spec, PipelineOptions o, uint32_t consumers,
    Cursor start, int steps, std::vector<Cursor>* next = nullptr) {
  std::vector<std::pair<Cursor, std::vector<SampleId>>> out(static_cast<size_t>(steps));
  o.consumers = consumers;
  for (uint32_t c = 0; c < consumers; ++c) {
    o.consumer = c;
    auto p = Pipeline::Create(dataset, spec, o, start);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    for (int s = 0; s < steps; ++s) {
      auto b = (*p)->Next();
      EXPECT_TRUE(b.ok() && b->has_value()) << b.status();
      if (!b.ok() || !b->has_value()) return {};
      out[s].first = (*b)->cursor;
      out[s].second.insert(out[s].second.end(), (*b)->ids.begin(), (*b)->ids.end());
      if (next != nullptr && c == 0) next->push_back((*b)->next);
    }
  }
  return out;
}

// Issue 30 item 1: a job at B = 32 on 4 consumers checkpoints the cursor after 10 global batches
// (sample position 320 of epoch 0); resumed at B = 48 on 3 consumers it continues the same global
// sample sequence, nothing lost or repeated. The batch size changes at the first batch after the
// checkpoint (the 11th global batch: positions 320..367). 800 samples: at 48 the resumed epoch
// has (800 - 320) / 48 = 10 batches, then epoch 1 starts at its position 0.
TEST_F(PipelineTest, ResumeAtAnotherBatchSizeAndWorldSizeContinuesTheSampleSequence) {
  for (bool gop : {false, true}) {
    SCOPED_TRACE(gop ? "gop" : "naive");
    PipelineOptions o = Options(1, gop);
    // The reference: the epochs' orders position by position (B = 16 divides 800).
    o.global_batch_size = 16;
    std::vector<SampleId> order[2];
    for (const auto& [cursor, ids] : GlobalRun(*dataset_, *spec_, o, 1, {0, 0}, 56)) {
      order[cursor.epoch].insert(order[cursor.epoch].end(), ids.begin(), ids.end());
    }
    ASSERT_EQ(order[0].size(), 800u);
    ASSERT_EQ(order[1].size(), 96u);

    o.global_batch_size = 32;
    std::vector<Cursor> next;
    const auto before = GlobalRun(*dataset_, *spec_, o, 4, {0, 0}, 10, &next);
    ASSERT_EQ(before.size(), 10u);
    const Cursor checkpoint = next.back();
    EXPECT_EQ(checkpoint, (Cursor{0, 10, 320}));
    EXPECT_EQ(checkpoint.ToString(), "0@320");

    o.global_batch_size = 48;
    Cursor resume_at;  // what a checkpoint keeps: the text, parsed back
    {
      auto parsed = Cursor::Parse(checkpoint.ToString());
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      resume_at = *parsed;
    }
    const auto after = GlobalRun(*dataset_, *spec_, o, 3, resume_at, 12);
    ASSERT_EQ(after.size(), 12u);
    EXPECT_EQ(after[0].first, (Cursor{0, 6, 320}));   // step derived: floor(320 / 48)
    EXPECT_EQ(after[9].first, (Cursor{0, 15, 752}));  // the resumed epoch's last batch
    EXPECT_EQ(after[10].first, (Cursor{1, 0, 0}));
    EXPECT_EQ(after[11].first, (Cursor{1, 1, 48}));

    std::vector<SampleId> epoch0, epoch1;
    for (const auto& [cursor, ids] : before) epoch0.insert(epoch0.end(), ids.begin(), ids.end());
    for (const auto& [cursor, ids] : after) {
      std::vector<SampleId>& to = cursor.epoch == 0 ? epoch0 : epoch1;
      to.insert(to.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(epoch0, order[0]);  // every position of epoch 0 once, in order
    EXPECT_EQ(epoch1, order[1]);
    std::set<uint64_t> seen;
    for (const SampleId& id : epoch0) EXPECT_TRUE(seen.insert(id.index).second) << id.index;
    EXPECT_EQ(seen.size(), 800u);
  }
}

// A position with no whole batch of the new size left in its epoch starts the next epoch; a
// position past the epoch is an error naming it.
TEST_F(PipelineTest, APositionCursorIsNormalizedOrRefused) {
  PipelineOptions o = Options(1, false);
  o.global_batch_size = 48;
  auto p = Pipeline::Create(*dataset_, *spec_, o, Cursor{2, 0, 760});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->start(), (Cursor{3, 0, 0}));
  p = Pipeline::Create(*dataset_, *spec_, o, Cursor{2, 0, 752});  // 752 + 48 = 800: one left
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->start(), (Cursor{2, 15, 752}));
  auto b = (*p)->Next();
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*b)->next, (Cursor{3, 0, 0}));
  p = Pipeline::Create(*dataset_, *spec_, o, Cursor{0, 0, 801});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(p.status().message()).find("0@801"), std::string::npos) << p.status();
  o.max_epochs = 3;
  p = Pipeline::Create(*dataset_, *spec_, o, Cursor{2, 0, 760});  // normalized into epoch 3
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange) << p.status();
}

TEST_F(PipelineTest, ConsumersGetDisjointSlicesOfTheSameGlobalBatch) {
  for (bool gop : {false, true}) {
    const auto global = Run(Options(2, gop), {0, 3}, 2);
    for (uint32_t n : {2u, 4u}) {
      std::vector<SampleId> joined[2];
      for (uint32_t c = 0; c < n; ++c) {
        PipelineOptions o = Options(1, gop);
        o.consumer = c;
        o.consumers = n;
        const auto part = Run(o, {0, 3}, 2);
        ASSERT_EQ(part.size(), 2u);
        for (int s = 0; s < 2; ++s) {
          EXPECT_EQ(part[s].ids.size(), 20u / n);
          joined[s].insert(joined[s].end(), part[s].ids.begin(), part[s].ids.end());
        }
      }
      for (int s = 0; s < 2; ++s) EXPECT_EQ(joined[s], global[s].ids) << "consumers " << n;
    }
  }
}

TEST_F(PipelineTest, AnEpochVisitsEverySampleOnceAndIdsAreAuditable) {
  const auto epoch = Run(Options(2, true), {0, 0}, 40);
  std::set<uint64_t> seen;
  for (const Line& l : epoch) {
    for (const SampleId& id : l.ids) {
      EXPECT_TRUE(seen.insert(id.index).second) << "duplicate sample " << id.index;
      EXPECT_EQ(id.index, id.episode * 200 + id.step);  // 4 s at 50 Hz per episode
    }
  }
  EXPECT_EQ(seen.size(), 800u);
}

// The coverage audit's expected digests come from EpochSequence: the samples of the epoch's
// positions without decoding anything, exactly what the batches of that epoch hold.
TEST_F(PipelineTest, EpochSequenceIsWhatTheBatchesHold) {
  for (bool gop : {false, true}) {
    const auto epoch = Run(Options(2, gop), {1, 0}, 40);
    ASSERT_EQ(epoch.size(), 40u);
    std::vector<SampleId> batches;
    for (const Line& l : epoch) batches.insert(batches.end(), l.ids.begin(), l.ids.end());
    std::unique_ptr<Source> source = Source::Of(*dataset_);
    auto seq = Pipeline::EpochSequence(*source, *spec_, Options(1, gop), 1);
    ASSERT_TRUE(seq.ok()) << seq.status();
    EXPECT_EQ(*seq, batches) << (gop ? "gop" : "naive");
  }
}

TEST_F(PipelineTest, GopSchedulingDecodesLessAndStaysWithinTheBudget) {
  double amp[2] = {0, 0};
  for (bool gop : {false, true}) {
    PipelineOptions o = Options(2, gop);
    o.queue_bytes = 48ull << 20;
    auto p = Pipeline::Create(*dataset_, *spec_, o, {0, 0});
    ASSERT_TRUE(p.ok()) << p.status();
    for (int i = 0; i < 20; ++i) {
      auto b = (*p)->Next();
      ASSERT_TRUE(b.ok() && b->has_value());
    }
    const PipelineStats s = (*p)->stats();
    amp[gop] = s.amplification();
    EXPECT_LE(s.queue_bytes_peak, o.queue_bytes) << (gop ? "gop" : "naive");
    if (gop) {
      EXPECT_GT(s.prefetch_hits, 0u);
    }
  }
  EXPECT_GT(amp[0], 3.0) << "naive random access should re-decode GOP prefixes";
  EXPECT_LT(amp[1], 1.25) << "scheduled mode should decode each frame about once";
}

// Schedule version 2 decodes each frame of an epoch about once. Anchored at a camera (each
// sample one frame of cam1 and two of cam0, one reaching 0.1 s back), a whole epoch decodes at
// most 1.1x the frames the two cameras have; version 1's blocks, off the GOP grid, decode more.
TEST_F(PipelineTest, Version2DecodesEachFrameOfAnEpochAboutOnce) {
  auto spec = SampleSpec::FromYaml("anchor: cam0\nstreams:\n  cam0: {delta_timestamps: [-0.1, 0.0]}\n  cam1: {}\n",
                                   dataset_->manifest(), "cam.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto index = SampleIndex::Build(*dataset_, spec->anchor_stream);
  ASSERT_TRUE(index.ok()) << index.status();
  const uint64_t frames = 2 * index->size();  // cam0's frames are the anchor steps; cam1 has as many
  uint64_t decoded[3] = {0, 0, 0};
  for (uint32_t version : {1u, 2u}) {
    PipelineOptions o = Options(2, true);
    o.order = OrderOptions::AutoGop();
    o.order.version = version;
    o.global_batch_size = 16;
    o.max_epochs = 1;
    auto p = Pipeline::Create(*dataset_, *spec, o, {0, 0});
    ASSERT_TRUE(p.ok()) << p.status();
    uint64_t samples = 0;
    for (;;) {
      auto b = (*p)->Next();
      ASSERT_TRUE(b.ok()) << b.status();
      if (!b->has_value()) break;
      samples += (*b)->ids.size();
    }
    EXPECT_EQ(samples, index->size() / 16 * 16);
    decoded[version] = (*p)->stats().frames_decoded;
  }
  std::printf("frames decoded in an epoch of %llu frames: version 1 %llu, version 2 %llu\n",
              static_cast<unsigned long long>(frames), static_cast<unsigned long long>(decoded[1]),
              static_cast<unsigned long long>(decoded[2]));
  EXPECT_LE(decoded[2], frames * 11 / 10) << "version 2 decoded frames more than once";
  EXPECT_GT(decoded[1], frames * 11 / 10) << "version 1 should decode GOP prefixes again (the test's premise)";
}

TEST(DecodedFrameCacheTest, PoliciesKeepTheBound) {
  auto frame = [](size_t bytes) {
    auto f = std::make_shared<RgbImage>();
    f->pixels.assign(bytes, 7);
    return std::shared_ptr<const RgbImage>(f);
  };
  auto key = [](int64_t i) { return FrameCacheKey{"ds", 0, 0, i, 1}; };
  DecodedFrameCache pin(CacheOptions(1000, DecodedFrameCache::Policy::kPinWhatFits));
  for (int64_t i = 0; i < 5; ++i) pin.Insert(key(i), frame(300));
  EXPECT_EQ(pin.stats().frames, 3u);
  EXPECT_EQ(pin.stats().bytes, 900u);
  EXPECT_EQ(pin.stats().rejected, 2u);
  EXPECT_NE(pin.Find(key(0)), nullptr);  // the first ones stay
  EXPECT_EQ(pin.Find(key(4)), nullptr);
  EXPECT_EQ(pin.Find(FrameCacheKey{"ds", 0, 0, 0, 2}), nullptr) << "other decode settings, other frame";
  DecodedFrameCache lru(CacheOptions(1000, DecodedFrameCache::Policy::kLru));
  for (int64_t i = 0; i < 3; ++i) lru.Insert(key(i), frame(300));
  ASSERT_NE(lru.Find(key(0)), nullptr);  // 0 is now the most recently used
  lru.Insert(key(3), frame(300));         // evicts 1, the least recently used
  EXPECT_EQ(lru.Find(key(1)), nullptr);
  EXPECT_NE(lru.Find(key(0)), nullptr);
  EXPECT_NE(lru.Find(key(3)), nullptr);
  EXPECT_LE(lru.stats().bytes, 1000u);
  EXPECT_EQ(lru.stats().evicted_bytes, 300u);
  lru.Insert(key(9), frame(2000));  // larger than the bound: never admitted
  EXPECT_EQ(lru.Find(key(9)), nullptr);
  EXPECT_LE(lru.stats().bytes, 1000u);
}

// Pre-faulted buffers (--frame-cache-prefault, issue 29 item 5) count toward the bound until they
// are lent; a frame decoded into one is kept like any other, and a frame from elsewhere takes the
// pool's room back rather than pushing the cache over its bound.
TEST(DecodedFrameCacheTest, PrefaultedBuffersStayWithinTheBound) {
  auto key = [](int64_t i) { return FrameCacheKey{"ds", 0, 0, i, 1}; };
  DecodedFrameCache c(CacheOptions(1000, DecodedFrameCache::Policy::kPinWhatFits));
  EXPECT_EQ(c.Prefault(300, 5, 2), 900u) << "three fit";
  EXPECT_EQ(c.stats().pool_bytes, 900u);
  EXPECT_TRUE(c.TakeBuffer(200).empty()) << "no buffer of that size";
  std::vector<uint8_t> b = c.TakeBuffer(300);
  ASSERT_EQ(b.size(), 300u);
  EXPECT_EQ(c.stats().buffers_lent, 1u);
  EXPECT_EQ(c.stats().pool_bytes, 600u);
  auto f = std::make_shared<RgbImage>();
  f->pixels = std::move(b);
  c.Insert(key(0), f);
  EXPECT_EQ(c.stats().bytes, 300u);
  auto g = std::make_shared<RgbImage>();
  g->pixels.assign(350, 1);
  c.Insert(key(1), g);  // 300 held + 600 pooled + 350 > 1000: a pooled buffer goes
  EXPECT_EQ(c.stats().frames, 2u);
  EXPECT_LE(c.stats().bytes + c.stats().pool_bytes, 1000u);
  EXPECT_EQ(c.Prefault(300, 5, 1), 0u) << "no room left";
}

// The decoded-frame cache changes where frames come from, never the batches: two epochs with a
// cache that holds everything, one that holds a third (pin), one that evicts (lru), and a second
// pipeline sharing the first's cache all give the uncached run's batches bit for bit; with
// everything cached the second epoch decodes nothing, and a pipeline sharing a warm cache
// decodes nothing at all.
TEST_F(PipelineTest, DecodedFrameCacheKeepsBatchesBitIdentical) {
  PipelineOptions o = Options(2, true);
  o.order = OrderOptions::AutoGop();
  const auto index = SampleIndex::Build(*dataset_, spec_->anchor_stream);
  ASSERT_TRUE(index.ok());
  const int epoch_steps = static_cast<int>(index->size() / o.global_batch_size);
  const std::vector<Line> want = Run(o, {0, 0}, 2 * epoch_steps);
  ASSERT_EQ(want.size(), static_cast<size_t>(2 * epoch_steps));

  auto run_with = [&](std::shared_ptr<DecodedFrameCache> cache, PipelineStats* stats) {
    PipelineOptions c = o;
    c.frame_cache = std::move(cache);
    auto p = Pipeline::Create(*dataset_, *spec_, c, {0, 0});
    EXPECT_TRUE(p.ok()) << p.status();
    std::vector<Line> out;
    if (!p.ok()) return out;
    for (int i = 0; i < 2 * epoch_steps; ++i) {
      auto next = (*p)->Next();
      EXPECT_TRUE(next.ok() && next->has_value());
      if (!next.ok() || !next->has_value()) break;
      Line l{(*next)->cursor, (*next)->ids, {}};
      for (const TensorView& t : (*next)->tensors) l.tensors[t.name].assign((*next)->data(t), (*next)->data(t) + t.bytes);
      out.push_back(std::move(l));
    }
    *stats = (*p)->stats();
    return out;
  };
  PipelineStats uncached_stats;
  run_with(nullptr, &uncached_stats);

  auto big = std::make_shared<DecodedFrameCache>(CacheOptions(1ull << 30));
  PipelineStats s;
  EXPECT_EQ(run_with(big, &s), want) << "a cache holding everything";
  const FrameCacheStats full = big->stats();
  EXPECT_GT(s.frame_cache_hits, 0u);
  EXPECT_GT(s.blocks_from_frame_cache, 0u);
  EXPECT_LT(s.frames_decoded, uncached_stats.frames_decoded * 6 / 10) << "the second epoch was decoded again";
  EXPECT_EQ(full.rejected, 0u);

  PipelineStats again;
  EXPECT_EQ(run_with(big, &again), want) << "a second pipeline on the warm cache";
  EXPECT_EQ(again.frames_decoded, 0u) << "a warm cache holding every frame, and still decoding";

  // Pre-faulted before the job (--frame-cache-prefault): the frames are decoded into the pool's
  // buffers (every decode for the cache borrows one while the pool lasts), and nothing changes.
  auto pre = std::make_shared<DecodedFrameCache>(CacheOptions(1ull << 30));
  const uint64_t made = PrefaultFrameCache(*Source::Of(*dataset_), *spec_, *pre, 2);
  const uint64_t frame_bytes = 64 * 48 * 3;
  EXPECT_GT(made, 0u);
  EXPECT_EQ(made % frame_bytes, 0u);
  PipelineStats ps;
  EXPECT_EQ(run_with(pre, &ps), want) << "a pre-faulted cache";
  const FrameCacheStats pf = pre->stats();
  EXPECT_EQ(pf.frames, full.frames);
  EXPECT_EQ(pf.prefaulted_bytes, made);
  EXPECT_EQ(pf.buffers_lent, std::min<uint64_t>(ps.frame_cache_misses, made / frame_bytes));
  EXPECT_EQ(pf.pool_bytes, made - pf.buffers_lent * frame_bytes);
  EXPECT_GE(pf.buffers_lent, pf.frames) << "kept frames decoded outside the pool";

  for (auto policy : {DecodedFrameCache::Policy::kPinWhatFits, DecodedFrameCache::Policy::kLru}) {
    auto small = std::make_shared<DecodedFrameCache>(CacheOptions(full.bytes / 3, policy));
    PipelineStats ps;
    EXPECT_EQ(run_with(small, &ps), want) << "a cache holding a third, policy " << static_cast<int>(policy);
    const FrameCacheStats fs = small->stats();
    EXPECT_LE(fs.bytes, full.bytes / 3);
    EXPECT_GT(fs.rejected + fs.evicted_bytes, 0u);
  }
}

// The node-wide store (a directory shared by processes) changes where frames come from, never the
// batches: cold, warm (a second pipeline, as a second server process would, decodes nothing),
// holding a third (pin and lru), with a memory tier in front, and after entries were damaged on
// disk (detected, decoded again, counted) all give the uncached run's batches bit for bit.
TEST_F(PipelineTest, ANodeFrameStoreKeepsBatchesBitIdentical) {
  PipelineOptions o = Options(2, true);
  o.order = OrderOptions::AutoGop();
  const auto index = SampleIndex::Build(*dataset_, spec_->anchor_stream);
  ASSERT_TRUE(index.ok());
  const int steps = 2 * static_cast<int>(index->size() / o.global_batch_size);
  const std::vector<Line> want = Run(o, {0, 0}, steps);
  auto run_with = [&](const FrameCacheConfig& config, PipelineStats* stats, FrameCacheStats* cache_stats) {
    PipelineOptions c = o;
    auto cache = MakeFrameCache(config);
    EXPECT_TRUE(cache.ok()) << cache.status();
    if (!cache.ok()) return std::vector<Line>();
    c.frame_cache = *cache;
    auto p = Pipeline::Create(*dataset_, *spec_, c, {0, 0});
    EXPECT_TRUE(p.ok()) << p.status();
    std::vector<Line> out;
    if (!p.ok()) return out;
    for (int i = 0; i < steps; ++i) {
      auto next = (*p)->Next();
      EXPECT_TRUE(next.ok() && next->has_value());
      if (!next.ok() || !next->has_value()) break;
      Line l{(*next)->cursor, (*next)->ids, {}};
      for (const TensorView& t : (*next)->tensors) l.tensors[t.name].assign((*next)->data(t), (*next)->data(t) + t.bytes);
      out.push_back(std::move(l));
    }
    *stats = (*p)->stats();
    *cache_stats = c.frame_cache->stats();
    return out;
  };
  TempDir store;
  FrameCacheConfig config;
  config.dir = store.path();
  config.dir_bytes = 1ull << 30;
  PipelineStats cold, warm;
  FrameCacheStats cold_cache, warm_cache;
  EXPECT_EQ(run_with(config, &cold, &cold_cache), want) << "cold store";
  EXPECT_GT(cold_cache.store.published, 0u);
  EXPECT_GT(cold.frame_cache_hits, 0u) << "the second epoch did not read the store";
  EXPECT_EQ(run_with(config, &warm, &warm_cache), want) << "warm store";
  EXPECT_EQ(warm.frames_decoded, 0u) << "a warm store holding every frame, and still decoding";
  EXPECT_EQ(warm_cache.store.published, 0u);

  // Damage a quarter of the entries: they are found out, decoded again, and the bits hold.
  int damaged = 0, seen = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(store.Join("frames2"))) {
    if (!e.is_regular_file() || e.path().filename() == "source" || seen++ % 4 != 0) continue;
    std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) - 7);
    ++damaged;
  }
  ASSERT_GT(damaged, 0);
  PipelineStats repaired;
  FrameCacheStats repaired_cache;
  EXPECT_EQ(run_with(config, &repaired, &repaired_cache), want) << "damaged entries";
  EXPECT_GE(repaired_cache.store.corrupt, 1u);
  EXPECT_GT(repaired.frames_decoded, 0u);

  // A third of the dataset, each policy, with and without memory in front.
  const uint64_t full = FrameStore::Scan(store.path())->bytes;
  for (const char* policy : {"pin", "lru"}) {
    for (uint64_t memory : {0ull, 1ull << 30}) {
      TempDir small;
      FrameCacheConfig c = config;
      c.dir = small.path();
      c.dir_bytes = full / 3;
      c.policy = policy;
      c.bytes = memory;
      c.compression = "lz4";
      PipelineStats ps;
      FrameCacheStats fs;
      EXPECT_EQ(run_with(c, &ps, &fs), want) << "a store holding a third, " << policy << ", memory " << memory;
      EXPECT_LE(FrameStore::Scan(small.path())->bytes, full / 3);
      EXPECT_GT(fs.store.rejected + fs.store.evicted_bytes, 0u) << policy;
    }
  }
}

TEST_F(PipelineTest, CancelAndDestroyMidEpochDoNotHang) {
  for (bool gop : {false, true}) {
    auto p = Pipeline::Create(*dataset_, *spec_, Options(2, gop), {0, 0});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->Next().ok());
    (*p)->Cancel();
    EXPECT_EQ((*p)->Next().status().code(), absl::StatusCode::kCancelled);
    p->reset();  // joins the workers
  }
  // Destroyed without Cancel, with work in flight and a consumer that stopped reading.
  auto q = Pipeline::Create(*dataset_, *spec_, Options(2, true), {0, 7});
  ASSERT_TRUE(q.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  q->reset();
}

// No epoch-boundary gap (issue 30 item 3, docs/pipeline.md "Epoch boundaries"): each epoch's
// order (O(blocks) to build) is built ahead by a worker, never by the walker under the pipeline's
// lock when it reaches the epoch, and the next epoch's first batch is planned and assembled
// before the consumer takes the epoch's last batch. Counters, not clocks: the test waits (with
// no time asserted) for the workers to get ahead, then reads what the pipeline saw.
TEST_F(PipelineTest, TheNextEpochIsPlannedAndDecodedBeforeItsBoundary) {
  for (int threads : {1, 2}) {
    PipelineOptions o = Options(threads, true);
    o.order = OrderOptions::AutoGop();  // version 3: GOP blocks from a BlockTable
    o.max_epochs = 3;
    auto p = Pipeline::Create(*dataset_, *spec_, o, {0, 0});
    ASSERT_TRUE(p.ok()) << p.status();
    const uint64_t steps = (*p)->steps_per_epoch();
    const uint64_t local = o.global_batch_size;
    ASSERT_GE(steps, 2u);
    for (uint64_t i = 0; i < 3 * steps; ++i) {
      if (i % steps == steps - 1 && i + 1 < 3 * steps) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
        while ((*p)->stats().samples_ready < 2 * local && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        ASSERT_GE((*p)->stats().samples_ready, 2 * local) << "the workers never got past the boundary";
      }
      auto b = (*p)->Next();
      ASSERT_TRUE(b.ok() && b->has_value()) << i;
    }
    const PipelineStats s = (*p)->stats();
    EXPECT_EQ(s.epoch_orders_planned_ahead, 2u) << threads << " threads";
    EXPECT_EQ(s.epoch_orders_built_late, 0u) << "an order built at the boundary, under the lock";
    EXPECT_EQ(s.epoch_boundaries, 2u);
    EXPECT_EQ(s.boundaries_planned_ahead, 2u);
    EXPECT_EQ(s.next_epoch_samples_ready, 2 * local) << "the next epoch's first batch was not assembled";
  }
}

TEST_F(PipelineTest, MaxEpochsEndsTheStream) {
  PipelineOptions o = Options(2, false);
  o.max_epochs = 1;
  auto p = Pipeline::Create(*dataset_, *spec_, o, {0, 38});
  ASSERT_TRUE(p.ok());
  for (int i = 0; i < 2; ++i) {
    auto b = (*p)->Next();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->has_value());
  }
  auto end = (*p)->Next();
  ASSERT_TRUE(end.ok()) << "the end of the data is not an error: " << end.status();
  EXPECT_FALSE(end->has_value());
  end = (*p)->Next();  // and it stays the end
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
}

TEST_F(PipelineTest, BadOptionsSayWhatToFix) {
  PipelineOptions o = Options(1, false);
  o.consumers = 3;  // 20 % 3 != 0
  auto p = Pipeline::Create(*dataset_, *spec_, o, {0, 0});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(p.status().message()).find("not a multiple"), std::string::npos);
  o = Options(1, false);
  o.consumer = 2;
  o.consumers = 2;
  EXPECT_EQ(Pipeline::Create(*dataset_, *spec_, o, {0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Options(1, false);
  p = Pipeline::Create(*dataset_, *spec_, o, {0, 40});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(p.status().message()).find("40 steps"), std::string::npos) << p.status();
  o.global_batch_size = 100000;
  EXPECT_EQ(Pipeline::Create(*dataset_, *spec_, o, {0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseCursor("3").ok());
  EXPECT_FALSE(ParseCursor("a:1").ok());
  EXPECT_EQ(*ParseCursor("2:15"), (Cursor{2, 15}));
  EXPECT_EQ(*ParseCursor("2@15"), (Cursor{2, 0, 15}));
  EXPECT_EQ((Cursor{2, 0, 15}).ToString(), "2@15");
  EXPECT_FALSE(ParseCursor("2@").ok());
  EXPECT_FALSE(ParseCursor("2@-1").ok());
  EXPECT_FALSE(ParseCursor("2:1@3").ok());
  uint64_t position = 0;
  ASSERT_TRUE((Cursor{1, 7}).PositionAt(32, &position));  // an EPOCH:STEP cursor at its batch size
  EXPECT_EQ(position, 224u);
  EXPECT_FALSE((Cursor{1, 1ull << 60}).PositionAt(1024, &position));
}

TEST_F(PipelineTest, PackedBatchesAreDeterministicAndKeepSamplesApart) {
  PipelineOptions o = Options(1, true);
  auto packing = PackingSpec::FromYaml(
      "packing: {max_tokens: 2048, tokens: {cam0: {per_frame: 64}, cam1: {per_frame: 64}, "
      "observation.state: {per_step: 1}, action: {per_step: 1}, instruction: {per_byte: 1}}}\n",
      *spec_, "p.yaml", &dataset_->manifest());
  ASSERT_TRUE(packing.ok()) << packing.status();
  o.packing = *packing;
  const auto one = Run(o, {0, 2}, 3);
  o.threads = 2;
  const auto two = Run(o, {0, 2}, 3);
  ASSERT_EQ(one.size(), 3u);
  EXPECT_TRUE(one == two);
  for (const Line& l : one) {
    ASSERT_TRUE(l.tensors.count("segment_ids"));
    const auto& seg = l.tensors.at("segment_ids");
    const auto& seq = l.tensors.at("sample_sequence");
    const auto& off = l.tensors.at("sample_offset");
    const int32_t* sid = reinterpret_cast<const int32_t*>(seg.data());
    const int32_t* sq = reinterpret_cast<const int32_t*>(seq.data());
    const int32_t* so = reinterpret_cast<const int32_t*>(off.data());
    // Each sample's tokens carry one segment id, used by no other sample of its sequence.
    std::map<std::pair<int32_t, int32_t>, size_t> owner;
    for (size_t i = 0; i < l.ids.size(); ++i) {
      const int32_t id = sid[sq[i] * 2048 + so[i]];
      ASSERT_GT(id, 0);
      EXPECT_TRUE(owner.emplace(std::make_pair(sq[i], id), i).second) << "two samples share a segment";
    }
  }
}

TEST_F(PipelineTest, CliLinesAreTheSameAtAnyThreadCountAndResume) {
  TempDir out;
  testing::WriteFile(out.Join("c.yaml"),
                     "streams:\n  cam0: {delta_timestamps: [-0.1, 0.0]}\n  action: {}\n"
                     "pipeline: {global_batch_size: 16, seed: 3, schedule: {mode: gop}}\n");
  const std::string base = std::string(CONVEYOR_CLI) + " batches " + ShellQuote(dir_->Join("ds")) +
                           " --config " + ShellQuote(out.Join("c.yaml")) + " --digest";
  auto a = RunCommand(base + " --steps 6 --threads 1 2>/dev/null");
  auto b = RunCommand(base + " --steps 6 --threads 2 2>/dev/null");
  auto c = RunCommand(base + " --steps 3 --threads 2 --cursor 0:3 2>/dev/null");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.output.substr(a.output.find("0:3 ")), c.output);
  auto bad = RunCommand(base + " --cursor 9 2>&1");
  EXPECT_EQ(bad.exit_code, 2);  // a malformed flag value is a usage error
  EXPECT_NE(bad.output.find("EPOCH:STEP"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace conveyor
