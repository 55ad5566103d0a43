// Tensors whose stored shape varies per sample (sample/stored_tensor.h, docs/sampling.md "Tensors
// of varying shape") and buckets keyed by a tensor's stored shape (`buckets: {by: STREAM}`,
// sample/buckets.h, shuffle/buckets.h), on WebDataset shards of precomputed VAE latents and T5
// embeddings written at test time by tests/fixtures/buckets/make_buckets.py --latents (Python's
// tarfile, python3-numpy): each sample's shape comes from the member index (no tensor read), a
// batch holds one latent shape, the order is a pure function of (seed, epoch, position) at any
// thread or consumer count and from any batch boundary, `pad_to` pads and masks a varying L, and a
// sample whose shape the spec does not take is an error naming the shard, key and member, which
// `conveyor check --config` reports and quarantines.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/float16.h"
#include "base/strings.h"
#include "datasets/dataset.h"
#include "datasets/sample_index.h"
#include "pipeline/order_digest.h"
#include "pipeline/packing.h"
#include "pipeline/pipeline.h"
#include "sample/sample_assembler.h"
#include "sample/sample_spec.h"
#include "tests/support/batch_lines.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using json = nlohmann::json;
using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

struct Truth {
  int64_t h = 0, w = 0, length = 0;  // the latent's H and W, the embedding's L
};

bool Mentions(const absl::Status& s, const std::string& what) {
  return std::string(s.message()).find(what) != std::string::npos;
}

class TensorBucketsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index").c_str(), 1);
    const auto r = RunCommand(
        "/usr/bin/python3 " +
        ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/buckets/make_buckets.py") +
        " " + ShellQuote(dir_->Join("fx")) + " --latents 2>&1");
    if (r.exit_code != 0) {
      error_ = r.output;
      return;
    }
    auto d = Dataset::Open(dir_->Join("fx/latents"));
    if (!d.ok()) {
      error_ = std::string(d.status().message());
      return;
    }
    dataset_ = d->release();
    std::ifstream in(dir_->Join("fx/latents.txt"));
    std::string key;
    Truth t;
    while (in >> key >> t.h >> t.w >> t.length) truth_.push_back(t);
  }
  static void TearDownTestSuite() {
    delete dataset_;
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }

  static absl::StatusOr<SampleSpec> Parse(const std::string& yaml, const Dataset* d = nullptr) {
    return SampleSpec::FromYaml(yaml, (d ? d : dataset_)->manifest(), "latents.yaml");
  }
  static std::string Config(const std::string& buckets, const std::string& t5 = "{shape: stored, pad_to: 8}") {
    return "anchor: latents.npy\n" + buckets + "\nstreams:\n  latents.npy: {shape: stored}\n  t5.npy: " + t5 +
           "\n  txt: {}\n";
  }
  // The embedding alone (and the caption): a spec that reads no latent.
  static std::string T5Config(const std::string& t5) {
    return "anchor: t5.npy\nstreams:\n  t5.npy: " + t5 + "\n  txt: {}\n";
  }
  static SampleSpec Spec(const std::string& buckets = "buckets: {by: latents.npy, group: 4}") {
    auto s = Parse(Config(buckets));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : SampleSpec{};
  }
  static std::vector<int64_t> LatentShape(uint64_t e) { return {2, 4, truth_[e].h, truth_[e].w}; }

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
  static std::vector<Truth> truth_;
  static std::string error_;
};
TempDir* TensorBucketsTest::dir_ = nullptr;
Dataset* TensorBucketsTest::dataset_ = nullptr;
std::vector<Truth> TensorBucketsTest::truth_;
std::string TensorBucketsTest::error_;

