// float16 and bfloat16 on the wire (docs/sampling.md "Tensor dtypes"), on a WebDataset shard of
// .npy members written at test time by tests/fixtures/tensor_dtype/make_tensor_dtype.py, whose
// reference conversions are numpy's `astype(np.float16)` and torch's `.to(torch.bfloat16)`: the
// conversions bit for bit (subnormals, ties, overflow, NaN payloads), the `dtype:` key resolved
// and refused, the assembled tensors' bits and padded rows, float32 configs keeping the digests
// they had before the key existed, packing of 2-byte rows, a mixture's padding in the stream's
// dtype, and a served float16 stream arriving over gRPC and shared memory with the offline
// batches' bits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "base/float16.h"
#include "client/client.h"
#include "datasets/dataset.h"
#include "datasets/sample_index.h"
#include "sample/sample_assembler.h"
#include "sample/sample_spec.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::Capture;
using testing::ReadFile;
using testing::ServerProcess;
using testing::ShellCommand;
using testing::ShellQuote;
using testing::TempDir;

const std::string kCli = CONVEYOR_CLI;

// A float32, a float16 member in their stored shapes, a float64 and an int32 member flat.
constexpr char kFloat32Config[] = R"(anchor: f32.npy
streams:
  f32.npy: {shape: stored}
  f16.npy: {shape: stored}
  f64.npy: {}
  i32.npy: {}
pipeline:
  global_batch_size: 2
  seed: 3
)";

// `conveyor batches --digest --steps 3` of kFloat32Config, as the build before the `dtype:` key
// printed them: a config without the key keeps its bits.
constexpr const char* kFloat32Digests[] = {
    "0:0 consumer 0/1 samples 2 ids cf7fc1eeb1f6f62e sha256 "
    "d81dc71aa4f561c2d00fc3c1f816f4a4d66656d936f212e09b82c7ec29e4844e",
    "0:1 consumer 0/1 samples 2 ids 1acf0d241f0c176a sha256 "
    "e5b0994600c08c99d946bc15aaa2685f98d581923fa11dd14aac9befe90d6173",
    "0:2 consumer 0/1 samples 2 ids 8eb4d15f1242c48a sha256 "
    "51f31243583856da8ac0b2839bdc92b087851ea8556c4c0fcc88f927f47cde45"};

// Served as 2-byte floats: the float32 member rounded to float16, the float16 member as stored,
// the float64 member as bfloat16.
constexpr char kHalfConfig[] = R"(anchor: f32.npy
streams:
  f32.npy: {shape: stored, dtype: float16}
  f16.npy: {shape: stored, dtype: stored}
  f64.npy: {dtype: bfloat16}
pipeline:
  global_batch_size: 2
  seed: 3
)";

template <typename T>
std::vector<T> ReadArray(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

class TensorDTypeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index").c_str(), 1);
    const auto r = testing::RunCommand(
        "/usr/bin/python3 " +
        ShellQuote(std::string(CONVEYOR_SOURCE_DIR) +
                   "/tests/fixtures/tensor_dtype/make_tensor_dtype.py") +
        " " + ShellQuote(dir_->Join("fx")) + " 2>&1");
    if (r.exit_code != 0) {
      error_ = r.output;
      return;
    }
    auto d = Dataset::Open(Root());
    if (!d.ok()) {
      error_ = std::string(d.status().message());
      return;
    }
    dataset_ = d->release();
    testing::WriteFile(dir_->Join("f32.yaml"), kFloat32Config);
    testing::WriteFile(dir_->Join("half.yaml"), kHalfConfig);
  }
  static void TearDownTestSuite() {
    delete dataset_;
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << "make_tensor_dtype.py:\n" << error_; }

  static std::string Root() { return dir_->Join("fx/wds"); }
  static std::string Fx(const std::string& file) { return dir_->Join("fx/" + file); }
  static absl::StatusOr<SampleSpec> Parse(const std::string& yaml) {
    return SampleSpec::FromYaml(yaml, dataset_->manifest(), "dtype.yaml");
  }
  // `conveyor batches --digest` lines of `config` (a file) with `extra` flags.
  static std::vector<std::string> Offline(const std::string& config, const std::string& extra) {
    int code = 0;
    const std::string out = Capture(ShellCommand({kCli, "batches", Root(), "--config", config,
                                                  "--digest"}) + " " + extra + " 2>/dev/null",
                                    &code);
    EXPECT_EQ(code, 0) << out;
    return testing::SplitLines(out);
  }

  static TempDir* dir_;
  static Dataset* dataset_;
  static std::string error_;
};
TempDir* TensorDTypeTest::dir_ = nullptr;
Dataset* TensorDTypeTest::dataset_ = nullptr;
std::string TensorDTypeTest::error_;

