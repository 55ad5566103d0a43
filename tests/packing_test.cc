// Sequence packing and batch building (pipeline/packing.h) on hand-made samples: token counts with
// padded entries, the `packing:` config and its errors, best-fit decreasing against a reference
// implementation and the brute-force optimum, first-fit as the baseline, and the packed batch's
// metadata (no attention between samples, stream ranges tiling each sample's segment).
#include "pipeline/packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <numeric>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"

namespace conveyor {
namespace {

namespace pb = format::v1;

// splitmix64: a fixed generator (std distributions differ between standard libraries).
struct Rng {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t Uniform(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
};

StreamSpec Stream(std::string name, pb::StreamKind kind, size_t deltas) {
  StreamSpec s;
  s.name = std::move(name);
  s.kind = kind;
  s.deltas.assign(deltas, 0.0);
  return s;
}

// cam0: 2 frames; observation.state: 1 step; action: 5 steps; audio: 1 s at 100 Hz; instruction.
SampleSpec RobotSpec() {
  SampleSpec spec;
  spec.anchor = "action";
  spec.streams.push_back(Stream("cam0", pb::VIDEO, 2));
  spec.streams.push_back(Stream("observation.state", pb::LOWDIM, 1));
  spec.streams.push_back(Stream("action", pb::LOWDIM, 5));
  StreamSpec audio = Stream("audio", pb::AUDIO, 0);
  audio.window_start = -1.0;
  audio.window_end = 0.0;
  audio.audio_rate = 100;
  audio.stream = 3;
  spec.streams.push_back(audio);
  spec.streams.push_back(Stream("instruction", pb::TEXT, 0));
  for (size_t i = 0; i < spec.streams.size(); ++i) {
    if (spec.streams[i].stream < 0) spec.streams[i].stream = static_cast<int>(i);
  }
  return spec;
}

// cam0 16/frame, state 1/step, action 1/step, audio 10/s, instruction 1/byte.
PackingSpec RobotPacking(int64_t max_tokens = 64) {
  PackingSpec p;
  p.enabled = true;
  p.max_tokens = max_tokens;
  p.tokens = {{16, 0}, {1, 0}, {1, 0}, {10, 100}, {1, 0}};
  return p;
}

OwnedTensor MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape, uint8_t fill) {
  OwnedTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.assign(t.num_elements() * DTypeSize(dtype), fill);
  return t;
}

OwnedTensor Pads(const std::string& stream, const std::vector<int>& pads) {
  OwnedTensor t = MakeTensor(stream + "_is_pad", DType::kBool, {static_cast<int64_t>(pads.size())}, 0);
  t.role = TensorRole::kPaddingMask;
  for (size_t i = 0; i < pads.size(); ++i) t.data[i] = pads[i] ? 1 : 0;
  return t;
}

struct SampleShape {
  int cam_pads = 0;     // leading padded frames (episode start)
  int action_pads = 0;  // trailing padded steps (episode end)
  int audio_pads = 0;   // leading padded audio samples
  int text_bytes = 10;
};

// A sample of RobotSpec whose bytes identify it: every byte of its tensors is `index % 251`.
Sample RobotSample(uint64_t index, const SampleShape& shape) {
  Sample s;
  s.index = index;
  s.episode = index / 100;
  s.step = static_cast<uint32_t>(index % 100);
  const uint8_t v = static_cast<uint8_t>(index % 251);
  s.tensors.push_back(MakeTensor("cam0", DType::kUint8, {2, 4, 4, 3}, v));
  s.tensors.push_back(Pads("cam0", {shape.cam_pads > 0, shape.cam_pads > 1}));
  s.tensors.push_back(MakeTensor("observation.state", DType::kFloat32, {1, 2}, v));
  s.tensors.push_back(Pads("observation.state", {0}));
  s.tensors.push_back(MakeTensor("action", DType::kFloat32, {5, 2}, v));
  std::vector<int> ap(5, 0);
  for (int i = 0; i < shape.action_pads; ++i) ap[4 - i] = 1;
  s.tensors.push_back(Pads("action", ap));
  s.tensors.push_back(MakeTensor("audio", DType::kFloat32, {100, 1}, v));
  std::vector<int> aup(100, 0);
  for (int i = 0; i < shape.audio_pads; ++i) aup[i] = 1;
  s.tensors.push_back(Pads("audio", aup));
  s.tensors.push_back(MakeTensor("instruction", DType::kUint8, {shape.text_bytes}, v));
  return s;
}

template <typename T>
std::vector<T> Values(const Batch& batch, std::string_view name) {
  const TensorView* v = batch.Find(name);
  EXPECT_NE(v, nullptr) << name;
  if (v == nullptr) return {};
  std::vector<T> out(v->bytes / sizeof(T));
  std::memcpy(out.data(), batch.data(*v), v->bytes);
  return out;
}

// ---- token counts ----

TEST(TokenCountTest, PaddedEntriesCostNothing) {
  const SampleSpec spec = RobotSpec();
  PackingSpec p = RobotPacking();
  SampleShape shape;
  shape.cam_pads = 1;
  shape.action_pads = 2;
  shape.audio_pads = 31;
  shape.text_bytes = 7;
  const Sample s = RobotSample(3, shape);
  std::vector<int64_t> per_stream;
  // cam0: 1 real frame * 16; state 1; action 3; audio ceil(69 / 100 * 10) = 7; text 7.
  EXPECT_EQ(TokenCount(s, spec, p, &per_stream), 16 + 1 + 3 + 7 + 7);
  EXPECT_EQ(per_stream, (std::vector<int64_t>{16, 1, 3, 7, 7}));

  p.count_padding = true;
  EXPECT_EQ(TokenCount(s, spec, p, &per_stream), 32 + 1 + 5 + 10 + 7);
  EXPECT_EQ(per_stream, (std::vector<int64_t>{32, 1, 5, 10, 7}));
}

TEST(TokenCountTest, AudioRoundsUpAndExactSecondsAreExact) {
  const SampleSpec spec = RobotSpec();
  PackingSpec p = RobotPacking();
  p.tokens = {{0, 0}, {0, 0}, {0, 0}, {50, 100}, {0, 0}};
  std::vector<int64_t> per_stream;
  SampleShape shape;
  shape.audio_pads = 99;  // one real sample: 0.01 s * 50 = 0.5 -> 1 token
  EXPECT_EQ(TokenCount(RobotSample(0, shape), spec, p, &per_stream), 1);
  shape.audio_pads = 0;  // exactly 1 s: 50 tokens, not 51
  EXPECT_EQ(TokenCount(RobotSample(0, shape), spec, p, &per_stream), 50);
  shape.audio_pads = 100;  // all padding
  EXPECT_EQ(TokenCount(RobotSample(0, shape), spec, p, &per_stream), 0);
  EXPECT_EQ(per_stream, (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

TEST(TokenCountTest, UnlistedStreamsCostNothing) {
  const SampleSpec spec = RobotSpec();
  PackingSpec p = RobotPacking();
  p.tokens = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {2, 0}};
  SampleShape shape;
  shape.text_bytes = 9;
  EXPECT_EQ(TokenCount(RobotSample(0, shape), spec, p, nullptr), 18);
}

TEST(CountTokensTest, OverMaxTokensIsAnErrorNamingTheSample) {
  const SampleSpec spec = RobotSpec();
  const PackingSpec p = RobotPacking(64);
  std::vector<Sample> samples;
  samples.push_back(RobotSample(10, {}));  // 32 + 1 + 5 + 10 + 10 = 58
  SampleShape long_text;
  long_text.text_bytes = 20;  // 68
  samples.push_back(RobotSample(11, long_text));
  auto r = CountTokens(std::span<const Sample>(samples.data(), 1), spec, p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<int64_t>{58}));
  r = CountTokens(samples, spec, p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sample 11"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("68 tokens"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("instruction 20"), std::string::npos) << r.status();
}

TEST(CountTokensTest, MissingTensorIsAnError) {
  const SampleSpec spec = RobotSpec();
  const PackingSpec p = RobotPacking(64);
  std::vector<Sample> samples = {RobotSample(5, {})};
  samples[0].tensors.erase(samples[0].tensors.begin());  // cam0
  auto r = CountTokens(samples, spec, p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no tensor 'cam0'"), std::string::npos) << r.status();
}

// ---- config ----

constexpr char kConfig[] = R"(streams:
  cam0: {delta_timestamps: [-0.1, 0.0]}
packing:
  enabled: true
  max_tokens: 4096
  window: 0
  tokens:
    cam0: {per_frame: 256}
    observation.state: {per_step: 1}
    action: {per_step: 1}
    audio: {per_second: 50}
    instruction: {per_byte: 1}
  count_padding: false
)";

TEST(PackingSpecTest, ParsesTheExample) {
  auto p = PackingSpec::FromYaml(std::string_view(kConfig), RobotSpec(), "c.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->enabled);
  EXPECT_EQ(p->max_tokens, 4096);
  EXPECT_EQ(p->window, 0u);
  EXPECT_FALSE(p->count_padding);
  ASSERT_EQ(p->tokens.size(), 5u);
  EXPECT_EQ(p->tokens[0].per_unit, 256);
  EXPECT_EQ(p->tokens[1].per_unit, 1);
  EXPECT_EQ(p->tokens[2].per_unit, 1);
  EXPECT_EQ(p->tokens[3].per_unit, 50);
  EXPECT_EQ(p->tokens[3].audio_rate, 100);
  EXPECT_EQ(p->tokens[4].per_unit, 1);
}

TEST(PackingSpecTest, AbsentSectionMeansDisabled) {
  auto p = PackingSpec::FromYaml(std::string_view("streams: {cam0: {}}\n"), RobotSpec(), "c.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->enabled);
  EXPECT_EQ(p->tokens.size(), 5u);
  p = PackingSpec::FromYaml(std::string_view("packing: {enabled: false}\n"), RobotSpec(), "c.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->enabled);
}

TEST(PackingSpecTest, AudioRateFromTheManifestWhenTheSpecHasNone) {
  SampleSpec spec = RobotSpec();
  spec.streams[3].audio_rate = 0;
  const std::string yaml = "packing: {max_tokens: 4096, tokens: {audio: {per_second: 50}}}\n";
  auto p = PackingSpec::FromYaml(std::string_view(yaml), spec, "c.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("c.yaml:1:"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("audio rate"), std::string::npos) << p.status();
  Manifest manifest;
  manifest.streams.resize(4);
  manifest.streams[3].rate = 16000;
  p = PackingSpec::FromYaml(std::string_view(yaml), spec, "c.yaml", &manifest);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tokens[3].audio_rate, 16000);
}

struct ConfigError {
  const char* yaml;
  const char* where;    // file:line:col
  const char* message;  // part of the message
};

// Test output shows the case, not a byte dump of the struct.
void PrintTo(const ConfigError& c, std::ostream* os) {
  *os << "{where " << c.where << ", expects \"" << c.message << "\"}";
}

// "unknown key 'windw'" -> "unknown_key_windw": a readable, valid test name per case.
std::string CaseName(const ::testing::TestParamInfo<ConfigError>& info) {
  std::string name;
  for (const char* p = info.param.message; *p != 0 && name.size() < 48; ++p) {
    if (std::isalnum(static_cast<unsigned char>(*p))) {
      name.push_back(*p);
    } else if (!name.empty() && name.back() != '_') {
      name.push_back('_');
    }
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return std::to_string(info.index) + "_" + name;
}

class PackingConfigErrorTest : public ::testing::TestWithParam<ConfigError> {};

TEST_P(PackingConfigErrorTest, NamesFileLineAndColumn) {
  auto p = PackingSpec::FromYaml(std::string_view(GetParam().yaml), RobotSpec(), "c.yaml");
  ASSERT_FALSE(p.ok()) << GetParam().yaml;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(p.status().message());
  EXPECT_EQ(msg.rfind(GetParam().where, 0), 0u) << msg;
  EXPECT_NE(msg.find(GetParam().message), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Errors, PackingConfigErrorTest,
    ::testing::Values(
        ConfigError{"packing:\n  max_tokens: 64\n  windw: 3\n", "c.yaml:3:3",
                    "unknown key 'windw'"},
        ConfigError{"packing:\n  max_tokens: 64\n  tokens:\n    cam9: {per_frame: 1}\n",
                    "c.yaml:4:5", "'cam9' is not a stream"},
        ConfigError{"packing:\n  max_tokens: 64\n  tokens:\n    cam0: {per_step: 1}\n",
                    "c.yaml:4:12",
                    "unknown key 'per_step' in packing.tokens.cam0 (known: per_frame)"},
        ConfigError{"packing:\n  max_tokens: 64\n  tokens:\n    cam0: {}\n", "c.yaml:4:11",
                    "needs per_frame"},
        ConfigError{"packing:\n  max_tokens: 64\n  tokens:\n    cam0: {per_frame: -1}\n",
                    "c.yaml:4:23", "per_frame is -1"},
        ConfigError{"packing:\n  max_tokens: 64\n  tokens:\n    cam0: {per_frame: 1.5}\n",
                    "c.yaml:4:23", "must be an integer"},
        ConfigError{"packing:\n  tokens: {cam0: {per_frame: 1}}\n", "c.yaml:2:3",
                    "needs max_tokens"},
        ConfigError{"packing:\n  max_tokens: 0\n  tokens: {cam0: {per_frame: 1}}\n", "c.yaml:2:15",
                    "max_tokens is 0"},
        ConfigError{"packing:\n  max_tokens: 64\n", "c.yaml:2:3", "needs tokens"},
        ConfigError{"packing:\n  max_tokens: 64\n  tokens: {cam0: {per_frame: 0}}\n", "c.yaml:3:11",
                    "every stream 0 tokens"},
        ConfigError{"packing:\n  enabled: maybe\n  max_tokens: 64\n", "c.yaml:2:12",
                    "enabled must be true or false"},
        // 2 frames * 40 tokens = 80 > 64 before any text.
        ConfigError{"packing:\n  max_tokens: 64\n  tokens: {cam0: {per_frame: 40}}\n",
                    "c.yaml:2:15", "costs up to 80 tokens before text (cam0 80)"},
        ConfigError{"packing: [1, 2]\n", "c.yaml:1:10", "packing must be a mapping"},
        ConfigError{"packing: {max_tokens: 64\n", "c.yaml:", "not valid YAML"}),
    CaseName);

// ---- packing plans ----

// The rule of PackBestFitDecreasing, written as plainly as possible.
std::vector<std::vector<size_t>> ReferenceBfd(const std::vector<int64_t>& tokens,
                                              int64_t max_tokens, size_t window) {
  std::vector<std::vector<size_t>> out;
  const size_t w = window == 0 ? std::max<size_t>(tokens.size(), 1) : window;
  for (size_t begin = 0; begin < tokens.size(); begin += w) {
    const size_t end = std::min(tokens.size(), begin + w);
    std::vector<size_t> order(end - begin);
    std::iota(order.begin(), order.end(), begin);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tokens[a] > tokens[b]; });
    std::vector<std::vector<size_t>> seqs;
    std::vector<int64_t> room;
    for (size_t i : order) {
      int best = -1;
      for (size_t q = 0; q < seqs.size(); ++q) {
        if (room[q] >= tokens[i] && (best < 0 || room[q] < room[best])) best = static_cast<int>(q);
      }
      if (best < 0) {
        seqs.emplace_back();
        room.push_back(max_tokens);
        best = static_cast<int>(seqs.size() - 1);
      }
      seqs[best].push_back(i);
      room[best] -= tokens[i];
    }
    for (auto& s : seqs) {
      std::sort(s.begin(), s.end());
      out.push_back(s);
    }
  }
  return out;
}

// The fewest sequences any packing needs (exhaustive over assignments, for small inputs).
size_t OptimalSequences(const std::vector<int64_t>& tokens, int64_t max_tokens) {
  size_t best = tokens.size();
  std::vector<int64_t> room;
  auto search = [&](auto&& self, size_t i) -> void {
    if (room.size() >= best) return;
    if (i == tokens.size()) {
      best = room.size();
      return;
    }
    for (size_t q = 0; q < room.size(); ++q) {
      if (room[q] >= tokens[i]) {
        room[q] -= tokens[i];
        self(self, i + 1);
        room[q] += tokens[i];
      }
    }
    room.push_back(max_tokens - tokens[i]);
    self(self, i + 1);
    room.pop_back();
  };
  search(search, 0);
  return best;
}

void ExpectValidPlan(const PackPlan& plan, const std::vector<int64_t>& tokens, int64_t max_tokens,
                     size_t window) {
  std::vector<int> seen(tokens.size(), 0);
  int64_t total = 0;
  for (const auto& seq : plan.sequences) {
    ASSERT_FALSE(seq.empty());
    int64_t used = 0;
    for (size_t k = 0; k < seq.size(); ++k) {
      ASSERT_LT(seq[k], tokens.size());
      ++seen[seq[k]];
      used += tokens[seq[k]];
      if (k > 0) {
        EXPECT_LT(seq[k - 1], seq[k]) << "batch order within a sequence";
      }
      if (window > 0) {
        EXPECT_EQ(seq[k] / window, seq[0] / window) << "a sequence spans windows";
      }
    }
    EXPECT_LE(used, max_tokens);
    total += used;
  }
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(seen[i], 1) << "item " << i;
  EXPECT_EQ(plan.tokens_used, total);
  EXPECT_EQ(plan.max_tokens, max_tokens);
}

TEST(PackTest, BestFitDecreasingMatchesItsRuleAndIsNearOptimal) {
  Rng rng{1};
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t max_tokens = rng.Uniform(8, 40);
    const size_t n = static_cast<size_t>(rng.Uniform(0, 8));
    std::vector<int64_t> tokens(n);
    // Few distinct sizes, so ties in size and in room left happen often.
    for (auto& t : tokens) t = rng.Uniform(0, 4) * max_tokens / 4;
    const size_t window = static_cast<size_t>(rng.Uniform(0, 3));
    const PackPlan plan = PackBestFitDecreasing(tokens, max_tokens, window);
    ExpectValidPlan(plan, tokens, max_tokens, window);
    EXPECT_EQ(plan.sequences, ReferenceBfd(tokens, max_tokens, window)) << "trial " << trial;
    // Deterministic: the same input gives the same plan.
    EXPECT_EQ(plan.sequences, PackBestFitDecreasing(tokens, max_tokens, window).sequences);
    if (window == 0) {
      const size_t opt = OptimalSequences(tokens, max_tokens);
      EXPECT_GE(plan.sequences.size(), opt);
      EXPECT_LE(2 * plan.sequences.size(), 3 * opt) << "BFD is within 3/2 of the optimum";
    }
  }
}

TEST(PackTest, BestFitDecreasingOnRandomSizes) {
  Rng rng{2};
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t max_tokens = rng.Uniform(10, 100);
    std::vector<int64_t> tokens(static_cast<size_t>(rng.Uniform(1, 9)));
    for (auto& t : tokens) t = rng.Uniform(1, max_tokens);
    const PackPlan plan = PackBestFitDecreasing(tokens, max_tokens, 0);
    ExpectValidPlan(plan, tokens, max_tokens, 0);
    EXPECT_EQ(plan.sequences, ReferenceBfd(tokens, max_tokens, 0));
    const size_t opt = OptimalSequences(tokens, max_tokens);
    EXPECT_GE(plan.sequences.size(), opt);
    EXPECT_LE(2 * plan.sequences.size(), 3 * opt);
  }
}

TEST(PackTest, HandWorkedExample) {
  // Decreasing: 7 (i1), 5 (i0), 5 (i3), 3 (i2), 2 (i4) into 10.
  //   i1 -> s0 (room 3); i0 -> s1 (room 5); i3 -> s1 (room 0); i2 -> s0 (room 0); i4 -> s2.
  const std::vector<int64_t> tokens = {5, 7, 3, 5, 2};
  const PackPlan plan = PackBestFitDecreasing(tokens, 10, 0);
  EXPECT_EQ(plan.sequences, (std::vector<std::vector<size_t>>{{1, 2}, {0, 3}, {4}}));
  EXPECT_EQ(plan.tokens_used, 22);
  EXPECT_DOUBLE_EQ(plan.fill_ratio(), 22.0 / 30.0);
  // First fit in batch order: 5 -> s0, 7 -> s1, 3 -> s0, 5 -> s2, 2 -> s0.
  const PackPlan ff = PackFirstFit(tokens, 10, 0);
  EXPECT_EQ(ff.sequences, (std::vector<std::vector<size_t>>{{0, 2, 4}, {1}, {3}}));
  // Windows of 2: {5, 7} {3, 5} {2}, each packed on its own.
  const PackPlan w2 = PackBestFitDecreasing(tokens, 10, 2);
  EXPECT_EQ(w2.sequences, (std::vector<std::vector<size_t>>{{1}, {0}, {2, 3}, {4}}));
  EXPECT_EQ(PackBestFitDecreasing({}, 10, 0).sequences.size(), 0u);
  EXPECT_EQ(PackBestFitDecreasing({}, 10, 0).fill_ratio(), 0.0);
}

TEST(PackTest, BestFitDecreasingFillsAtLeastAsWellAsFirstFit) {
  Rng rng{3};
  double bfd_sum = 0, ff_sum = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t max_tokens = 4096;
    std::vector<int64_t> tokens(256);
    // Mixed sizes: short clips to long ones, as a variable-length video mix gives.
    for (auto& t : tokens) t = rng.Uniform(1, 8) * 256 + rng.Uniform(50, 400);
    const PackPlan bfd = PackBestFitDecreasing(tokens, max_tokens, 0);
    const PackPlan ff = PackFirstFit(tokens, max_tokens, 0);
    ExpectValidPlan(bfd, tokens, max_tokens, 0);
    ExpectValidPlan(ff, tokens, max_tokens, 0);
    EXPECT_GE(bfd.fill_ratio(), ff.fill_ratio()) << "trial " << trial;
    bfd_sum += bfd.fill_ratio();
    ff_sum += ff.fill_ratio();
  }
  EXPECT_GT(bfd_sum, ff_sum);
}

// ---- batches ----

TEST(StackSamplesTest, TextOfDifferentLengthsIsPaddedWithAMask) {
  const SampleSpec spec = RobotSpec();
  std::vector<Sample> samples;
  for (int len : {3, 0, 5}) {
    SampleShape shape;
    shape.text_bytes = len;
    samples.push_back(RobotSample(samples.size() + 1, shape));
  }
  auto b = StackSamples(samples, spec, /*pinned=*/false);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->ids.size(), 3u);
  EXPECT_EQ(b->ids[2], (SampleId{3, 0, 3}));
  for (const TensorView& v : b->tensors) {
    EXPECT_EQ(v.offset % 64, 0u) << v.name;
    EXPECT_LE(v.offset + v.bytes, b->buffer->size()) << v.name;
  }
  const TensorView* text = b->Find("instruction");
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(text->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(Values<uint8_t>(*b, "instruction"),
            (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3}));
  const TensorView* mask = b->Find("instruction_mask");
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(mask->dtype, DType::kBool);
  EXPECT_EQ(mask->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(Values<uint8_t>(*b, "instruction_mask"),
            (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}));
  // Fixed-size tensors are stacked, with no mask.
  const TensorView* cam = b->Find("cam0");
  ASSERT_NE(cam, nullptr);
  EXPECT_EQ(cam->shape, (std::vector<int64_t>{3, 2, 4, 4, 3}));
  EXPECT_EQ(b->Find("cam0_mask"), nullptr);
  EXPECT_EQ(b->Find("action_is_pad")->shape, (std::vector<int64_t>{3, 5}));
  const std::vector<uint8_t> cam_bytes = Values<uint8_t>(*b, "cam0");
  EXPECT_EQ(cam_bytes[0], 1);
  EXPECT_EQ(cam_bytes[96], 2);
  EXPECT_EQ(cam_bytes[2 * 96 + 95], 3);
}

TEST(StackSamplesTest, ALargeBatchIsTheSameBytesOnAnyThreadsAndInAnyBuffer) {
  // 16 samples of two 256x256 frames: 6.3 MB, filled on several threads above 4 MiB.
  std::vector<Sample> samples;
  for (int i = 0; i < 16; ++i) {
    SampleShape shape;
    shape.text_bytes = 1 + i % 7;
    Sample s = RobotSample(static_cast<uint64_t>(i + 1), shape);
    s.tensors[0] = MakeTensor("cam0", DType::kUint8, {2, 256, 256, 3}, static_cast<uint8_t>(i * 13));
    samples.push_back(std::move(s));
  }
  auto one = StackSamples(samples, RobotSpec(), false, nullptr, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_GE(one->buffer->size(), size_t{4} << 20);
  const std::string want(reinterpret_cast<const char*>(one->buffer->data()), one->buffer->size());
  for (int threads : {2, 3, 16}) {
    // A buffer given by `buffers` (a server's shared region) full of garbage: every byte of the
    // batch is written, gaps included.
    std::vector<uint8_t> memory(one->buffer->size() + 4096, 0xAB);
    size_t asked = 0;
    BatchBuffers buffers = [&](size_t bytes) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
      asked = bytes;
      return HostBuffer::Borrow(memory.data(), bytes, std::make_shared<int>(0));
    };
    auto b = StackSamples(samples, RobotSpec(), false, buffers, threads);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(asked, one->buffer->size());
    EXPECT_EQ(b->buffer->data(), memory.data());
    EXPECT_TRUE(std::string(reinterpret_cast<const char*>(b->buffer->data()), b->buffer->size()) == want)
        << threads << " threads";
  }
  // A buffer that cannot be had ends the batch with its error.
  auto refused = StackSamples(samples, RobotSpec(), false, [](size_t) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
    return absl::CancelledError("the stream ended");
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kCancelled);
}

TEST(StackSamplesTest, TextOfEqualLengthsStillHasAMask) {
  std::vector<Sample> samples = {RobotSample(1, {}), RobotSample(2, {})};
  auto b = StackSamples(samples, RobotSpec(), false);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_NE(b->Find("instruction_mask"), nullptr);
  EXPECT_EQ(Values<uint8_t>(*b, "instruction_mask"), std::vector<uint8_t>(20, 1));
}

TEST(StackSamplesTest, ShapeMismatchesAreErrorsNamingTheTensor) {
  std::vector<Sample> samples = {RobotSample(1, {}), RobotSample(2, {})};
  samples[1].tensors[0] = MakeTensor("cam0", DType::kUint8, {2, 4, 5, 3}, 0);
  auto b = StackSamples(samples, RobotSpec(), false);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("tensor 'cam0' has shape [2, 4, 5, 3] in sample 2"),
            std::string::npos)
      << b.status();

  samples = {RobotSample(1, {}), RobotSample(2, {})};
  samples[1].tensors.pop_back();
  b = StackSamples(samples, RobotSpec(), false);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("sample 2"), std::string::npos) << b.status();