TEST_F(TensorBucketsTest, TheSpecTakesBucketsByATensorAndPadTo) {
  const SampleSpec spec = Spec();
  EXPECT_TRUE(spec.buckets.enabled());
  EXPECT_FALSE(spec.buckets.cuts_frames());
  EXPECT_EQ(spec.buckets.by, 0);
  EXPECT_EQ(spec.buckets.group, 4u);
  EXPECT_EQ(spec.streams[1].pad_to, 8);
  EXPECT_EQ(spec.streams[1].stored_shape, (std::vector<int64_t>{8, 8}));  // N rows of [8]
  struct Bad {
    std::string yaml, says;
  };
  for (const Bad& b : {
           Bad{Config("buckets: {by: t5.npy}"), "has pad_to"},
           Bad{Config("buckets: {by: txt}"), "shape: stored"},
           Bad{Config("buckets: {by: nope.npy}"), "not a stream of the spec"},
           Bad{Config("buckets: {by: latents.npy, sizes: [[8, 8]]}"), "sizes goes with camera buckets"},
           Bad{Config("", "{pad_to: 8}"), "give shape: stored"},
           Bad{Config("", "{shape: stored, overlong: truncate}"), "overlong goes with pad_to"},
           Bad{Config("", "{shape: stored, pad_to: 8, overlong: cut}"), "expected one of error, truncate"},
           Bad{Config("", "{shape: stored, pad_to: 0}"), "pad_to"},
       }) {
    auto s = Parse(b.yaml);
    ASSERT_FALSE(s.ok()) << b.yaml;
    EXPECT_TRUE(Mentions(s.status(), b.says)) << s.status();
    EXPECT_TRUE(Mentions(s.status(), "latents.yaml:")) << s.status();
  }
}

// Each sample's stored shape is in the member index: known with no tensor (no tar) read.
TEST_F(TensorBucketsTest, StoredShapesComeFromTheMemberIndexWithoutReadingTensors) {
  const int latents = dataset_->manifest().StreamIndex("latents.npy");
  const int t5 = dataset_->manifest().StreamIndex("t5.npy");
  ASSERT_EQ(dataset_->num_episodes(), truth_.size());
  for (uint64_t e = 0; e < truth_.size(); ++e) {
    EXPECT_EQ(*dataset_->StoredShape(e, latents), LatentShape(e)) << e;
    EXPECT_EQ(*dataset_->StoredShape(e, t5), (std::vector<int64_t>{truth_[e].length, 8})) << e;
  }
  // A copy whose tars are emptied after it opened: the shapes still answer, a load cannot.
  const std::string copy = dir_->Join("emptied");
  std::filesystem::copy(dir_->Join("fx/latents"), copy);
  auto d = Dataset::Open(copy);
  ASSERT_TRUE(d.ok()) << d.status();
  for (const char* tar : {"00000.tar", "00001.tar"}) std::filesystem::resize_file(copy + "/" + tar, 0);
  for (uint64_t e = 0; e < truth_.size(); ++e) {
    EXPECT_EQ(*(*d)->StoredShape(e, latents), LatentShape(e)) << e;
  }
  EXPECT_FALSE((*d)->LoadEpisode(0).ok());
  EXPECT_FALSE((*d)->StoredShape(0, dataset_->manifest().StreamIndex("txt")).ok());
}