TEST(DTypeTest, SizesNamesAndNumpyTypes) {
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(NumpyDescr(DType::kFloat16), "<f2");
  EXPECT_EQ(NumpyDescr(DType::kBFloat16), "");  // numpy has none: the .npy writers refuse it
}

// Every value of values.f32 (each float16 and its float32 neighbours and ties, the subnormal
// and overflow edges, NaN payloads, random bit patterns) as numpy and torch round it.
TEST_F(TensorDTypeTest, ConversionsEqualNumpyAndTorch) {
  const std::vector<float> values = ReadArray<float>(Fx("values.f32"));
  const std::vector<uint16_t> half = ReadArray<uint16_t>(Fx("values.half"));
  const std::vector<uint16_t> bf16 = ReadArray<uint16_t>(Fx("values.bf16"));
  ASSERT_GT(values.size(), 500000u);
  ASSERT_EQ(half.size(), values.size());
  ASSERT_EQ(bf16.size(), values.size());
  size_t half_wrong = 0, bf16_wrong = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (FloatToHalf(values[i]) != half[i] && half_wrong++ < 5) {
      ADD_FAILURE() << "float16 of bits 0x" << std::hex << std::bit_cast<uint32_t>(values[i])
                    << ": 0x" << FloatToHalf(values[i]) << ", numpy 0x" << half[i];
    }
    if (FloatToBFloat16(values[i]) != bf16[i] && bf16_wrong++ < 5) {
      ADD_FAILURE() << "bfloat16 of bits 0x" << std::hex << std::bit_cast<uint32_t>(values[i])
                    << ": 0x" << FloatToBFloat16(values[i]) << ", torch 0x" << bf16[i];
    }
  }
  EXPECT_EQ(half_wrong, 0u);
  EXPECT_EQ(bf16_wrong, 0u);

  // Every float16 widens as numpy widens it (NaN payloads and signs kept) and rounds back to
  // itself; every non-NaN bfloat16 too.
  const std::vector<float> halves = ReadArray<float>(Fx("halves.f32"));
  ASSERT_EQ(halves.size(), 65536u);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(halves[h])) << h;
    ASSERT_EQ(FloatToHalf(f), h);
    const bool nan = (h & 0x7fffu) > 0x7f80u;
    if (!nan) {
      ASSERT_EQ(FloatToBFloat16(BFloat16ToFloat(static_cast<uint16_t>(h))), h);
    }
  }
}

