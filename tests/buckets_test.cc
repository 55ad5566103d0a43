// Resolution and aspect-ratio buckets (`buckets:` in the spec; sample/buckets.h, shuffle/buckets.h,
// docs/sampling.md "Buckets") on a WebDataset folder of clips of three shapes, written at test time
// by tests/fixtures/buckets/make_buckets.py (Python's tarfile, the ffmpeg CLI, python3-numpy):
// each clip goes to the bucket nearest its aspect, its frames are the CLI's centre crop and scale
// to the bucket's size, a batch holds one bucket, and the order is a pure function of (seed, epoch,
// position): the same batches at any thread or consumer count, from any resume cursor, and at any
// global batch size dividing the group. Packing counts each bucket's own patches.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/strings.h"
#include "datasets/dataset.h"
#include "datasets/sample_index.h"
#include "pipeline/order_digest.h"
#include "pipeline/packing.h"
#include "pipeline/pipeline.h"
#include "sample/buckets.h"
#include "sample/sample_assembler.h"
#include "sample/sample_spec.h"
#include "shuffle/buckets.h"
#include "shuffle/order.h"
#include "tests/support/media_checks.h"
#include "tests/support/batch_lines.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

// Buckets: wide 56:32 (1.75), tall 32:56, square. The clips: 64x36 (16:9), 36x64, 48x48.
constexpr char kBuckets[] = "buckets: {sizes: [[32, 56], [56, 32], [40, 40]]";

class BucketsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index").c_str(), 1);
    const auto r = RunCommand(
        "/usr/bin/python3 " +
        ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/buckets/make_buckets.py") +
        " " + ShellQuote(dir_->Join("fx")) + " 2>&1");
    if (r.exit_code != 0) {
      error_ = r.output;
      return;
    }
    auto d = Dataset::Open(dir_->Join("fx/wds"));
    if (!d.ok()) {
      error_ = std::string(d.status().message());
      return;
    }
    dataset_ = d->release();
    std::ifstream in(dir_->Join("fx/shapes.txt"));
    std::string key;
    int w = 0, h = 0;
    while (in >> key >> w >> h) shapes_.push_back({h, w});
  }
  static void TearDownTestSuite() {
    delete dataset_;
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }

  static std::string Config(const std::string& buckets, const std::string& extra = "") {
    return "anchor: mp4\n"
           "clips: {per_video: 1}\n" +
           buckets + "\n" + extra +
           "streams:\n"
           "  mp4: {delta_timestamps: [0.0, 0.25]}\n"
           "  txt: {}\n";
  }
  static absl::StatusOr<SampleSpec> Parse(const std::string& yaml) {
    return SampleSpec::FromYaml(yaml, dataset_->manifest(), "buckets.yaml");
  }
  static SampleSpec Spec(const std::string& buckets = std::string(kBuckets) + "}") {
    auto s = Parse(Config(buckets));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : SampleSpec{};
  }
  // The bucket each clip belongs in, from the fixture's own record of its size.
  static size_t TrueBucket(uint64_t episode) {
    const BucketSize s = shapes_[episode];
    return s.width > s.height ? 0 : s.width < s.height ? 1 : 2;
  }

  using Line = testing::BatchLine;
  static std::vector<Line> Run(const SampleSpec& spec, PipelineOptions o, Cursor start, int steps) {
    return testing::RunBatches(*dataset_, spec, std::move(o), start, steps);
  }
  static PipelineOptions Options(int threads, uint64_t batch = 2) {
    PipelineOptions o;
    o.seed = 11;
    o.global_batch_size = batch;
    o.threads = threads;
    o.queue_bytes = 16ull << 20;
    return o;
  }

  static TempDir* dir_;
  static Dataset* dataset_;
  static std::vector<BucketSize> shapes_;  // per episode: the clip's height and width
  static std::string error_;
};
TempDir* BucketsTest::dir_ = nullptr;
Dataset* BucketsTest::dataset_ = nullptr;
std::vector<BucketSize> BucketsTest::shapes_;
std::string BucketsTest::error_;