// A batch holds one latent shape; the embedding is padded to 8 rows, masked, and packing counts its
// real rows.
TEST_F(TensorBucketsTest, EachBatchIsOneShapeAndTheEmbeddingIsPadded) {
  const SampleSpec spec = Spec();
  // Groups of 4: 8 wide, 5 tall and 3 square latents give 2 + 1 + 0 groups, 6 steps of 2 an epoch.
  const std::vector<Line> lines = Run(spec, Options(1), Cursor{0, 0}, 12);
  ASSERT_EQ(lines.size(), 12u);
  std::map<uint64_t, std::set<uint64_t>> seen;  // per epoch: the episodes served
  for (const Line& l : lines) {
    ASSERT_EQ(l.ids.size(), 2u);
    const std::vector<int64_t> shape = LatentShape(l.ids[0].episode);
    EXPECT_EQ(LatentShape(l.ids[1].episode), shape) << "a batch mixes shapes";
    EXPECT_NE(shape[2], 8) << "no square group: 3 square latents are fewer than a group";
    EXPECT_EQ(l.shapes.at("latents.npy"), (std::vector<int64_t>{2, 2, 4, shape[2], shape[3]}));
    EXPECT_EQ(l.shapes.at("t5.npy"), (std::vector<int64_t>{2, 8, 8}));
    EXPECT_EQ(l.shapes.at("t5.npy_is_pad"), (std::vector<int64_t>{2, 8}));
    for (size_t k = 0; k < 2; ++k) {
      const uint64_t e = l.ids[k].episode;
      seen[l.cursor.epoch].insert(e);
      // The latent's values (float16, exact in float32): element j is (j % 64) / 4 + e.
      const float* v = reinterpret_cast<const float*>(l.tensors.at("latents.npy").data()) +
                       k * 8 * shape[2] * shape[3];
      for (int64_t j = 0; j < 8 * shape[2] * shape[3]; j += 7) {
        EXPECT_EQ(v[j], static_cast<float>(j % 64) / 4 + static_cast<float>(e)) << e << " " << j;
      }
      // The embedding's L rows, then zeros; the mask says which rows are padding.
      const float* t = reinterpret_cast<const float*>(l.tensors.at("t5.npy").data()) + k * 64;
      const uint8_t* pad = l.tensors.at("t5.npy_is_pad").data() + k * 8;
      for (int64_t j = 0; j < 64; ++j) {
        const bool real = j / 8 < truth_[e].length;
        EXPECT_EQ(t[j], real ? static_cast<float>(j) / 8 + static_cast<float>(e) : 0.0f) << e << " " << j;
      }
      for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(pad[r], r < truth_[e].length ? 0 : 1) << e << " " << r;
    }
  }
  for (const auto& [epoch, episodes] : seen) EXPECT_EQ(episodes.size(), 12u) << epoch;

  // Packing counts the real rows: L tokens at per_step 1, whatever the padding.
  auto packing = PackingSpec::FromYaml("packing: {max_tokens: 24, tokens: {t5.npy: {per_step: 1}}}\n",
                                       spec, "latents.yaml");
  ASSERT_TRUE(packing.ok()) << packing.status();
  auto index = SampleIndex::Build(*dataset_, spec.anchor_stream, {}, {}, 0);
  ASSERT_TRUE(index.ok());
  SampleAssembler assembler(*dataset_, spec, *index);
  for (uint64_t e = 0; e < truth_.size(); ++e) {
    auto s = assembler.Assemble(index->EpisodeStart(e), 1, 0);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(TokenCount(*s, spec, *packing, nullptr), truth_[e].length) << e;
  }
  EXPECT_EQ(assembler.stats().frames_delivered, 0u);  // no video: none decoded

  // The keyed stream's rows are the data's: the spec does not bound them, each sample is checked.
  auto keyed = PackingSpec::FromYaml("packing: {max_tokens: 1, tokens: {latents.npy: {per_step: 1}}}\n",
                                     spec, "latents.yaml");
  ASSERT_TRUE(keyed.ok()) << keyed.status();
  auto s0 = assembler.Assemble(0, 1, 0);
  ASSERT_TRUE(s0.ok());
  auto counted = CountTokens(std::span<const Sample>(&*s0, 1), spec, *keyed);
  ASSERT_FALSE(counted.ok());
  EXPECT_TRUE(Mentions(counted.status(), "costs 2 tokens")) << counted.status();
}

