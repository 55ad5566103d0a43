// A text stream's SentencePiece tokenizer (sample/tokenizer.h): models trained here by Debian's
// spm_train (unigram and BPE) on a small corpus written here; ids checked id for id against
// python3-sentencepiece on texts with CJK, emoji, accents, combining marks, full-width forms,
// empty and whitespace-only strings; truncation and the overlong error; the config's errors (a
// missing or corrupt model names its path); token tensors end to end through `conveyor batches`
// (packing counting tokens, the same bits at any thread count) and a real server, whose config
// and order digests change with the model's bytes, so a job pinned to one model is refused by a
// server with another.
#include "sample/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "client/client.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/dataset_writer.h"
#include "format/npy.h"
#include "sample/sample_spec.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace pb = format::v1;
using testing::RunCommand;
using testing::ServerProcess;
using testing::ShellQuote;
using testing::TempDir;
using testing::WriteFile;

const std::string kCli = CONVEYOR_CLI;

// The texts whose ids are compared: scripts and forms the normalizer and the byte fallback-free
// models treat differently (unknown characters become <unk>), and the edge cases.
std::vector<std::string> EvalTexts() {
  std::vector<std::string> t = {
      "",
      " ",
      "   ",
      "\t\n ",
      "the robot picks up the red cube",
      "  leading and trailing spaces  ",
      "multiple    spaces\tand\ttabs",
      "new\nline",
      "机器人把红色的方块放进碗里",
      "未见过的汉字龘靐齉",
      "ロボットが赤いキューブを拾う",
      "로봇이 빨간 큐브를 집어 든다",
      "🤖 picks 🍎 and 🍌 then waves 👋🏽",
      "👨‍👩‍👧‍👦 family emoji with zero-width joiners",
      "Le café est très chaud; la crème brûlée",
      "e\xcc\x81 combining acute, \xc3\xa9 precomposed",
      "ＦＵＬＬＷＩＤＴＨ ｶﾀｶﾅ ①②③",
      "\xef\xac\x81ne ligature and \xe2\x84\xab ngstr\xc3\xb6m",
      "zero\xe2\x80\x8bwidth space",
      "mixed 中文 and English 😀 ¿verdad? ÜBER",
      "SHOUTING ROBOT STACKS THE BLOCKS",
  };
  std::string longer;
  for (int i = 0; i < 40; ++i) longer += "the robot places the cube in the bowl 🤖 ";
  t.push_back(longer);
  return t;
}

// The training corpus: a few KB of lines in several scripts.
std::string Corpus() {
  const std::vector<std::string> base = {
      "the robot picks up the red cube and places it in the bowl",
      "a person walks a dog through the park on a sunny afternoon",
      "Le café est très chaud; la crème brûlée était délicieuse à Noël",
      "El niño comió piñata en la montaña, ¿verdad?",
      "机器人把红色的方块放进碗里",
      "一只狗在公园里奔跑",
      "ロボットが赤いキューブを拾う",
      "로봇이 빨간 큐브를 집어 든다",
      "🤖 picks 🍎 and 🍌 then waves 👋🏽",
      "Ünïcödé naïve façade coöperate résumé Ångström",
      "stack the blocks; open the drawer; wipe the table"};
  std::string out;
  for (int i = 0; i < 12; ++i) {
    for (const std::string& b : base) out += b + (i % 2 ? " " + std::to_string(i) : "") + "\n";
  }
  return out;
}