TEST_F(BucketsTest, TheSpecTakesSizesOrAnAreaWithRatios) {
  const SampleSpec sizes = Spec();
  ASSERT_EQ(sizes.buckets.sizes.size(), 3u);
  EXPECT_EQ(sizes.buckets.sizes[0], (BucketSize{32, 56}));
  EXPECT_EQ(sizes.buckets.group, 0u);
  EXPECT_EQ(sizes.buckets.reference, 0);  // mp4, the spec's first camera
  // 4096 pixels at W/H 1, 16:9 and 9:16, sides to multiples of 8: 64x64, 48x88 (85.3 -> 88).
  const SampleSpec area =
      Spec("buckets: {area: 4096, ratios: [1.0, 1.7778, 0.5625], multiple: 8, group: 4}");
  ASSERT_EQ(area.buckets.sizes.size(), 3u);
  EXPECT_EQ(area.buckets.sizes[0], (BucketSize{64, 64}));
  EXPECT_EQ(area.buckets.sizes[1], (BucketSize{48, 88}));
  EXPECT_EQ(area.buckets.sizes[2], (BucketSize{88, 48}));
  EXPECT_EQ(area.buckets.group, 4u);

  struct Bad {
    std::string yaml, says;
  };
  const std::string streams = "streams:\n  mp4: {delta_timestamps: [0.0]}\n";
  for (const Bad& bad : std::vector<Bad>{
           {Config("buckets: {sizes: [[32, 56]], area: 100, ratios: [1]}"), "not both"},
           {Config("buckets: {area: 4096}"), "needs sizes"},
           {Config("buckets: {sizes: [[32, 56], [32, 56]]}"), "listed twice"},
           {Config("buckets: {sizes: [[32, 0]]}"), "[height, width]"},
           {Config("buckets: {sizes: [[32, 56]], sizez: 1}"), "unknown key 'sizez'"},
           {Config("buckets: {area: 4096, ratios: [-1]}"), "must be > 0"},
           {Config("buckets: {sizes: [[32, 56]], group: 0}"), "buckets.group"},
           {"anchor: mp4\nbuckets: {sizes: [[32, 56]]}\nstreams:\n  mp4: {delta_timestamps: [0.0], "
            "size: [32, 32]}\n",
            "gives size"},
           {"anchor: mp4\nbuckets: {sizes: [[32, 56]]}\nstreams:\n  mp4:\n    delta_timestamps: "
            "[0.0]\n    augment: {random_resized_crop: {scale: [0.5, 1.0]}}\n",
            "random_resized_crop"},
           {"anchor: t5.npy\nbuckets: {sizes: [[32, 56]]}\nstreams:\n  t5.npy: {}\n",
            "need a video or image stream"},
       }) {
    auto s = Parse(bad.yaml);
    ASSERT_FALSE(s.ok()) << bad.yaml;
    EXPECT_NE(std::string(s.status().message()).find(bad.says), std::string::npos) << s.status();
    EXPECT_NE(std::string(s.status().message()).find("buckets.yaml:"), std::string::npos) << s.status();
  }
}

// Nearest by log aspect (a ratio's inverse is as far on the other side), ties to the lower index;
// the crop is the largest rectangle of the bucket's aspect around the frame's centre.
TEST_F(BucketsTest, NearestBucketAndItsCentreCrop) {
  const FrameBuckets b = Spec().buckets;
  EXPECT_EQ(NearestBucket(b, 1920, 1080), 0u);
  EXPECT_EQ(NearestBucket(b, 1080, 1920), 1u);
  EXPECT_EQ(NearestBucket(b, 640, 640), 2u);
  EXPECT_EQ(NearestBucket(b, 700, 530), 2u);  // 1.32: nearer 1.0 than 1.75 in log terms
  EXPECT_EQ(NearestBucket(b, 740, 530), 0u);  // 1.40
  FrameBuckets tie;
  tie.sizes = {{10, 20}, {20, 10}};
  EXPECT_EQ(NearestBucket(tie, 10, 10), 0u);

  const VideoCrop wide = BucketCrop({32, 56}, DisplayedSize{64, 36});  // 1.778 into 1.75
  EXPECT_EQ(wide.width, 63);
  EXPECT_EQ(wide.height, 36);
  EXPECT_EQ(wide.x, 0);
  EXPECT_EQ(wide.y, 0);
  const VideoCrop tall = BucketCrop({40, 40}, DisplayedSize{36, 64});
  EXPECT_EQ(tall.width, 36);
  EXPECT_EQ(tall.height, 36);
  EXPECT_EQ(tall.y, 14);
  const VideoCrop same = BucketCrop({40, 40}, DisplayedSize{48, 48});
  EXPECT_EQ(same.width, 48);
  EXPECT_EQ(same.height, 48);
}