  b = StackSamples({}, RobotSpec(), false);
  EXPECT_FALSE(b.ok());
}

// Packs `samples` as BFD says and checks everything a model relies on.
void CheckPackedBatch(std::vector<Sample> samples, const SampleSpec& spec, const PackingSpec& p) {
  auto tokens = CountTokens(samples, spec, p);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const PackPlan plan = PackBestFitDecreasing(*tokens, p.max_tokens, p.window);
  std::vector<uint64_t> original_index;
  for (const Sample& s : samples) original_index.push_back(s.index);
  auto b = PackSamples(samples, spec, p, *tokens, plan, false);
  ASSERT_TRUE(b.ok()) << b.status();

  const size_t n = samples.size(), S = plan.sequences.size(), K = spec.streams.size();
  const size_t T = static_cast<size_t>(p.max_tokens);
  // Packed order: sequence 0's samples, then sequence 1's...
  std::vector<size_t> packed;
  for (const auto& seq : plan.sequences) packed.insert(packed.end(), seq.begin(), seq.end());
  ASSERT_EQ(b->ids.size(), n);
  for (size_t p_i = 0; p_i < n; ++p_i) EXPECT_EQ(b->ids[p_i].index, original_index[packed[p_i]]);
  // The stacked tensors follow the same order (every byte of a sample's tensors is its index).
  const std::vector<float> action = Values<float>(*b, "action");
  for (size_t p_i = 0; p_i < n; ++p_i) {
    uint8_t expect[4];
    std::memset(expect, static_cast<int>(original_index[packed[p_i]] % 251), 4);
    float f;
    std::memcpy(&f, expect, 4);
    EXPECT_EQ(std::memcmp(&action[p_i * 10], &f, 4), 0) << "packed position " << p_i;
  }

  for (const char* name : {"segment_ids", "positions"}) {
    ASSERT_EQ(b->Find(name)->shape,
              (std::vector<int64_t>{static_cast<int64_t>(S), static_cast<int64_t>(T)}));
    EXPECT_EQ(b->Find(name)->dtype, DType::kInt32);
  }
  EXPECT_EQ(b->Find("stream_offsets")->shape,
            (std::vector<int64_t>{static_cast<int64_t>(n), static_cast<int64_t>(K)}));
  const auto seg = Values<int32_t>(*b, "segment_ids");
  const auto pos = Values<int32_t>(*b, "positions");
  const auto s_seq = Values<int32_t>(*b, "sample_sequence");
  const auto s_off = Values<int32_t>(*b, "sample_offset");
  const auto st_off = Values<int32_t>(*b, "stream_offsets");
  const auto st_len = Values<int32_t>(*b, "stream_lengths");

  // Which packed sample owns each token (-1: padding), from the per-sample metadata.
  std::vector<int> owner(S * T, -1);
  std::vector<int> slot_in_sequence(n);
  for (size_t p_i = 0, q = 0, slot = 0; p_i < n; ++p_i, ++slot) {
    while (slot >= plan.sequences[q].size()) ++q, slot = 0;
    EXPECT_EQ(s_seq[p_i], static_cast<int32_t>(q));
    slot_in_sequence[p_i] = static_cast<int>(slot);
    const int64_t count = (*tokens)[packed[p_i]];
    // The stream ranges tile [offset, offset + count) in spec order.
    int64_t at = s_off[p_i];
    for (size_t k = 0; k < K; ++k) {
      EXPECT_EQ(st_off[p_i * K + k], at) << "sample " << p_i << " stream " << k;
      EXPECT_GE(st_len[p_i * K + k], 0);
      at += st_len[p_i * K + k];
    }
    EXPECT_EQ(at, s_off[p_i] + count);
    for (int64_t t = s_off[p_i]; t < s_off[p_i] + count; ++t) {
      ASSERT_LT(t, static_cast<int64_t>(T));
      int& o = owner[q * T + static_cast<size_t>(t)];
      EXPECT_EQ(o, -1) << "two samples claim token " << t << " of sequence " << q;
      o = static_cast<int>(p_i);
      EXPECT_EQ(seg[q * T + t], static_cast<int32_t>(slot + 1));
      EXPECT_EQ(pos[q * T + t], t - s_off[p_i]);
    }
  }
  // segment_ids agree with the owners: 0 exactly on padding.
  for (size_t i = 0; i < S * T; ++i) {
    if (owner[i] < 0) {
      EXPECT_EQ(seg[i], 0);
      EXPECT_EQ(pos[i], 0);
    } else {
      EXPECT_EQ(seg[i], slot_in_sequence[owner[i]] + 1);
    }
  }
  // The attention mask a model builds from segment_ids (i may attend j iff same sequence, equal
  // and non-zero segment ids) never connects two samples, and connects each sample fully.
  for (size_t q = 0; q < S; ++q) {
    for (size_t i = 0; i < T; ++i) {
      for (size_t j = 0; j < T; ++j) {
        const bool attend = seg[q * T + i] != 0 && seg[q * T + i] == seg[q * T + j];
        const int oi = owner[q * T + i], oj = owner[q * T + j];
        EXPECT_EQ(attend, oi >= 0 && oi == oj) << "sequence " << q << " tokens " << i << ", " << j;
      }
    }
  }
}

TEST(PackSamplesTest, NoAttentionCrossesSamplesAndStreamsTileEachSegment) {
  const SampleSpec spec = RobotSpec();
  Rng rng{4};
  for (int trial = 0; trial < 6; ++trial) {
    PackingSpec p = RobotPacking(trial % 2 ? 64 : 128);
    p.window = static_cast<size_t>(trial % 3) * 4;
    p.count_padding = trial == 5;
    std::vector<Sample> samples;
    const int n = static_cast<int>(rng.Uniform(1, 24));
    for (int i = 0; i < n; ++i) {
      SampleShape shape;
      shape.cam_pads = rng.Uniform(0, 9) == 0 ? 1 : 0;
      shape.action_pads = rng.Uniform(0, 5) == 0 ? static_cast<int>(rng.Uniform(1, 5)) : 0;
      shape.audio_pads = static_cast<int>(rng.Uniform(0, 3) == 0 ? rng.Uniform(1, 100) : 0);
      shape.text_bytes = static_cast<int>(rng.Uniform(0, 16));
      samples.push_back(RobotSample(static_cast<uint64_t>(100 * trial + i), shape));
    }
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    CheckPackedBatch(std::move(samples), spec, p);
  }
}

TEST(PackSamplesTest, StreamLengthsAreThePerStreamTokenCounts) {
  const SampleSpec spec = RobotSpec();
  const PackingSpec p = RobotPacking(64);
  SampleShape shape;
  shape.cam_pads = 1;
  shape.action_pads = 2;
  shape.audio_pads = 50;
  shape.text_bytes = 4;
  std::vector<Sample> samples = {RobotSample(7, shape)};
  auto tokens = CountTokens(samples, spec, p);
  ASSERT_TRUE(tokens.ok());
  const PackPlan plan = PackBestFitDecreasing(*tokens, p.max_tokens, 0);
  auto b = PackSamples(samples, spec, p, *tokens, plan, false);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Values<int32_t>(*b, "stream_lengths"), (std::vector<int32_t>{16, 1, 3, 5, 4}));
  EXPECT_EQ(Values<int32_t>(*b, "stream_offsets"), (std::vector<int32_t>{0, 16, 17, 20, 25}));
  EXPECT_NE(b->Find("instruction_mask"), nullptr);
}