std::vector<std::vector<int32_t>> PythonIds(const std::string& dir, const std::string& model,
                                            const std::vector<std::string>& texts, bool bos,
                                            bool eos) {
  const std::string in = dir + "/texts.json", out = dir + "/ids.json";
  WriteFile(in, nlohmann::json(texts).dump());
  const auto r = RunCommand(
      "/usr/bin/python3 " +
      ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/tokenizer/spm_ids.py") + " " +
      ShellQuote(model) + " " + ShellQuote(in) + " " + ShellQuote(out) + (bos ? " --bos" : "") +
      (eos ? " --eos" : ""));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return nlohmann::json::parse(testing::ReadFile(out)).get<std::vector<std::vector<int32_t>>>();
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    WriteFile(dir_->Join("corpus.txt"), Corpus());
    // unigram and bpe as most models are; nobos: a model without a BOS piece.
    const struct {
      const char* name;
      const char* flags;
    } models[] = {{"unigram", "--model_type=unigram"},
                  {"bpe", "--model_type=bpe"},
                  {"nobos", "--model_type=unigram --bos_id=-1"}};
    for (const auto& m : models) {
      const auto r = RunCommand("spm_train --input=" + ShellQuote(dir_->Join("corpus.txt")) +
                                " --model_prefix=" + ShellQuote(dir_->Join(m.name)) +
                                " --vocab_size=400 --character_coverage=1.0 "
                                "--hard_vocab_limit=false --minloglevel=2 " +
                                m.flags);
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    // The dataset: one episode per caption, 3 steps of `action` at 10 Hz as the anchor.
    const std::vector<std::string> captions = Captions();
    auto w = DatasetWriter::Create(dir_->Join("ds"), {});
    ASSERT_TRUE(w.ok()) << w.status();
    for (size_t e = 0; e < captions.size(); ++e) {
      EpisodeData ep;
      ep.source = "episode " + std::to_string(e);
      EpisodeData::Stream action;
      action.info = {"action", pb::LOWDIM, "zstd-shuffle4", 10, {1}, {"a0"}, ""};
      for (int i = 0; i < 3; ++i) {
        action.timestamps_s.push_back(i / 10.0);
        action.values.push_back(static_cast<float>(e * 10 + i));
      }
      EpisodeData::Stream caption;
      caption.info = {"caption", pb::TEXT, "utf-8", 0, {}, {}, ""};
      caption.text = captions[e];
      ep.streams.push_back(std::move(action));
      ep.streams.push_back(std::move(caption));
      ASSERT_TRUE((*w)->AddEpisode(ep).ok());
    }
    auto m = (*w)->Finish();
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = new Manifest(*m);
  }
  static void TearDownTestSuite() {
    delete manifest_;
    delete dir_;
  }

  // The dataset's captions: the eval texts but the longest, so a packed sequence holds a sample.
  static std::vector<std::string> Captions() {
    std::vector<std::string> c = EvalTexts();
    c.pop_back();
    return c;
  }
  static std::string Model(const std::string& name) { return dir_->Join(name + ".model"); }

  static absl::StatusOr<std::shared_ptr<const TextTokenizer>> Load(const std::string& name,
                                                                   bool bos, bool eos,
                                                                   int64_t max_tokens = 0,
                                                                   Overlong overlong = Overlong::kError) {
    TokenizerOptions o;
    o.model = Model(name);
    o.add_bos = bos;
    o.add_eos = eos;
    o.max_tokens = max_tokens;
    o.overlong = overlong;
    return TextTokenizer::Load(o);
  }

  // A config file in the test's folder; the spec parsed from it.
  static absl::StatusOr<SampleSpec> Spec(const std::string& yaml, const std::string& file = "spec.yaml") {
    WriteFile(dir_->Join(file), yaml);
    return SampleSpec::FromFile(dir_->Join(file), *manifest_);
  }

  static TempDir* dir_;
  static Manifest* manifest_;
};

TempDir* TokenizerTest::dir_ = nullptr;
Manifest* TokenizerTest::manifest_ = nullptr;

TEST_F(TokenizerTest, IdsEqualPythonSentencePiece) {
  const std::vector<std::string> texts = EvalTexts();
  for (const std::string model : {"unigram", "bpe"}) {
    for (const bool specials : {false, true}) {
      auto tok = Load(model, specials, specials);
      ASSERT_TRUE(tok.ok()) << tok.status();
      const auto want = PythonIds(dir_->path(), Model(model), texts, specials, specials);
      ASSERT_EQ(want.size(), texts.size());
      size_t unk = 0;
      for (size_t i = 0; i < texts.size(); ++i) {
        auto ids = (*tok)->Encode(texts[i]);
        ASSERT_TRUE(ids.ok()) << ids.status();
        EXPECT_EQ(*ids, want[i]) << model << " text " << i << ": '" << texts[i] << "'";
        unk += std::count(ids->begin(), ids->end(), 0);
      }
      // The corpus exercises what matters: empty texts give no ids (or just BOS and EOS), and
      // characters the model never saw are <unk> (id 0), as Python gives them.
      EXPECT_EQ((*tok)->Encode("")->size(), specials ? 2u : 0u);
      EXPECT_GT(unk, 0u) << model;
    }
  }
}