// Each bucket's whole groups, permuted: every group of G positions is one bucket, no sample twice
// in an epoch, each bucket's remainder (fewer than G) left out, another remainder each epoch.
TEST_F(BucketsTest, AnEpochIsWholeGroupsOfOneBucket) {
  const SampleSpec spec = Spec();
  auto index = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, spec.clips, 1);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 14u);  // one clip per video
  // The table as the pipeline measures it (pipeline/schedule_inputs.cc); it does not depend on
  // the group, which here follows global_batch_size 1.
  PipelineOptions resolved = Options(1, 1);
  ASSERT_TRUE(ResolveSchedule(*dataset_, spec, &resolved).ok());
  const std::shared_ptr<const BucketTable> table = resolved.order.buckets;
  ASSERT_NE(table, nullptr);
  // 7 wide, 4 tall, 3 square clips (make_buckets.py's PLAN).
  EXPECT_EQ(table->BucketSamples(0), 7u);
  EXPECT_EQ(table->BucketSamples(1), 4u);
  EXPECT_EQ(table->BucketSamples(2), 3u);
  for (uint64_t g : {1u, 2u, 3u, 4u}) {
    OrderOptions o;
    o.buckets = table;
    o.bucket_group = g;
    std::set<uint64_t> left_out_union;
    std::vector<uint64_t> first_epoch;
    for (uint64_t epoch = 0; epoch < 6; ++epoch) {
      EpochOrder order(index->size(), 77, epoch, o);
      ASSERT_EQ(order.size(), 7 / g * g + 4 / g * g + 3 / g * g) << g;
      ASSERT_EQ(order.size(), table->EpochSize(g));
      std::set<uint64_t> seen;
      for (uint64_t p = 0; p < order.size(); ++p) {
        const uint64_t s = order.SampleAt(p);
        ASSERT_LT(s, 14u);
        EXPECT_TRUE(seen.insert(s).second) << "sample " << s << " twice, group " << g;
        EXPECT_EQ(TrueBucket(s), TrueBucket(order.SampleAt(p / g * g))) << "group " << g << " mixes buckets";
        if (epoch == 0) first_epoch.push_back(s);
      }
      for (uint64_t s = 0; s < 14; ++s) {
        if (!seen.count(s)) left_out_union.insert(s);
      }
      EpochOrder again(index->size(), 77, epoch, o);
      for (uint64_t p = 0; p < order.size(); ++p) ASSERT_EQ(again.SampleAt(p), order.SampleAt(p));
    }
    // Another epoch, another order.
    EpochOrder next_epoch(index->size(), 77, 1, o);
    std::vector<uint64_t> second;
    for (uint64_t p = 0; p < next_epoch.size(); ++p) second.push_back(next_epoch.SampleAt(p));
    EXPECT_NE(second, first_epoch) << g;
    EpochOrder other_key(index->size(), 78, 0, o);
    std::vector<uint64_t> other;
    for (uint64_t p = 0; p < other_key.size(); ++p) other.push_back(other_key.SampleAt(p));
    if (g < 4) EXPECT_NE(other, first_epoch) << g;
    // Over six epochs the left-out remainder moves: more clips than one epoch's remainder.
    const uint64_t remainder = 14 - table->EpochSize(g);
    if (remainder > 0) EXPECT_GT(left_out_union.size(), remainder) << g;
  }
}

