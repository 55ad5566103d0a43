// RLDS / TFDS datasets read in place (datasets/rlds/, docs/rlds.md), on datasets written at test
// time as the RLDS tools write them (tests/fixtures/rlds/make_rlds.py: tf.train.Example through
// python3-protobuf, TFRecord framing with python3-crc32c, JPEGs by cjpeg, PNGs by zlib): values
// against that independent reader, images against libjpeg-turbo's djpeg, the damaged copies'
// errors, batches at any thread count, over HTTP and resumed, and each record read about once an
// epoch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "datasets/rlds/tfrecord.h"
#include "media/image_decoder.h"
#include "tests/support/nginx_server.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using conveyor::testing::ReadFile;
using conveyor::testing::RunCommand;
using conveyor::testing::ShellQuote;
using conveyor::testing::TempDir;
using conveyor::testing::WriteFile;
using json = nlohmann::json;

class RldsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // Record indexes go here, not to the user's cache (the CLI runs below inherit it).
    setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index").c_str(), 1);
    const auto r = RunCommand("/usr/bin/python3 " + ShellQuote(std::string(CONVEYOR_SOURCE_DIR) +
                                                               "/tests/fixtures/rlds/make_rlds.py") +
                              " " + ShellQuote(dir_->Join("rlds")) + " 2>&1");
    if (r.exit_code != 0) error_ = r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << "make_rlds.py failed:\n" << error_; }

  static std::string Root(const std::string& copy) { return dir_->Join("rlds/" + copy); }
  static std::string Expected(const std::string& file) { return ReadFile(dir_->Join("rlds/expected/" + file)); }

  static std::unique_ptr<Dataset> Open(const std::string& location) {
    auto ds = Dataset::Open(location);
    EXPECT_TRUE(ds.ok()) << ds.status();
    return ds.ok() ? *std::move(ds) : nullptr;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string error_;
};