TEST_F(TokenizerTest, OverlongTextsAreTruncatedOrRefused) {
  const std::vector<std::string> texts = EvalTexts();
  const auto full = PythonIds(dir_->path(), Model("unigram"), texts, true, true);
  ASSERT_EQ(full.size(), texts.size());
  constexpr int64_t kMax = 6;
  auto cut = Load("unigram", true, true, kMax, Overlong::kTruncate);
  auto strict = Load("unigram", true, true, kMax, Overlong::kError);
  ASSERT_TRUE(cut.ok() && strict.ok());
  size_t refused = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> want = full[i];
    if (static_cast<int64_t>(want.size()) > kMax) {
      // BOS, the first kMax - 2 ids of the text, EOS.
      want.erase(want.begin() + (kMax - 1), want.end() - 1);
    }
    auto ids = (*cut)->Encode(texts[i]);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want) << "text " << i;
    EXPECT_EQ(ids->back(), full[i].back());  // still ends in EOS
    auto exact = (*strict)->Encode(texts[i]);
    if (static_cast<int64_t>(full[i].size()) > kMax) {
      ++refused;
      ASSERT_FALSE(exact.ok());
      EXPECT_EQ(exact.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(exact.status().message().find(std::to_string(full[i].size()) + " tokens, over tokenizer.max_tokens 6"),
                std::string_view::npos) << exact.status();
    } else {
      ASSERT_TRUE(exact.ok()) << exact.status();
      EXPECT_EQ(*exact, full[i]);
    }
  }
  EXPECT_GT(refused, 3u);
}

TEST_F(TokenizerTest, MissingOrCorruptModelsNameTheirPath) {
  const std::string good = testing::ReadFile(Model("unigram"));
  WriteFile(dir_->Join("truncated.model"), good.substr(0, good.size() / 3));
  WriteFile(dir_->Join("empty.model"), "");
  WriteFile(dir_->Join("text.model"), "this is not a sentencepiece model, only some text\n");
  std::filesystem::create_directories(dir_->Join("folder.model"));
  const struct {
    std::string model;
    absl::StatusCode code;
    std::string says;
  } cases[] = {{"missing.model", absl::StatusCode::kNotFound, "cannot be read"},
               {"folder.model", absl::StatusCode::kNotFound, "cannot be read"},
               {"truncated.model", absl::StatusCode::kInvalidArgument, "is not a SentencePiece model"},
               {"empty.model", absl::StatusCode::kInvalidArgument, "is empty"},
               {"text.model", absl::StatusCode::kInvalidArgument, "is not a SentencePiece model"}};
  for (const auto& c : cases) {
    auto spec = Spec("anchor: action\nstreams:\n  caption:\n    tokenizer: {model: " + c.model + "}\n");
    ASSERT_FALSE(spec.ok()) << c.model;
    EXPECT_EQ(spec.status().code(), c.code) << spec.status();
    const std::string msg(spec.status().message());
    EXPECT_NE(msg.find(dir_->Join(c.model)), std::string::npos) << msg;  // the resolved path
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    EXPECT_NE(msg.find("spec.yaml:4:"), std::string::npos) << msg;      // the key's line
    EXPECT_NE(msg.find("stream 'caption'"), std::string::npos) << msg;
  }
}