// The two halves of issue 40's item 5 together: `dtype:` (docs/sampling.md "Tensor dtypes") on
// tensors of varying shape. The float16 latents keep their stored bits in their bucket's shape,
// and the float32 embedding is served as float16, its L rows rounded and its padding rows zero.
TEST_F(TensorBucketsTest, VaryingShapesAreServedInTheSpecsDtype) {
  auto spec = Parse("anchor: latents.npy\nbuckets: {by: latents.npy, group: 4}\nstreams:\n"
                    "  latents.npy: {shape: stored, dtype: stored}\n"
                    "  t5.npy: {shape: stored, pad_to: 8, dtype: float16}\n  txt: {}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<Line> lines = Run(*spec, Options(2), Cursor{0, 0}, 6);
  ASSERT_EQ(lines.size(), 6u);
  for (const Line& l : lines) {
    const std::vector<int64_t> shape = LatentShape(l.ids[0].episode);
    EXPECT_EQ(l.shapes.at("latents.npy"), (std::vector<int64_t>{2, 2, 4, shape[2], shape[3]}));
    EXPECT_EQ(l.tensors.at("latents.npy").size(), 2u * 8 * shape[2] * shape[3] * 2);
    EXPECT_EQ(l.tensors.at("t5.npy").size(), 2u * 64 * 2);
    for (size_t k = 0; k < 2; ++k) {
      const uint64_t e = l.ids[k].episode;
      const uint8_t* latent = l.tensors.at("latents.npy").data() + k * 8 * shape[2] * shape[3] * 2;
      const uint8_t* t5 = l.tensors.at("t5.npy").data() + k * 64 * 2;
      for (int64_t j = 0; j < 8 * shape[2] * shape[3]; j += 5) {
        uint16_t bits;
        std::memcpy(&bits, latent + 2 * j, 2);
        EXPECT_EQ(bits, FloatToHalf(static_cast<float>(j % 64) / 4 + static_cast<float>(e))) << e << " " << j;
      }
      for (int64_t j = 0; j < 64; ++j) {
        uint16_t bits;
        std::memcpy(&bits, t5 + 2 * j, 2);
        const bool real = j / 8 < truth_[e].length;
        EXPECT_EQ(bits, real ? FloatToHalf(static_cast<float>(j) / 8 + static_cast<float>(e)) : 0) << e << " " << j;
      }
    }
  }
  // The same bits at one thread.
  EXPECT_EQ(Run(*spec, Options(1), Cursor{0, 0}, 6), lines);
}

TEST_F(TensorBucketsTest, OrderIsPureAndResumesAtAnyBatchDividingTheGroup) {
  const SampleSpec spec = Spec();
  // Groups of 4 and batches of 4: 3 steps an epoch.
  const std::vector<Line> one = Run(spec, Options(1, 4), Cursor{0, 0}, 6);
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(Run(spec, Options(3, 4), Cursor{0, 0}, 6), one);
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
    for (uint32_t c = 0; c < 2; ++c) {
      EXPECT_EQ(halves[c][s].shapes.at("latents.npy")[2], one[s].shapes.at("latents.npy")[2]) << s;
    }
  }
  // Resumed at position 8 of epoch 0 (its last batch), across the epoch's end.
  Cursor at;
  at.epoch = 0;
  at.position = 8;
  const std::vector<Line> resumed = Run(spec, Options(2, 4), at, 3);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], one[2 + i]) << i;
  // At global batch 2 (divides the group of 4): the same sample sequence, half a batch at a time.
  const std::vector<Line> small = Run(spec, Options(2, 2), Cursor{0, 0}, 12);
  ASSERT_EQ(small.size(), 12u);
  for (size_t s = 0; s < 12; ++s) {
    const std::vector<SampleId> want(one[s / 2].ids.begin() + (s % 2) * 2,
                                     one[s / 2].ids.begin() + (s % 2) * 2 + 2);
    EXPECT_EQ(small[s].ids, want) << s;
  }
  // A position inside a batch is refused; the digest a checkpoint pins names the group.
  Cursor odd;
  odd.position = 2;
  EXPECT_FALSE(Pipeline::Create(*dataset_, spec, Options(1, 4), odd).ok());
  PipelineOptions o = Options(1, 4);
  ASSERT_TRUE(ResolveSchedule(*dataset_, spec, &o).ok());
  auto text = OrderIdentityText(spec.config_text, o);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("bucket_group=4"), std::string::npos) << *text;
}