TEST_F(TensorDTypeTest, TheDtypeKeyResolves) {
  auto dtype_of = [&](const std::string& stream, const std::string& dtype) {
    auto s = Parse("anchor: f32.npy\nstreams:\n  " + stream + ": {dtype: " + dtype + "}\n");
    EXPECT_TRUE(s.ok()) << stream << " " << dtype << ": " << s.status();
    return s.ok() ? s->streams[0].value_dtype : DType::kUint8;
  };
  auto none = Parse("anchor: f32.npy\nstreams:\n  f32.npy: {}\n");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->streams[0].value_dtype, DType::kFloat32);
  EXPECT_EQ(dtype_of("f32.npy", "float32"), DType::kFloat32);
  EXPECT_EQ(dtype_of("f32.npy", "float16"), DType::kFloat16);
  EXPECT_EQ(dtype_of("f32.npy", "bfloat16"), DType::kBFloat16);
  EXPECT_EQ(dtype_of("f16.npy", "stored"), DType::kFloat16);
  EXPECT_EQ(dtype_of("f32.npy", "stored"), DType::kFloat32);
  EXPECT_EQ(dtype_of("f64.npy", "stored"), DType::kFloat32);  // the wire has no float64

  struct Bad {
    std::string stream, dtype, says;
  };
  for (const Bad& b : {Bad{"i32.npy", "stored", "'<i4'"}, Bad{"f32.npy", "half", "float16"},
                       Bad{"f32.npy", "[float16]", "dtype"}}) {
    auto s = Parse("anchor: f32.npy\nstreams:\n  " + b.stream + ": {dtype: " + b.dtype + "}\n");
    ASSERT_FALSE(s.ok()) << b.stream << " " << b.dtype;
    EXPECT_NE(std::string(s.status().message()).find(b.says), std::string::npos) << s.status();
    EXPECT_NE(std::string(s.status().message()).find("dtype.yaml"), std::string::npos) << s.status();
  }
}