// Every tensor carries its role from the sample to the wire (server/batch_encoder.cc sends
// TensorView::role): stacked batches mark the padding masks and nothing else; packed batches also
// mark segment ids, positions, and what is not a stream's samples as per-sample bookkeeping.
std::map<std::string, TensorRole> Roles(const Batch& b) {
  std::map<std::string, TensorRole> out;
  for (const TensorView& v : b.tensors) out[v.name] = v.role;
  return out;
}

TEST(TensorRoleTest, StackedBatchesMarkThePaddingMasks) {
  std::vector<Sample> samples = {RobotSample(1, {}), RobotSample(2, {})};
  for (Sample& s : samples) {
    OwnedTensor tag = MakeTensor("dataset", DType::kInt32, {}, 0);
    tag.role = TensorRole::kSampleInfo;  // a mixture's tag (pipeline/source.cc)
    s.tensors.push_back(std::move(tag));
  }
  auto b = StackSamples(samples, RobotSpec(), false);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::map<std::string, TensorRole> roles = Roles(*b);
  for (const auto& [name, role] : roles) {
    const bool mask = name.size() > 7 && name.ends_with("_is_pad");
    EXPECT_EQ(role, mask ? TensorRole::kPaddingMask : TensorRole::kData) << name;
  }
  EXPECT_EQ(roles.at("instruction_mask"), TensorRole::kData);
  EXPECT_EQ(roles.at("dataset"), TensorRole::kData);
}