// A server prices a stream before it decodes anything (pipeline/pipeline.h EstimateMemory): the
// buckets' tensor at the largest stored shape in the dataset, which ResolveSchedule reads from the
// member index, not at the first sample's (a wide 6x10 latent here, where the square ones are 8x8;
// latents 16 times the first's would let a server take a stream it cannot afford).
TEST_F(TensorBucketsTest, TheMemoryEstimatePricesTheLargestStoredShape) {
  const SampleSpec spec = Spec();
  auto elements = [](const Truth& t) { return uint64_t{2} * 4 * static_cast<uint64_t>(t.h * t.w); };
  uint64_t largest = 0;
  for (const Truth& t : truth_) largest = std::max(largest, elements(t));
  const uint64_t first = elements(truth_[0]);
  ASSERT_LT(first, largest) << "the fixture's first latent is its largest: the test tells nothing";
  PipelineOptions o = Options(1, 4);
  const uint64_t unresolved = EstimateMemory(*dataset_, spec, o).sample_bytes;
  ASSERT_TRUE(ResolveSchedule(*dataset_, spec, &o).ok());
  EXPECT_EQ(o.largest_bucket_elements, largest);
  const MemoryEstimate e = EstimateMemory(*dataset_, spec, o);
  // float32 (the spec's default dtype) latents: 4 bytes an element more for each element more.
  EXPECT_EQ(e.sample_bytes - unresolved, (largest - first) * 4);
  EXPECT_EQ(e.batch_bytes, 4 * e.sample_bytes);
  // A spec without buckets keeps pricing the shape it serves (another is an error, not a sample).
  PipelineOptions plain = Options(1, 4);
  const SampleSpec unbucketed = Spec("");
  ASSERT_TRUE(ResolveSchedule(*dataset_, unbucketed, &plain).ok());
  EXPECT_EQ(plain.largest_bucket_elements, 0u);
}

// What the spec does not take: another shape without pad_to or buckets, L over pad_to, rows of
// another shape. Each is an error naming the shard, key and member; `overlong: truncate` cuts.
TEST_F(TensorBucketsTest, ShapesTheSpecDoesNotTakeAreErrorsNamingShardKeyAndMember) {
  auto index = SampleIndex::Build(*dataset_, dataset_->manifest().StreamIndex("latents.npy"), {}, {}, 0);
  ASSERT_TRUE(index.ok());
  auto assemble = [&](const SampleSpec& spec, uint64_t e) {
    SampleAssembler a(*dataset_, spec, *index);
    return a.Assemble(index->EpisodeStart(e), 1, 0);
  };
  // Stored shape without pad_to: episode 0's [2, 8] is the stream's; episode 1's [5, 8] is not.
  auto plain = Parse(T5Config("{shape: stored}"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(assemble(*plain, 0).ok());
  auto one = assemble(*plain, 1);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), absl::StatusCode::kDataLoss);
  for (const std::string m : {"00000.tar", "sample '00001'", "member '.t5.npy'", "[5, 8]", "[2, 8]", "pad_to"}) {
    EXPECT_TRUE(Mentions(one.status(), m)) << m << ": " << one.status();
  }
  // Flat, likewise: 40 values where the stream has 16.
  auto flat = Parse(T5Config("{}"));
  ASSERT_TRUE(flat.ok());
  auto f = assemble(*flat, 1);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(Mentions(f.status(), "sample '00001'") && Mentions(f.status(), "40 values")) << f.status();
  // pad_to 4 with L up to 8: episode 2 (L = 8) is over; with overlong: truncate its first 4 rows.
  auto tight = Parse(T5Config("{shape: stored, pad_to: 4}"));
  ASSERT_TRUE(tight.ok());
  auto over = assemble(*tight, 2);
  ASSERT_FALSE(over.ok());
  for (const std::string m : {"sample '00002'", "member '.t5.npy'", "8 rows, over pad_to 4", "overlong: truncate"}) {
    EXPECT_TRUE(Mentions(over.status(), m)) << m << ": " << over.status();
  }
  auto cut = Parse(T5Config("{shape: stored, pad_to: 4, overlong: truncate}"));
  ASSERT_TRUE(cut.ok());
  auto c = assemble(*cut, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Find("t5.npy")->shape, (std::vector<int64_t>{4, 8}));
  const float* v = reinterpret_cast<const float*>(c->Find("t5.npy")->data.data());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(v[j], j / 8.0f + 2) << j;
  EXPECT_EQ(c->Find("t5.npy_is_pad")->data, std::vector<uint8_t>(4, 0));
  // Latents of another shape without buckets: the batch cannot hold them.
  auto unbucketed = Parse(Config(""));
  ASSERT_TRUE(unbucketed.ok());
  auto u = assemble(*unbucketed, 1);
  ASSERT_FALSE(u.ok());
  EXPECT_TRUE(Mentions(u.status(), "member '.latents.npy'") && Mentions(u.status(), "[2, 4, 10, 6]") &&
              Mentions(u.status(), "buckets: {by: latents.npy}"))
      << u.status();
}