TEST_F(TokenizerTest, ConfigKeysAreChecked) {
  // Relative to the config file's folder, wherever the process runs.
  std::filesystem::create_directories(dir_->Join("sub"));
  auto rel = Spec("streams:\n  caption:\n    tokenizer: {model: ../bpe.model, add_eos: true}\n",
                  "sub/rel.yaml");
  ASSERT_TRUE(rel.ok()) << rel.status();
  ASSERT_NE(rel->streams[0].tokenizer, nullptr);
  EXPECT_EQ(rel->streams[0].tokenizer->options().model, Model("bpe"));
  auto bpe = Load("bpe", false, false);
  ASSERT_TRUE(bpe.ok());
  EXPECT_EQ(rel->streams[0].tokenizer->sha256(), (*bpe)->sha256());

  // An inline config has no folder: a relative model is refused, an absolute one works.
  auto inline_rel = SampleSpec::FromYaml("streams:\n  caption:\n    tokenizer: {model: bpe.model}\n",
                                         *manifest_, "request config");
  ASSERT_FALSE(inline_rel.ok());
  EXPECT_NE(inline_rel.status().message().find("absolute path"), std::string_view::npos)
      << inline_rel.status();
  EXPECT_TRUE(SampleSpec::FromYaml("streams:\n  caption:\n    tokenizer: {model: " + Model("bpe") + "}\n",
                                   *manifest_, "request config")
                  .ok());

  const struct {
    std::string yaml;
    std::string says;
  } bad[] = {
      {"tokenizer: {model: unigram.model, add_bos: true, bos: 1}", "unknown key 'bos'"},
      {"tokenizer: {add_bos: true}", "needs model"},
      {"tokenizer: unigram.model", "must be a mapping"},
      {"tokenizer: {model: unigram.model, max_tokens: 0}", "max_tokens"},
      {"tokenizer: {model: unigram.model, add_bos: true, add_eos: true, max_tokens: 1}", "max_tokens"},
      {"tokenizer: {model: unigram.model, overlong: truncate}", "overlong needs max_tokens"},
      {"tokenizer: {model: unigram.model, max_tokens: 8, overlong: drop}", "error, truncate"},
      {"tokenizer: {model: nobos.model, add_bos: true}", "has no BOS piece"},
  };
  for (const auto& b : bad) {
    auto spec = Spec("streams:\n  caption:\n    " + b.yaml + "\n");
    ASSERT_FALSE(spec.ok()) << b.yaml;
    EXPECT_NE(spec.status().message().find(b.says), std::string_view::npos)
        << b.yaml << ": " << spec.status();
  }
  // A tokenizer on a stream that is not text is an unknown key.
  auto action = Spec("streams:\n  action: {tokenizer: {model: unigram.model}}\n");
  ASSERT_FALSE(action.ok());
  EXPECT_NE(action.status().message().find("unknown key 'tokenizer'"), std::string_view::npos)
      << action.status();
}

// The CLI's `conveyor batches` with a config naming the model, `--out` writing each batch's
// tensors as .npy.
struct CliBatch {
  std::string dir;
  std::vector<uint64_t> episodes;  // per row, in batch order
};