bool Mentions(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST(Crc32cTest, KnownVectorsAndPythonsCrc32c) {
  EXPECT_EQ(rlds::Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(rlds::Crc32c("", 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(rlds::Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  // Odd lengths and offsets against python3-crc32c.
  std::mt19937 rng(7);
  std::string bytes(1000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  TempDir dir;
  WriteFile(dir.Join("b"), bytes);
  for (size_t off : {0u, 1u, 3u}) {
    for (size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 997u}) {
      const auto r = RunCommand("/usr/bin/python3 -c \"import crc32c,sys; d=open(sys.argv[1],'rb').read(); "
                                "print(crc32c.crc32c(d[" + std::to_string(off) + ":" + std::to_string(off + n) +
                                "]))\" " + ShellQuote(dir.Join("b")));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(rlds::Crc32c(bytes.data() + off, n), std::stoul(r.output)) << off << "+" << n;
    }
  }
}

TEST_F(RldsTest, FeaturesMapToStreams) {
  auto ds = Open(Root("clean"));
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->format(), "rlds");
  ASSERT_EQ(ds->num_episodes(), 5u);
  const Manifest& m = ds->manifest();
  std::vector<std::string> names;
  for (const StreamInfo& s : m.streams) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"observation.image", "observation.wrist_image", "action",
                                              "is_first", "is_last", "is_terminal", "observation.state",
                                              "reward", "episode_metadata.file_path", "instruction"}));
  EXPECT_EQ(m.streams[0].kind, pb::IMAGE);
  EXPECT_EQ(m.streams[0].codec, "mjpeg");
  EXPECT_EQ(m.streams[0].shape, (std::vector<int64_t>{48, 64, 3}));
  EXPECT_EQ(m.streams[1].codec, "png");
  EXPECT_EQ(m.streams[2].shape, (std::vector<int64_t>{6}));  // [2, 3] flattened
  EXPECT_EQ(m.streams[6].shape, (std::vector<int64_t>{7}));
  EXPECT_EQ(m.streams[7].shape, (std::vector<int64_t>{1}));  // a scalar per step
  const json text = json::parse(Expected("text.json"));
  for (size_t e = 0; e < 5; ++e) {
    EXPECT_EQ(ds->episodes().length(e, 0), text[std::to_string(e)]["steps"].get<uint32_t>()) << e;
  }
  EXPECT_EQ(m.shards.size(), 2u);
  EXPECT_EQ(m.shards[1].episodes, 2u);
}

// Every lowdim value bit for bit what python3-protobuf reads for the same (episode, step), every
// image the record's bytes, every text the first step's.
TEST_F(RldsTest, ValuesEqualAnIndependentReader) {
  auto ds = Open(Root("clean"));
  ASSERT_NE(ds, nullptr);
  const json text = json::parse(Expected("text.json"));
  std::vector<float> values;
  std::string bytes;
  for (size_t e = 0; e < ds->num_episodes(); ++e) {
    auto index = ds->LoadEpisode(e);
    ASSERT_TRUE(index.ok()) << index.status();
    for (int s = 0; s < (*index)->streams_size(); ++s) {
      const pb::StreamIndex& si = (*index)->streams(s);
      const std::string tag = "ep" + std::to_string(e) + "." + si.name();
      if (si.kind() == pb::LOWDIM) {
        if (si.name() == "is_terminal") continue;  // same writer as is_last
        ASSERT_TRUE(ds->ReadLowdim(**index, s, 0, si.num_frames(), &values).ok());
        const std::string want = Expected(tag + ".f32");
        ASSERT_EQ(values.size() * 4, want.size()) << tag;
        EXPECT_EQ(std::memcmp(values.data(), want.data(), want.size()), 0) << tag;
        // A window in the middle too.
        ASSERT_TRUE(ds->ReadLowdim(**index, s, 2, 3, &values).ok());
        const size_t dim = values.size() / 3;
        EXPECT_EQ(std::memcmp(values.data(), want.data() + 2 * dim * 4, 3 * dim * 4), 0) << tag;
      } else if (si.kind() == pb::IMAGE) {
        for (size_t k = 0; k < si.num_frames(); ++k) {
          ASSERT_TRUE(ds->ReadPacket(**index, s, k, &bytes).ok());
          EXPECT_TRUE(bytes == Expected(tag + ".img" + std::to_string(k))) << tag << " step " << k;
        }
      } else if (si.kind() == pb::TEXT) {
        EXPECT_EQ(si.text(), text[std::to_string(e)][si.name()].get<std::string>()) << tag;
      }
    }
  }
}

// A served image is libjpeg-turbo's decode of the record's JPEG: djpeg's PPM of the same bytes.
TEST_F(RldsTest, ImagesDecodeAsDjpegDecodesThem) {
  auto ds = Open(Root("clean"));
  ASSERT_NE(ds, nullptr);
  auto index = ds->LoadEpisode(3);
  ASSERT_TRUE(index.ok()) << index.status();
  ImageDecoder decoder;
  TempDir tmp;
  for (size_t k : {0u, 4u, 8u}) {
    std::string bytes;
    ASSERT_TRUE(ds->ReadPacket(**index, 0, k, &bytes).ok());
    RgbImage img;
    ASSERT_TRUE(decoder.Decode("mjpeg", bytes, 0, 0, DecodeLimits{}, &img).ok());
    WriteFile(tmp.Join("f.jpg"), bytes);
    const auto r = RunCommand("djpeg -ppm " + ShellQuote(tmp.Join("f.jpg")) + " > " + ShellQuote(tmp.Join("f.ppm")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string ppm = ReadFile(tmp.Join("f.ppm"));
    const std::string pixels = ppm.substr(ppm.size() - static_cast<size_t>(img.width * img.height * 3));
    ASSERT_EQ(img.width, 64);
    ASSERT_EQ(img.height, 48);
    EXPECT_EQ(std::memcmp(img.pixels.data(), pixels.data(), pixels.size()), 0) << "step " << k;
  }
}

// A record that cannot be read (its data CRC, a missing or misshapen feature, steps that
// disagree) is a broken episode: the dataset opens, reading that episode is the error naming the
// file, the record and the feature, and `conveyor check` lists it and writes a quarantine that
// leaves it out of the order. Damage that loses the framing (a truncated shard) or a missing shard
// fails the open.
TEST_F(RldsTest, DamagedRecordsAreBrokenEpisodesNamedByFileRecordAndKey) {
  struct Case {
    const char* copy;
    size_t episode;
    std::vector<std::string> mentions;
  };
  const Case cases[] = {
      {"bad_crc", 4, {"toy_rlds-train.tfrecord-00001-of-00002", "record 1", "CRC32C"}},
      {"missing_feature", 2, {"tfrecord-00000-of-00002", "record 2", "'steps/action'", "missing"}},
      {"misshapen", 1, {"tfrecord-00000-of-00002", "record 1", "'steps/observation/state'", "whole number of steps of 7"}},
      {"lengths_disagree", 3, {"tfrecord-00001-of-00002", "record 0", "disagree", "steps/observation/wrist_image"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.copy);
    auto ds = Open(Root(c.copy));
    ASSERT_NE(ds, nullptr);
    ASSERT_EQ(ds->num_episodes(), 5u);
    for (size_t e = 0; e < 5; ++e) {
      auto index = ds->LoadEpisode(e);
      EXPECT_EQ(index.ok(), e != c.episode) << e << ": " << index.status();
      if (e != c.episode) continue;
      for (const std::string& m : c.mentions) {
        EXPECT_TRUE(Mentions(index.status(), m)) << "'" << m << "' not in: " << index.status();
      }
    }
    const std::string quarantine = dir_->Join(std::string(c.copy) + ".quarantine.json");
    const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " check " + ShellQuote(Root(c.copy)) +
                              " --write-quarantine " + ShellQuote(quarantine) + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.mentions[0]), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("1 error in 1 episode"), std::string::npos) << r.output;
    // Served with the quarantine: every batch of an epoch comes without the broken episode.
    const std::string config = dir_->Join(std::string(c.copy) + ".yaml");
    WriteFile(config, "anchor: action\nstreams: {observation.image: {}, action: {}}\nquarantine: " + quarantine +
                          "\npipeline: {global_batch_size: 4, seed: 1, schedule: {mode: gop}}\n");
    const auto b = RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(Root(c.copy)) + " --config " +
                              ShellQuote(config) + " --steps 8 --ids 2>&1");
    EXPECT_EQ(b.exit_code, 0) << b.output;
    // Ids are "episode/step": episode 1 of another case shows the check can see one.
    const std::string e = std::to_string(c.episode) + "/";
    EXPECT_EQ(b.output.find(" " + e), std::string::npos) << b.output;
    EXPECT_EQ(b.output.find("[" + e), std::string::npos) << b.output;
    EXPECT_NE(b.output.find(c.episode == 0 ? "1/" : "0/"), std::string::npos) << b.output;
  }
  struct Fatal {
    const char* copy;
    std::vector<std::string> mentions;
  };
  const Fatal fatal[] = {
      {"truncated", {"toy_rlds-train.tfrecord-00001-of-00002", "record 1", "truncated"}},
      {"missing_shard", {"toy_rlds-train.tfrecord-00001-of-00002", "is missing", "shard 1 of 2"}},
  };
  for (const Fatal& c : fatal) {
    auto ds = Dataset::Open(Root(c.copy));
    ASSERT_FALSE(ds.ok()) << c.copy;
    for (const std::string& m : c.mentions) {
      EXPECT_TRUE(Mentions(ds.status(), m)) << c.copy << ": '" << m << "' not in: " << ds.status();
    }
  }
}

TEST_F(RldsTest, LocationOptions) {
  auto ds = Open(Root("clean") + "#rate=10");
  ASSERT_NE(ds, nullptr);
  auto index = ds->LoadEpisode(1);
  ASSERT_TRUE(index.ok());
  EXPECT_DOUBLE_EQ((*index)->streams(2).timestamps_s(3), 0.3);
  EXPECT_DOUBLE_EQ(ds->manifest().streams[2].rate, 10);
  // The rate is part of the dataset's identity: another rate is another order.
  auto plain = Open(Root("clean"));
  ASSERT_NE(plain, nullptr);
  EXPECT_NE(plain->manifest().fingerprint, ds->manifest().fingerprint);
  for (const char* bad : {"#rate=0", "#rate=fast", "#frame_rate=10", "#rate", "#split=test"}) {
    auto r = Dataset::Open(Root("clean") + bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_TRUE(Mentions(Dataset::Open(Root("clean") + "#frame_rate=10").status(), "frame_rate"));
  EXPECT_TRUE(Mentions(Dataset::Open(Root("clean") + "#split=test").status(), "splits: train"));
}

// The second open finds every shard's record index in the cache and reads no record.
TEST_F(RldsTest, TheRecordIndexIsBuiltOnce) {
  TempDir cache;
  setenv("CONVEYOR_INDEX_CACHE_DIR", cache.path().c_str(), 1);
  auto first = Open(Root("clean"));
  ASSERT_NE(first, nullptr);
  const uint64_t shards = first->manifest().shards[0].bytes + first->manifest().shards[1].bytes;
  EXPECT_GE(first->storage().stats().bytes_read, shards);
  auto second = Open(Root("clean"));
  ASSERT_NE(second, nullptr);
  // dataset_info.json, features.json and episode 0's record (the image streams' probe).
  EXPECT_LT(second->storage().stats().bytes_read, shards / 2);
  EXPECT_EQ(second->manifest().fingerprint, first->manifest().fingerprint);
  setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index").c_str(), 1);
}

constexpr char kConfig[] = R"(anchor: action
streams:
  observation.image: {delta_timestamps: [-1, 0], size: [32, 48]}
  observation.wrist_image: {delta_timestamps: [0]}
  observation.state: {delta_timestamps: [0], normalize: mean_std}
  action: {delta_timestamps: {start: 0, step: 1, count: 4}}
  instruction: {}
pipeline:
  global_batch_size: 4
  seed: 5
  schedule: {mode: gop}
)";

// The batches' lines (stdout); the log (the record index's progress) goes elsewhere.
std::string Batches(const std::string& location, const std::string& config, const std::string& extra) {
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(location) + " --config " +
                                ShellQuote(config) + " --digest " + extra + " 2>/dev/null",
                            120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// Two epochs of shuffled batches: the same bits at 1 and 2 threads, over HTTP from nginx, and
// resumed from a cursor in the middle.
TEST_F(RldsTest, BatchesAtAnyThreadCountOverHttpAndResumed) {
  const std::string config = dir_->Join("batches.yaml");
  WriteFile(config, kConfig);
  const std::string one = Batches(Root("clean"), config, "--steps 24 --threads 1");
  const std::vector<std::string> lines = conveyor::testing::SplitLines(one);
  ASSERT_EQ(lines.size(), 24u) << one;
  EXPECT_EQ(Batches(Root("clean"), config, "--steps 24 --threads 2"), one);
  auto nginx = conveyor::testing::NginxServer::Start(dir_->Join("rlds"));
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  EXPECT_EQ(Batches((*nginx)->base_url() + "clean/", config, "--steps 24 --threads 2"), one)
      << (*nginx)->ErrorLog();
  const std::string cursor = lines[9].substr(0, lines[9].find(' '));
  std::string want;
  for (size_t i = 9; i < 24; ++i) want += lines[i] + "\n";
  EXPECT_EQ(Batches(Root("clean"), config, "--threads 2 --steps 15 --cursor " + cursor), want);
}

// The decode-once order makes every episode one block and keeps two windows of episodes parsed:
// a shuffled epoch reads each record once, even where the episode cache the location asks for
// (cache_mb) would not hold one record. The naive order with that cache re-reads a record for
// most samples.
double Amplification(const std::string& location, const std::string& config) {
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(location) + " --config " +
                                ShellQuote(config) + " --steps 12 --threads 2 --stats 2>&1",
                            120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("read amplification ");
  EXPECT_NE(at, std::string::npos) << r.output;
  return at == std::string::npos ? 0 : std::stod(r.output.substr(at + 19));
}

TEST_F(RldsTest, AShuffledEpochReadsEachRecordOnce) {
  const std::string location = Root("clean") + "#cache_mb=0.01";
  const std::string config = dir_->Join("epoch.yaml");
  WriteFile(config, kConfig);
  const double amp = Amplification(location, config);
  EXPECT_GE(amp, 1.0);
  EXPECT_LE(amp, 1.1);
  std::string naive = kConfig;
  naive.replace(naive.find("{mode: gop}"), 11, "{mode: naive}");
  WriteFile(config, naive);
  EXPECT_GT(Amplification(location, config), 2.0);
}

// `conveyor import --from` copies the episodes into a Conveyor dataset: images byte for byte,
// lowdim bit for bit, timestamps at the given rate.
TEST_F(RldsTest, ImportCopiesEveryEpisode) {
  const std::string out = dir_->Join("imported");
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " import --quiet --from " +
                            ShellQuote(Root("clean") + "#rate=5") + " --out " + ShellQuote(out) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ds = Open(out);
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->format(), "conveyor");
  ASSERT_EQ(ds->num_episodes(), 5u);
  const int state = ds->manifest().StreamIndex("observation.state");
  const int image = ds->manifest().StreamIndex("observation.image");
  ASSERT_GE(state, 0);
  ASSERT_GE(image, 0);
  auto index = ds->LoadEpisode(4);
  ASSERT_TRUE(index.ok()) << index.status();
  std::vector<float> values;
  ASSERT_TRUE(ds->ReadLowdim(**index, state, 0, 15, &values).ok());
  const std::string want = Expected("ep4.observation.state.f32");
  ASSERT_EQ(values.size() * 4, want.size());
  EXPECT_EQ(std::memcmp(values.data(), want.data(), want.size()), 0);
  EXPECT_DOUBLE_EQ((*index)->streams(state).timestamps_s(5), 1.0);
  std::string bytes;
  ASSERT_TRUE(ds->ReadPacket(**index, image, 7, &bytes).ok());
  EXPECT_TRUE(bytes == Expected("ep4.observation.image.img7"));
}

// An RLDS dataset in place as a mixture member beside a native dataset (its import): every batch
// half from each, and a resume from a mid-run cursor gives the
// same lines.
TEST_F(RldsTest, AsAMixtureMemberBesideANativeDataset) {
  const std::string cli = ShellQuote(CONVEYOR_CLI);
  const std::string native = dir_->Join("mix_native");
  auto made = RunCommand(cli + " import --quiet --from " + ShellQuote(Root("clean")) + " --out " + ShellQuote(native) + " 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string mix = dir_->Join("mix.yaml");
  const std::string config = dir_->Join("mix_config.yaml");
  WriteFile(config, "anchor: action\nstreams:\n  observation.image: {size: [48, 64]}\n  action: {}\n"
                    "pipeline: {global_batch_size: 8, seed: 1, schedule: {mode: gop}}\n");
  WriteFile(mix, "mixture:\n  name: rlds_and_native\n  datasets:\n"
                 "    - {name: rlds, uri: " + Root("clean") + ", weight: 0.5}\n"
                 "    - {name: native, uri: " + native + ", weight: 0.5}\n");
  auto batches = [&](const std::string& cursor, int steps) {
    return RunCommand(cli + " batches " + ShellQuote(mix) + " --config " + ShellQuote(config) +
                          " --digest --ids --threads 2 --cursor " + cursor + " --steps " + std::to_string(steps) +
                          " 2>/dev/null",
                      120);
  };
  const auto all = batches("0:0", 10);
  ASSERT_EQ(all.exit_code, 0) << all.output;
  const std::vector<std::string> lines = conveyor::testing::SplitLines(all.output);
  ASSERT_EQ(lines.size(), 10u) << all.output;
  for (const std::string& line : lines) {
    const size_t open = line.find('[');
    ASSERT_NE(open, std::string::npos) << line;
    std::istringstream ids(line.substr(open + 1, line.find(']') - open - 1));
    int from_native = 0, n = 0;
    for (std::string id; ids >> id; ++n) from_native += id.rfind("1:", 0) == 0 ? 1 : 0;
    EXPECT_EQ(n, 8) << line;
    EXPECT_EQ(from_native, 4) << "not half from each dataset: " << line;
  }
  const std::string cursor = lines[4].substr(0, lines[4].find(' '));
  const auto rest = batches(cursor, 6);
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  std::string want;
  for (size_t i = 4; i < 10; ++i) want += lines[i] + "\n";
  EXPECT_EQ(rest.output, want) << "resumed at " << cursor;
}

// A newcomer's mistakes (issue 44): a wrong path names what every format looked for, and a config
// without a schedule is told that it gets the naive order and what that costs.
TEST_F(RldsTest, AWrongPathNamesEveryFormatAndTheNaiveDefaultIsCalledOut) {
  auto none = Dataset::Open(dir_->Join("no_such_dataset"));
  ASSERT_FALSE(none.ok());
  for (const char* m : {"meta/info.json", "dataset_info.json and features.json", "*.hdf5", "manifest.json"}) {
    EXPECT_TRUE(Mentions(none.status(), m)) << "'" << m << "' not in: " << none.status();
  }
  const std::string config = dir_->Join("no_schedule.yaml");
  WriteFile(config, "anchor: action\nstreams: {observation.image: {}, action: {}}\npipeline: {global_batch_size: 4}\n");
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(Root("clean")) + " --config " +
                            ShellQuote(config) + " --steps 1 2>&1 >/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("naive order"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("schedule: {mode: gop}"), std::string::npos) << r.output;
  WriteFile(config, std::string(kConfig));  // names its schedule: no warning
  const auto quiet = RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(Root("clean")) + " --config " +
                                ShellQuote(config) + " --steps 1 2>&1 >/dev/null");
  EXPECT_EQ(quiet.output.find("naive order"), std::string::npos) << quiet.output;
}

// `batches --stats` measures the order it printed (issue 44 item 6): with three of five episodes
// quarantined, a batch cannot span more than the two left.
TEST_F(RldsTest, StatsMeasureTheOrderWithoutTheQuarantinedEpisodes) {
  const std::string quarantine = dir_->Join("three.quarantine.json");
  const std::string cli = ShellQuote(CONVEYOR_CLI);
  auto r = RunCommand(cli + " check " + ShellQuote(Root("bad_crc")) + " --write-quarantine " + ShellQuote(quarantine) + " 2>&1");
  ASSERT_EQ(r.exit_code, 2) << r.output;
  json q = json::parse(ReadFile(quarantine));
  q["datasets"][0]["episodes"] = json::array();
  for (int e : {0, 1, 4}) q["datasets"][0]["episodes"].push_back({{"episode", e}, {"reason", "test"}});
  WriteFile(quarantine, q.dump());
  const std::string config = dir_->Join("three.yaml");
  WriteFile(config, "anchor: action\nstreams: {observation.image: {}, action: {}}\nquarantine: " + quarantine +
                        "\npipeline: {global_batch_size: 4, seed: 1, schedule: {mode: gop}}\n");
  r = RunCommand(cli + " batches " + ShellQuote(Root("bad_crc")) + " --config " + ShellQuote(config) +
                 " --steps 3 --stats 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("episodes per batch ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_LE(std::stod(r.output.substr(at + 19)), 2.0) << r.output;
}

}  // namespace
}  // namespace conveyor