// Through the pipeline: every batch is one bucket, its frames at the bucket's size, each frame the
// ffmpeg CLI's centre crop and scale of the clip's frame.
TEST_F(BucketsTest, EachBatchIsOneBucketCutAsTheCliCutsIt) {
  const SampleSpec spec = Spec();
  const std::vector<Line> lines = Run(spec, Options(2), Cursor{0, 0}, 12);  // two epochs
  ASSERT_EQ(lines.size(), 12u);
  std::set<size_t> buckets_seen;
  std::map<uint64_t, std::vector<std::string>> golden;  // episode -> the CLI's frame md5s
  int frames_checked = 0;
  for (const Line& l : lines) {
    ASSERT_EQ(l.ids.size(), 2u);
    const size_t b = TrueBucket(l.ids[0].episode);
    EXPECT_EQ(TrueBucket(l.ids[1].episode), b) << l.cursor.ToString() << " mixes buckets";
    buckets_seen.insert(b);
    const BucketSize size = spec.buckets.sizes[b];
    ASSERT_EQ(l.shapes.at("mp4"), (std::vector<int64_t>{2, 2, size.height, size.width, 3}));
    for (size_t i = 0; i < 2; ++i) {
      const uint64_t e = l.ids[i].episode;
      if (!golden.count(e)) {
        const BucketSize src = shapes_[e];
        const VideoCrop c = BucketCrop(size, DisplayedSize{src.width, src.height});
        golden[e] = testing::FrameMd5s(dir_->Join(StrCat("fx/clips/", e < 10 ? "0000" : "000", e, ".mp4")), "v",
                              StrCat("-vf crop=", c.width, ":", c.height, ":", c.x, ":", c.y,
                                     ",scale=", size.width, ":", size.height,
                                     ":flags=bilinear -pix_fmt rgb24"));
        ASSERT_EQ(golden[e].size(), 12u) << e;
      }
      const size_t frame_bytes = static_cast<size_t>(size.height * size.width * 3);
      const uint8_t* sample = l.tensors.at("mp4").data() + i * 2 * frame_bytes;
      for (size_t k = 0; k < 2; ++k) {
        const uint32_t frame = l.ids[i].step + static_cast<uint32_t>(3 * k);  // 0.25 s at 12 fps
        ASSERT_LT(frame, 12u);
        EXPECT_EQ(testing::Md5Hex(sample + k * frame_bytes, frame_bytes), golden[e][frame])
            << "episode " << e << " frame " << frame;
        ++frames_checked;
      }
    }
  }
  EXPECT_EQ(buckets_seen.size(), 3u);
  EXPECT_EQ(frames_checked, 48);
}

// The same bits at any thread count, as two consumers' slices, from a resume cursor, and at
// another global batch size dividing the group.
TEST_F(BucketsTest, OrderIsPureAndResumesAtAnyBatchDividingTheGroup) {
  const SampleSpec spec = Spec(std::string(kBuckets) + ", group: 4}");
  // Groups of 4: 7 wide, 4 tall and 3 square clips give 1 + 1 + 0 groups, 2 steps an epoch.
  const std::vector<Line> one = Run(spec, Options(1, 4), Cursor{0, 0}, 6);  // 3 epochs
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(Run(spec, Options(3, 4), Cursor{0, 0}, 6), one);
  // Two consumers: each its half of every global batch.
  std::vector<Line> halves[2];
  for (uint32_t c = 0; c < 2; ++c) {
    PipelineOptions o = Options(2, 4);
    o.consumer = c;
    o.consumers = 2;
    halves[c] = Run(spec, o, Cursor{0, 0}, 6);
    ASSERT_EQ(halves[c].size(), 6u);
  }
  for (size_t s = 0; s < 6; ++s) {
    std::vector<SampleId> ids = halves[0][s].ids;
    ids.insert(ids.end(), halves[1][s].ids.begin(), halves[1][s].ids.end());
    EXPECT_EQ(ids, one[s].ids) << s;
  }
  // Resumed at position 4 of epoch 1 (the second epoch's second batch), across an epoch end.
  Cursor at;
  at.epoch = 1;
  at.position = 4;
  const std::vector<Line> resumed = Run(spec, Options(2, 4), at, 3);
  ASSERT_EQ(resumed.size(), 3u);
  EXPECT_EQ(resumed[0], one[3]);
  EXPECT_EQ(resumed[1], one[4]);
  EXPECT_EQ(resumed[2], one[5]);
  // At global batch 2 (divides the group of 4): the same sample sequence, half a batch at a time.
  const std::vector<Line> small = Run(spec, Options(2, 2), Cursor{0, 0}, 12);
  ASSERT_EQ(small.size(), 12u);
  for (size_t s = 0; s < 12; ++s) {
    const std::vector<SampleId> want(one[s / 2].ids.begin() + (s % 2) * 2,
                                     one[s / 2].ids.begin() + (s % 2) * 2 + 2);
    EXPECT_EQ(small[s].ids, want) << s;
  }
  // The digest a checkpoint pins names the group.
  PipelineOptions o = Options(1, 4);
  ASSERT_TRUE(ResolveSchedule(*dataset_, spec, &o).ok());
  auto text = OrderIdentityText(spec.config_text, o);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("bucket_group=4"), std::string::npos) << *text;
}