TEST(TensorRoleTest, PackedBatchesMarkPackingTensors) {
  const SampleSpec spec = RobotSpec();
  const PackingSpec p = RobotPacking(64);
  std::vector<Sample> samples = {RobotSample(1, {}), RobotSample(2, {})};
  for (Sample& s : samples) {
    OwnedTensor tag = MakeTensor("dataset", DType::kInt32, {}, 0);
    tag.role = TensorRole::kSampleInfo;
    s.tensors.push_back(std::move(tag));
  }
  auto tokens = CountTokens(samples, spec, p);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  auto b = PackSamples(samples, spec, p, *tokens, PackBestFitDecreasing(*tokens, p.max_tokens, 0),
                       false);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::map<std::string, TensorRole> roles = Roles(*b);
  EXPECT_EQ(roles.at("segment_ids"), TensorRole::kSegmentIds);
  EXPECT_EQ(roles.at("positions"), TensorRole::kPositions);
  for (const char* info : {"sample_sequence", "sample_offset", "stream_offsets", "stream_lengths",
                           "instruction_mask", "dataset"}) {
    EXPECT_EQ(roles.at(info), TensorRole::kSampleInfo) << info;
  }
  for (const StreamSpec& s : spec.streams) {
    EXPECT_EQ(roles.at(s.name), TensorRole::kData) << s.name;
    if (s.kind != pb::TEXT) {
      EXPECT_EQ(roles.at(s.name + "_is_pad"), TensorRole::kPaddingMask) << s.name;
    }
  }
}