std::vector<CliBatch> RunBatches(const std::string& ds, const std::string& config, const std::string& out,
                                 int steps, int threads, std::string* lines) {
  const auto r = RunCommand(kCli + " batches " + ShellQuote(ds) + " --config " + ShellQuote(config) +
                            " --steps " + std::to_string(steps) + " --threads " + std::to_string(threads) +
                            " --digest --ids" + (out.empty() ? "" : " --out " + ShellQuote(out)) +
                            " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<CliBatch> got;
  *lines = r.output;
  for (const std::string& line : testing::SplitLines(r.output)) {
    // "E:S consumer ... [e/s e/s ...]"
    CliBatch b;
    const std::string cursor = line.substr(0, line.find(' '));
    b.dir = out + "/" + cursor.substr(0, cursor.find(':')) + "-" + cursor.substr(cursor.find(':') + 1);
    std::istringstream ids(line.substr(line.find('[') + 1, line.find(']') - line.find('[') - 1));
    std::string id;
    while (ids >> id) b.episodes.push_back(std::stoull(id.substr(0, id.find('/'))));
    got.push_back(std::move(b));
  }
  return got;
}

std::vector<int64_t> Ints(const NpyArray& a) {
  std::vector<int64_t> out;
  for (float v : a.values) out.push_back(std::llround(v));
  return out;
}

TEST_F(TokenizerTest, BatchesCarryTokenIdsAndPackingCountsTokens) {
  const std::vector<std::string> captions = Captions();
  const auto want = PythonIds(dir_->path(), Model("unigram"), captions, true, true);
  ASSERT_EQ(want.size(), captions.size());
  WriteFile(dir_->Join("packed.yaml"),
            "anchor: action\n"
            "streams:\n"
            "  action: {}\n"
            "  caption:\n"
            "    tokenizer: {model: unigram.model, add_bos: true, add_eos: true}\n"
            "packing:\n"
            "  max_tokens: 128\n"
            "  tokens: {action: {per_step: 1}, caption: {per_token: 1}}\n"
            "pipeline: {global_batch_size: 9, seed: 3}\n");
  std::string lines;
  const std::vector<CliBatch> batches =
      RunBatches(dir_->Join("ds"), dir_->Join("packed.yaml"), dir_->Join("out"), 7, 2, &lines);
  ASSERT_EQ(batches.size(), 7u) << lines;  // one epoch: 21 episodes x 3 steps
  size_t rows = 0, unk = 0;
  std::set<uint64_t> seen;
  for (const CliBatch& b : batches) {
    auto ids = ReadNpy(b.dir + "/caption.npy");
    auto mask = ReadNpy(b.dir + "/caption_mask.npy");
    auto lengths = ReadNpy(b.dir + "/stream_lengths.npy");
    auto offsets = ReadNpy(b.dir + "/stream_offsets.npy");
    ASSERT_TRUE(ids.ok() && mask.ok() && lengths.ok() && offsets.ok()) << b.dir;
    EXPECT_EQ(ids->source_dtype, "<i4");
    ASSERT_EQ(ids->shape.size(), 2u);
    ASSERT_EQ(ids->shape[0], static_cast<int64_t>(b.episodes.size()));
    const int64_t width = ids->shape[1];
    const std::vector<int64_t> v = Ints(*ids), m = Ints(*mask), len = Ints(*lengths), off = Ints(*offsets);
    ASSERT_EQ(lengths->shape, (std::vector<int64_t>{static_cast<int64_t>(b.episodes.size()), 2}));
    int64_t longest = 0;
    for (size_t row = 0; row < b.episodes.size(); ++row, ++rows) {
      const std::vector<int32_t>& w = want[b.episodes[row]];
      seen.insert(b.episodes[row]);
      longest = std::max<int64_t>(longest, static_cast<int64_t>(w.size()));
      std::vector<int32_t> got;
      for (int64_t k = 0; k < width; ++k) {
        const int64_t x = v[row * width + k];
        if (m[row * width + k]) {
          got.push_back(static_cast<int32_t>(x));
        } else {
          EXPECT_EQ(x, 0) << "padding is zeros";
        }
      }
      EXPECT_EQ(got, w) << "episode " << b.episodes[row] << ": '" << captions[b.episodes[row]] << "'";
      unk += std::count(got.begin(), got.end(), 0);
      // Packing counts the caption's tokens (the ids, BOS and EOS included) and one per action
      // step; the caption's range follows the action's.
      EXPECT_EQ(len[row * 2 + 0], 1);
      EXPECT_EQ(len[row * 2 + 1], static_cast<int64_t>(w.size()));
      EXPECT_EQ(off[row * 2 + 1], off[row * 2 + 0] + 1);
    }
    EXPECT_EQ(width, longest) << "padded to the batch's longest";
  }
  EXPECT_EQ(rows, 63u);
  EXPECT_EQ(seen.size(), captions.size());  // every caption, the empty and blank ones included
  EXPECT_GT(unk, 0u);

  // The same bits at another thread count (tokenizing runs in the workers).
  std::string one;
  RunBatches(dir_->Join("ds"), dir_->Join("packed.yaml"), "", 7, 1, &one);
  std::string four;
  RunBatches(dir_->Join("ds"), dir_->Join("packed.yaml"), "", 7, 4, &four);
  EXPECT_EQ(testing::SplitLines(one), testing::SplitLines(lines));
  EXPECT_EQ(testing::SplitLines(four), testing::SplitLines(lines));
}

TEST_F(TokenizerTest, PackingCostKeyFollowsTheTokenizer) {
  auto bytes = Spec("streams:\n  action: {}\n  caption:\n    tokenizer: {model: unigram.model}\n"
                    "packing: {max_tokens: 64, tokens: {caption: {per_byte: 1}}}\n",
                    "per_byte.yaml");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto r = RunCommand(kCli + " batches " + ShellQuote(dir_->Join("ds")) + " --config " +
                      ShellQuote(dir_->Join("per_byte.yaml")) + " --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("has a tokenizer, so its tensor is token ids and its cost is per_token"),
            std::string::npos) << r.output;
  ASSERT_TRUE(Spec("streams:\n  action: {}\n  caption: {}\n"
                   "packing: {max_tokens: 64, tokens: {caption: {per_token: 1}}}\n", "per_token.yaml")
                  .ok());
  r = RunCommand(kCli + " batches " + ShellQuote(dir_->Join("ds")) + " --config " +
                 ShellQuote(dir_->Join("per_token.yaml")) + " --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("per_token needs a tokenizer on stream 'caption'"), std::string::npos)
      << r.output;
}

// A real server: its batches carry the same ids as the offline pipeline, and its digests follow
// the model's bytes, so a job that pinned its order digest under one model is refused by a server
// whose model file changed in place.
TEST_F(TokenizerTest, ServerDigestsFollowTheModel) {
  const std::string model = dir_->Join("job.model");
  std::filesystem::copy_file(Model("unigram"), model, std::filesystem::copy_options::overwrite_existing);
  const std::string config = dir_->Join("job.yaml");
  WriteFile(config,
            "anchor: action\n"
            "streams:\n"
            "  action: {}\n"
            "  caption: {tokenizer: {model: job.model, add_eos: true}}\n"
            "pipeline: {global_batch_size: 4, seed: 5}\n");
  auto fetch = [&](const std::string& address, const std::string& pin, std::string* order,
                   std::string* digest) -> absl::StatusOr<std::vector<int32_t>> {
    client::ClientOptions o;
    o.servers = {address};
    o.job = "tokenizer";
    o.max_batches = 1;
    o.reconnect_timeout_s = 10;
    o.pin_from_environment = false;
    o.expect_order_digest = pin;
    auto c = client::Client::Create(o);
    if (!c.ok()) return c.status();
    auto next = (*c)->Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return absl::InternalError("no batch");
    const client::Batch& b = **next;
    const client::TensorView* t = b.Find("caption");
    if (t == nullptr || t->dtype != DType::kInt32) return absl::InternalError("no int32 caption");
    std::vector<int32_t> ids(t->bytes / 4);
    std::memcpy(ids.data(), t->data, t->bytes);
    *order = (*c)->stats().order_digest;
    *digest = (*c)->stats().config_digest;
    return ids;
  };
  std::string order_a, digest_a;
  std::vector<int32_t> served;
  {
    ServerProcess a(kCli, {dir_->Join("ds"), "--config", config, "--threads", "1"}, dir_->path());
    ASSERT_TRUE(a.ok()) << a.log();
    auto ids = fetch(a.address(), "", &order_a, &digest_a);
    ASSERT_TRUE(ids.ok()) << ids.status() << a.log();
    served = *ids;
  }
  // The offline pipeline's first batch, tensor for tensor.
  std::string lines;
  const std::vector<CliBatch> offline = RunBatches(dir_->Join("ds"), config, dir_->Join("job_out"), 1, 1, &lines);
  ASSERT_EQ(offline.size(), 1u) << lines;
  auto npy = ReadNpy(offline[0].dir + "/caption.npy");
  ASSERT_TRUE(npy.ok()) << npy.status();
  const std::vector<int64_t> want = Ints(*npy);
  ASSERT_EQ(served.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(served[i], want[i]) << i;

  // The same config text, the model file replaced by another model.
  std::filesystem::copy_file(Model("bpe"), model, std::filesystem::copy_options::overwrite_existing);
  ServerProcess b(kCli, {dir_->Join("ds"), "--config", config, "--threads", "1"}, dir_->path());
  ASSERT_TRUE(b.ok()) << b.log();
  std::string order_b, digest_b;
  auto fresh = fetch(b.address(), "", &order_b, &digest_b);
  ASSERT_TRUE(fresh.ok()) << fresh.status() << b.log();
  EXPECT_NE(order_b, order_a);
  EXPECT_NE(digest_b, digest_a);
  EXPECT_NE(*fresh, served);
  std::string unused_order, unused_digest;
  auto pinned = fetch(b.address(), order_a, &unused_order, &unused_digest);
  ASSERT_FALSE(pinned.ok()) << "a job pinned to the first model continued on the second";
  EXPECT_EQ(pinned.status().code(), absl::StatusCode::kFailedPrecondition) << pinned.status();
}

}  // namespace
}  // namespace conveyor