TEST_F(BucketsTest, BatchesThatWouldStraddleGroupsAreRefused) {
  const SampleSpec spec = Spec(std::string(kBuckets) + ", group: 3}");
  auto p = Pipeline::Create(*dataset_, spec, Options(1, 2), Cursor{0, 0});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("buckets.group 3 is not a multiple of "
                                                   "global_batch_size 2"),
            std::string::npos)
      << p.status();
  Cursor odd;
  odd.epoch = 0;
  odd.position = 1;
  auto q = Pipeline::Create(*dataset_, Spec(), Options(1, 2), odd);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(std::string(q.status().message()).find("not at a batch boundary"), std::string::npos)
      << q.status();
  // No bucket holds a whole group of 8.
  auto r = Pipeline::Create(*dataset_, Spec(std::string(kBuckets) + ", group: 8}"), Options(1, 8),
                            Cursor{0, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("no bucket has a whole group"), std::string::npos)
      << r.status();
}

// per_patch: a frame costs its own P x P patches, so each bucket costs its own tokens; the spec's
// check against max_tokens takes the largest bucket.
TEST_F(BucketsTest, PackingCountsEachBucketsPatches) {
  const SampleSpec spec = Spec();
  auto packing = PackingSpec::FromYaml(
      Config(std::string(kBuckets) + "}",
             "packing: {max_tokens: 64, tokens: {mp4: {per_patch: 8}, txt: {per_byte: 0}}}\n"),
      spec, "buckets.yaml");
  ASSERT_TRUE(packing.ok()) << packing.status();
  auto index = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, spec.clips, 1);
  ASSERT_TRUE(index.ok());
  SampleAssembler assembler(*dataset_, spec, *index);
  // Two frames: 32x56 -> 4 x 7 patches, 56x32 -> 7 x 4, 40x40 -> 5 x 5.
  const int64_t want[3] = {2 * 28, 2 * 28, 2 * 25};
  for (uint64_t e = 0; e < 14; ++e) {
    auto s = assembler.Assemble(e, 11, 0);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(TokenCount(*s, spec, *packing, nullptr), want[TrueBucket(e)]) << e;
  }
  auto over = PackingSpec::FromYaml(
      Config(std::string(kBuckets) + "}", "packing: {max_tokens: 55, tokens: {mp4: {per_patch: 8}}}\n"),
      spec, "buckets.yaml");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(std::string(over.status().message()).find("costs up to 56 tokens"), std::string::npos)
      << over.status();
}

// A server prices a stream before it decodes anything (pipeline/pipeline.h EstimateMemory): a
// bucketed camera's frames at the largest bucket's size, not at the first clip's (64x64 here, its
// longer side squared, where 1280x720 sources made a bucket bench's batch of four 49-frame clips
// at 336x192 cost 963 MB instead of 38 MB, and the server refused the stream).
TEST_F(BucketsTest, TheMemoryEstimatePricesFramesAtTheLargestBucket) {
  const SampleSpec spec = Spec();
  const MemoryEstimate e = EstimateMemory(*dataset_, spec, Options(1));
  // Two frames of the largest bucket (32x56) in RGB, a pad flag each, the caption's 256 bytes.
  EXPECT_EQ(e.sample_bytes, 2u * 32 * 56 * 3 + 2 + 256);
  EXPECT_EQ(e.batch_bytes, 2 * e.sample_bytes);
}