TEST(PackSamplesTest, BadPlansAreErrors) {
  const SampleSpec spec = RobotSpec();
  const PackingSpec p = RobotPacking(128);
  std::vector<Sample> samples = {RobotSample(1, {}), RobotSample(2, {}), RobotSample(3, {})};
  auto tokens = CountTokens(samples, spec, p);
  ASSERT_TRUE(tokens.ok());
  auto pack = [&](std::vector<std::vector<size_t>> seqs, std::vector<int64_t> t) {
    PackPlan plan;
    plan.sequences = std::move(seqs);
    plan.max_tokens = 128;
    return PackSamples(samples, spec, p, t, plan, false).status();
  };
  EXPECT_TRUE(pack({{0, 1}, {2}}, *tokens).ok());
  EXPECT_NE(pack({{0, 1}}, *tokens).message().find("batch position 2 (sample 3) is in no"),
            std::string::npos);
  EXPECT_NE(pack({{0, 1}, {1, 2}}, *tokens).message().find("batch position 1 is in packed"),
            std::string::npos);
  EXPECT_NE(pack({{0, 1, 2}}, *tokens).message().find("over packing.max_tokens 128"),
            std::string::npos);
  std::vector<int64_t> wrong = *tokens;
  wrong[1] += 1;
  EXPECT_NE(pack({{0, 1}, {2}}, wrong).message().find("were given for it"), std::string::npos);
  EXPECT_FALSE(pack({{0, 1}, {2}}, {58, 58}).ok());
}

}  // namespace
}  // namespace conveyor