// The damaged copy: a latent of another rank is a broken sample of the reader; an embedding with
// rows of another shape and one over pad_to are errors of the spec. `conveyor check --config`
// reports all three, writes the quarantine, and the config's pipeline then runs without them.
TEST_F(TensorBucketsTest, CheckReportsShapesTheConfigDoesNotTakeAndQuarantinesThem) {
  auto bad = Dataset::Open(dir_->Join("fx/latents_bad"));
  ASSERT_TRUE(bad.ok()) << bad.status();
  auto broken = (*bad)->LoadEpisode(3);
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(broken.status(), "00003.latents.npy") && Mentions(broken.status(), "rank"))
      << broken.status();

  const std::string config = dir_->Join("bad.yaml"), q = dir_->Join("bad.quarantine");
  {
    std::ofstream out(config);
    out << "quarantine: " << q << "\n" << Config("buckets: {by: latents.npy, group: 2}");
  }
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " check " + ShellQuote(dir_->Join("fx/latents_bad")) +
                                " --config " + ShellQuote(config) + " --json --write-quarantine " +
                                ShellQuote(q) + " 2>/dev/null",
                            120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const json j = json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["episodes_with_errors"], 3) << r.output;
  std::map<int64_t, std::string> shape_findings;
  for (const json& f : j["findings"]) {
    if (f["what"] == "tensor_shape") shape_findings[f["episode"].get<int64_t>()] = f["detail"];
  }
  ASSERT_EQ(shape_findings.size(), 2u) << r.output;
  EXPECT_NE(shape_findings[5].find("[3, 6]"), std::string::npos) << shape_findings[5];
  EXPECT_NE(shape_findings[6].find("12 rows, over pad_to 8"), std::string::npos) << shape_findings[6];
  EXPECT_NE(shape_findings[6].find("00000.tar"), std::string::npos) << shape_findings[6];

  auto spec = SampleSpec::FromFile(config, (*bad)->manifest());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto p = Pipeline::Create(**bad, *spec, Options(2), Cursor{0, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  for (int i = 0; i < 6; ++i) {
    auto next = (*p)->Next();
    ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
    for (const SampleId& id : (*next)->ids) EXPECT_TRUE(id.episode != 3 && id.episode != 5 && id.episode != 6);
  }
}

// examples/latents_buckets.yaml as a user runs it: the same batch digests at 1 and 2 threads, and
// resumed from a cursor of the run.
TEST_F(TensorBucketsTest, ExampleConfigRunsThroughTheCli) {
  auto batches = [&](const std::string& extra) {
    const auto r = RunCommand(
        ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(dir_->Join("fx/latents")) + " --config " +
            ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/examples/latents_buckets.yaml") +
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