// Precomputed embeddings: `shape: stored` serves a `.npy` member (float16 [4, 8] here) in its own
// shape, its values converted exactly to float32, beside bucketed frames or with no video decoded
// at all; packing counts its rows (an [L, D] embedding is L tokens).
TEST_F(BucketsTest, EmbeddingsServedInTheirStoredShape) {
  const std::string streams_flat = "streams:\n  t5.npy: {}\n  txt: {}\n";
  const std::string streams_stored = "streams:\n  t5.npy: {shape: stored}\n  txt: {}\n";
  auto flat = Parse("anchor: t5.npy\n" + streams_flat);
  auto stored = Parse("anchor: t5.npy\n" + streams_stored);
  ASSERT_TRUE(flat.ok()) << flat.status();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->streams[0].stored_shape, (std::vector<int64_t>{4, 8}));
  auto index = SampleIndex::Build(*dataset_, stored->anchor_stream, {}, {}, 0);
  ASSERT_TRUE(index.ok());
  SampleAssembler a_flat(*dataset_, *flat, *index), a_stored(*dataset_, *stored, *index);
  for (uint64_t e : {0u, 5u, 13u}) {
    auto f = a_flat.Assemble(index->EpisodeStart(e), 1, 0);
    auto s = a_stored.Assemble(index->EpisodeStart(e), 1, 0);
    ASSERT_TRUE(f.ok() && s.ok()) << f.status() << s.status();
    const OwnedTensor* ft = f->Find("t5.npy");
    const OwnedTensor* st = s->Find("t5.npy");
    EXPECT_EQ(ft->shape, (std::vector<int64_t>{1, 32}));
    ASSERT_EQ(st->shape, (std::vector<int64_t>{4, 8}));
    EXPECT_EQ(st->dtype, DType::kFloat32);
    EXPECT_EQ(st->data, ft->data);  // the same values, C order
    const float* v = reinterpret_cast<const float*>(st->data.data());
    for (int k = 0; k < 32; ++k) EXPECT_EQ(v[k], k / 8.0f + static_cast<float>(e)) << e << " " << k;
  }
  EXPECT_EQ(a_stored.stats().frames_delivered, 0u);  // no video in the spec: none decoded

  // Packing: per_step counts the stored rows.
  auto packing = PackingSpec::FromYaml("packing: {max_tokens: 16, tokens: {t5.npy: {per_step: 1}}}\n",
                                       *stored, "buckets.yaml");
  ASSERT_TRUE(packing.ok()) << packing.status();
  auto s0 = a_stored.Assemble(0, 1, 0);
  ASSERT_TRUE(s0.ok());
  EXPECT_EQ(TokenCount(*s0, *stored, *packing, nullptr), 4);
  auto tight = PackingSpec::FromYaml("packing: {max_tokens: 3, tokens: {t5.npy: {per_step: 1}}}\n",
                                     *stored, "buckets.yaml");
  EXPECT_FALSE(tight.ok());

  // Beside bucketed frames: every batch [B, 4, 8] next to one bucket's frames.
  auto both = Parse("anchor: mp4\nclips: {per_video: 1}\n" + std::string(kBuckets) +
                    "}\nstreams:\n  mp4: {delta_timestamps: [0.0]}\n  t5.npy: {shape: stored}\n");
  ASSERT_TRUE(both.ok()) << both.status();
  for (const Line& l : Run(*both, Options(2), Cursor{0, 0}, 6)) {
    EXPECT_EQ(l.shapes.at("t5.npy"), (std::vector<int64_t>{2, 4, 8}));
    const BucketSize size = both->buckets.sizes[TrueBucket(l.ids[0].episode)];
    EXPECT_EQ(l.shapes.at("mp4"), (std::vector<int64_t>{2, 1, size.height, size.width, 3}));
  }

  for (const std::string bad : {"streams:\n  t5.npy: {shape: stored, delta_timestamps: [0.0, 0.1]}\n",
                                "streams:\n  t5.npy: {shape: round}\n"}) {
    auto s = Parse("anchor: t5.npy\n" + bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(std::string(s.status().message()).find("shape"), std::string::npos) << s.status();
  }
}

// examples/video_buckets.yaml as a user runs it: the same batch digests at 1 and 2 threads, and
// resumed from a cursor of the run.
TEST_F(BucketsTest, ExampleConfigRunsThroughTheCli) {
  auto batches = [&](const std::string& extra) {
    const auto r = RunCommand(
        ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(dir_->Join("fx/wds")) + " --config " +
            ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/examples/video_buckets.yaml") +
            " --digest " + extra + " 2>/dev/null",
        120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string one = batches("--steps 6 --threads 1");
  const std::vector<std::string> lines = testing::SplitLines(one);
  ASSERT_EQ(lines.size(), 6u) << one;
  EXPECT_EQ(batches("--steps 6 --threads 2"), one);
  const std::string cursor = lines[2].substr(0, lines[2].find(' '));
  const std::vector<std::string> resumed =
      testing::SplitLines(batches("--steps 3 --threads 2 --cursor " + cursor));
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], lines[2 + i]);
}

}  // namespace
}  // namespace conveyor