// The assembled tensors hold numpy's float16 of the float32 member, the float16 member's own
// bytes, torch's bfloat16 of the float32 member; the padding mask stays bool.
TEST_F(TensorDTypeTest, AssembledTensorsHoldTheReferenceBits) {
  auto half = Parse("anchor: f32.npy\nstreams:\n  f32.npy: {shape: stored, dtype: float16}\n"
                    "  f16.npy: {shape: stored, dtype: stored}\n");
  auto bf16 = Parse("anchor: f32.npy\nstreams:\n  f32.npy: {shape: stored, dtype: bfloat16}\n");
  auto f32 = Parse("anchor: f32.npy\nstreams:\n  f32.npy: {shape: stored}\n");
  ASSERT_TRUE(half.ok() && bf16.ok() && f32.ok()) << half.status() << bf16.status() << f32.status();
  auto index = SampleIndex::Build(*dataset_, half->anchor_stream, {}, {}, 0);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 6u);
  SampleAssembler a_half(*dataset_, *half, *index), a_bf16(*dataset_, *bf16, *index),
      a_f32(*dataset_, *f32, *index);
  for (uint64_t e = 0; e < 6; ++e) {
    const std::string n = std::to_string(e);
    auto h = a_half.Assemble(index->EpisodeStart(e), 1, 0);
    auto b = a_bf16.Assemble(index->EpisodeStart(e), 1, 0);
    auto f = a_f32.Assemble(index->EpisodeStart(e), 1, 0);
    ASSERT_TRUE(h.ok() && b.ok() && f.ok()) << h.status() << b.status() << f.status();
    const OwnedTensor* h32 = h->Find("f32.npy");
    const OwnedTensor* h16 = h->Find("f16.npy");
    const OwnedTensor* b32 = b->Find("f32.npy");
    const OwnedTensor* f32t = f->Find("f32.npy");
    ASSERT_TRUE(h32 && h16 && b32 && f32t);
    EXPECT_EQ(h32->dtype, DType::kFloat16);
    EXPECT_EQ(h16->dtype, DType::kFloat16);
    EXPECT_EQ(b32->dtype, DType::kBFloat16);
    EXPECT_EQ(h32->shape, (std::vector<int64_t>{4, 8}));
    auto text = [](const OwnedTensor* t) { return std::string(t->data.begin(), t->data.end()); };
    EXPECT_EQ(text(h32), ReadFile(Fx("expected/" + n + ".f32.half"))) << e;
    EXPECT_EQ(text(h16), ReadFile(Fx("expected/" + n + ".f16.bits"))) << e;
    EXPECT_EQ(text(b32), ReadFile(Fx("expected/" + n + ".f32.bf16"))) << e;
    EXPECT_EQ(text(f32t), ReadFile(Fx("expected/" + n + ".f32.f32"))) << e;
    const OwnedTensor* pad = h->Find("f32.npy_is_pad");
    ASSERT_NE(pad, nullptr);
    EXPECT_EQ(pad->dtype, DType::kBool);
  }

  // Times outside the clip (one instant, t = 0) are padding: the rows repeat the clamped row, in
  // float16, and `_is_pad` marks them.
  auto padded = Parse("anchor: f32.npy\nstreams:\n  f32.npy: {delta_timestamps: [-0.5, 0.0, 0.5], "
                      "dtype: float16}\n");
  ASSERT_TRUE(padded.ok()) << padded.status();
  SampleAssembler a_padded(*dataset_, *padded, *index);
  auto p = a_padded.Assemble(index->EpisodeStart(2), 1, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  const OwnedTensor* rows = p->Find("f32.npy");
  const OwnedTensor* pads = p->Find("f32.npy_is_pad");
  ASSERT_TRUE(rows && pads);
  EXPECT_EQ(rows->dtype, DType::kFloat16);
  ASSERT_EQ(rows->shape, (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(pads->data, (std::vector<uint8_t>{1, 0, 1}));
  const std::string want = ReadFile(Fx("expected/2.f32.half"));
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(std::string(rows->data.begin() + 64 * r, rows->data.begin() + 64 * (r + 1)), want) << r;
  }
}

// Versioning: a config without `dtype:`, and one that says float32, give the digests the build
// before the key gave; float16 changes them (a digest covers the bytes and the dtype's name).
TEST_F(TensorDTypeTest, Float32ConfigsKeepTheirDigests) {
  const std::vector<std::string> want(std::begin(kFloat32Digests), std::end(kFloat32Digests));
  EXPECT_EQ(Offline(dir_->Join("f32.yaml"), "--steps 3"), want);
  std::string said = kFloat32Config;
  said.replace(said.find("f32.npy: {shape: stored}"), 24, "f32.npy: {shape: stored, dtype: float32}");
  testing::WriteFile(dir_->Join("f32_said.yaml"), said);
  EXPECT_EQ(Offline(dir_->Join("f32_said.yaml"), "--steps 3"), want);
  const std::vector<std::string> half = Offline(dir_->Join("half.yaml"), "--steps 3");
  ASSERT_EQ(half.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(half[i].substr(0, half[i].find(" sha256")), want[i].substr(0, want[i].find(" sha256")));
    EXPECT_NE(half[i], want[i]);
  }
  // The same bits at any thread count.
  EXPECT_EQ(Offline(dir_->Join("half.yaml"), "--steps 3 --threads 2"), half);
}

// The bytes of a .npy file that `conveyor batches --out` wrote, after its header; "" unless its
// descr is `descr`.
std::string NpyData(const std::string& path, const std::string& descr) {
  const std::string npy = ReadFile(path);
  if (npy.size() < 10 || npy.find("'descr': '" + descr + "'") == std::string::npos) return "";
  return npy.substr(10 + (static_cast<uint8_t>(npy[8]) | static_cast<uint8_t>(npy[9]) << 8));
}

// Sequence packing concatenates 2-byte rows: every row of a packed float16 tensor is one of the
// members' rows (or zero padding), at 1 and 2 threads alike. bfloat16 cannot be written as .npy.
TEST_F(TensorDTypeTest, PackingCopiesTwoByteRows) {
  testing::WriteFile(dir_->Join("packed.yaml"),
                     "anchor: f16.npy\nstreams:\n  f16.npy: {shape: stored, dtype: stored}\n"
                     "pipeline: {global_batch_size: 3, seed: 5}\n"
                     "packing: {max_tokens: 9, tokens: {f16.npy: {per_step: 1}}}\n");
  const std::vector<std::string> one = Offline(dir_->Join("packed.yaml"), "--steps 2 --threads 1");
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(Offline(dir_->Join("packed.yaml"), "--steps 2 --threads 2"), one);

  std::set<std::string> rows;  // every 8-half row of the members
  for (int e = 0; e < 6; ++e) {
    const std::string bits = ReadFile(Fx("expected/" + std::to_string(e) + ".f16.bits"));
    for (size_t r = 0; r < 4; ++r) rows.insert(bits.substr(r * 16, 16));
  }
  const std::string out = dir_->Join("packed_out");
  Offline(dir_->Join("packed.yaml"), "--steps 1 --out " + ShellQuote(out));
  const std::string data = NpyData(out + "/0-0/f16.npy.npy", "<f2");
  ASSERT_FALSE(data.empty());
  ASSERT_EQ(data.size() % 16, 0u);
  size_t real = 0;
  for (size_t at = 0; at < data.size(); at += 16) {
    const std::string row = data.substr(at, 16);
    if (row == std::string(16, '\0')) continue;
    EXPECT_TRUE(rows.count(row)) << "row " << at / 16 << " is no member's row";
    ++real;
  }
  EXPECT_GE(real, 4u);

  const auto refused = testing::RunCommand(
      ShellCommand({kCli, "batches", Root(), "--config", dir_->Join("half.yaml"), "--steps", "1",
                    "--out", dir_->Join("bf16_out")}) + " 2>&1");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("bfloat16"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("f64.npy.npy"), std::string::npos) << refused.output;
}

// A mixture pads in the stream's dtype: the narrower dataset's float16 rows are widened with
// zeros (0.0 in float16) and `_dim_is_pad` marks them; its missing float16 stream is zeros with
// `_is_pad` set; the wide dataset's rows are numpy's float16 of its values; the same batches at 1
// and 2 threads.
TEST_F(TensorDTypeTest, MixturesPadInTheStreamsDtype) {
  testing::WriteFile(Fx("mix.yaml"),
                     "mixture:\n  name: dtypes\n  tag: dataset_id\n  pad: {f32.npy: 32}\n"
                     "  datasets:\n    - {name: wide, uri: wds, weight: 0.5}\n"
                     "    - {name: narrow, uri: narrow, weight: 0.5, missing: [f16.npy]}\n");
  testing::WriteFile(dir_->Join("mixcfg.yaml"),
                     "anchor: f32.npy\nstreams:\n  f32.npy: {dtype: float16}\n"
                     "  f16.npy: {dtype: stored}\npipeline: {global_batch_size: 4, seed: 2}\n");
  auto mixture = [&](const std::string& extra) {
    int code = 0;
    const std::string out =
        Capture(ShellCommand({kCli, "batches", Fx("mix.yaml"), "--config", dir_->Join("mixcfg.yaml"),
                              "--digest"}) + " " + extra + " 2>/dev/null",
                &code);
    EXPECT_EQ(code, 0) << out;
    return out;
  };
  const std::string one = mixture("--steps 3 --threads 1");
  EXPECT_EQ(testing::SplitLines(one).size(), 3u) << one;
  EXPECT_EQ(mixture("--steps 3 --threads 2"), one);

  const std::string dir = dir_->Join("mix_out");
  mixture("--steps 2 --out " + ShellQuote(dir));
  std::set<std::string> wide_rows;
  for (int e = 0; e < 6; ++e) wide_rows.insert(ReadFile(Fx("expected/" + std::to_string(e) + ".f32.half")));
  size_t narrow = 0, wide = 0;
  for (const std::string step : {"0-0", "0-1"}) {
    const std::string f32 = NpyData(dir + "/" + step + "/f32.npy.npy", "<f2");
    const std::string dim_pad = NpyData(dir + "/" + step + "/f32.npy_dim_is_pad.npy", "|b1");
    const std::string f16 = NpyData(dir + "/" + step + "/f16.npy.npy", "<f2");
    const std::string f16_pad = NpyData(dir + "/" + step + "/f16.npy_is_pad.npy", "|b1");
    const std::string tag = NpyData(dir + "/" + step + "/dataset_id.npy", "<i4");
    ASSERT_EQ(f32.size(), 4u * 64) << step;
    ASSERT_EQ(dim_pad.size(), 4u * 32);
    ASSERT_EQ(f16.size(), 4u * 64);
    ASSERT_EQ(f16_pad.size(), 4u);
    ASSERT_EQ(tag.size(), 4u * 4);
    for (size_t k = 0; k < 4; ++k) {
      const std::string row = f32.substr(64 * k, 64);
      if (tag[4 * k] == 1) {  // narrow: 16 values, then 16 zeros marked as padding
        ++narrow;
        EXPECT_EQ(row.substr(32), std::string(32, '\0'));
        EXPECT_EQ(dim_pad.substr(32 * k, 32), std::string(16, '\0') + std::string(16, '\1'));
        EXPECT_EQ(f16.substr(64 * k, 64), std::string(64, '\0'));
        EXPECT_EQ(f16_pad[k], '\1');
      } else {
        ++wide;
        EXPECT_TRUE(wide_rows.count(row)) << step << " sample " << k;
        EXPECT_EQ(dim_pad.substr(32 * k, 32), std::string(32, '\0'));
        EXPECT_EQ(f16_pad[k], '\0');
      }
    }
  }
  EXPECT_GT(narrow, 0u);
  EXPECT_GT(wide, 0u);
}

// A float16/bfloat16 config served: `conveyor fetch --digest` over gRPC messages and over the
// shared-memory region equals `conveyor batches --digest`, and the C++ client sees the dtypes.
TEST_F(TensorDTypeTest, ServedOverGrpcAndSharedMemoryWithTheOfflineBits) {
  const std::vector<std::string> offline = Offline(dir_->Join("half.yaml"), "--steps 3");
  ASSERT_EQ(offline.size(), 3u);
  ServerProcess server(kCli, {Root(), "--config", dir_->Join("half.yaml"), "--threads", "1"},
                       dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  for (const std::string shm : {"true", "false"}) {
    int code = 0;
    const std::string out = Capture(ShellCommand({kCli, "fetch", "--servers", server.address(),
                                                  "--steps", "3", "--shared-memory", shm,
                                                  "--digest"}),
                                    &code);
    EXPECT_EQ(code, 0) << out << server.log();
    EXPECT_EQ(testing::SplitLines(out), offline) << "shared memory " << shm;
  }
  for (const bool shm : {true, false}) {
    client::ClientOptions o;
    o.servers = {server.address()};
    o.job = shm ? "dtype-shm" : "dtype-grpc";
    o.shared_memory = shm;
    o.max_batches = 1;
    auto c = client::Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    auto b = (*c)->Next();
    ASSERT_TRUE(b.ok() && b->has_value()) << b.status();
    EXPECT_EQ((*c)->stats().transport, shm ? "shared_memory" : "grpc");
    std::set<std::string> seen;
    for (const client::TensorView& t : (*b)->tensors) {
      if (t.name == "f32.npy" || t.name == "f16.npy") {
        EXPECT_EQ(t.dtype, DType::kFloat16) << t.name;
        EXPECT_EQ(t.bytes, 2u * 4 * 8 * 2) << t.name;
      } else if (t.name == "f64.npy") {
        EXPECT_EQ(t.dtype, DType::kBFloat16);
        EXPECT_EQ(t.bytes, 2u * 1 * 32 * 2);
      } else {
        continue;
      }
      seen.insert(t.name);
      // Each sample's float16 member arrives as its own bytes.
      if (t.name == "f16.npy") {
        for (size_t k = 0; k < (*b)->ids.size(); ++k) {
          const std::string want =
              ReadFile(Fx("expected/" + std::to_string((*b)->ids[k].episode) + ".f16.bits"));
          EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data) + 64 * k, 64), want);
        }
      }
    }
    EXPECT_EQ(seen.size(), 3u);
  }
}

}  // namespace
}  // namespace conveyor
