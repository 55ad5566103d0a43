// LeRobot v3.0 and v2.1 datasets read in place (Dataset::Open on the LeRobot root) and through
// `conveyor import --lerobot` (RunImport / RunImportLeRobot), on datasets made at test time by tests/fixtures/lerobot/make_lerobot.sh with independent tools: the ffmpeg
// CLI (libx264 with B-frames, libsvtav1 GOP 2, episodes concatenated by its concat demuxer) and
// parquet-wasm for the tables. Frames are checked against ffmpeg's own decode of the original
// files, lowdim values bit for bit against what the writer was given, and broken copies of the
// datasets must give errors that name the file and the episode.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "datasets/lerobot/lerobot_dataset.h"
#include "tests/support/lerobot_fixtures.h"
#include "tests/support/media_checks.h"
#include "tests/support/nginx_server.h"
#include "tests/support/test_env.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using conveyor::testing::FrameMd5s;
using conveyor::testing::ReadFile;
using conveyor::testing::RunCommand;
using conveyor::testing::ShellQuote;
using conveyor::testing::TempDir;
using conveyor::testing::WriteFile;
using json = nlohmann::json;

const std::string kFixtures = std::string(CONVEYOR_LEROBOT_FIXTURE_DIR);

ImportOptions LeRobotImport(const std::string& root, const std::string& out) {
  ImportOptions o;
  o.lerobot = root;
  o.out = out;
  o.progress = false;
  return o;
}

bool Mentions(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// The fixtures (made once per build tree) and both datasets imported once per test process.
class LeRobotImportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const conveyor::testing::LeRobotFixtures made =
        conveyor::testing::MakeLeRobotFixtures(CONVEYOR_PARQUET_NPM_DIR, kFixtures);
    skip_ = made.skip;
    error_ = made.error;
    if (!skip_.empty() || !error_.empty()) return;
    expected_ = new json(json::parse(ReadFile(kFixtures + "/expected.json")));
    dir_ = new TempDir();
    // Packet indexes of the mp4s read in place go here, not to the user's cache (the CLI runs
    // below inherit it).
    setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index-cache").c_str(), 1);
    for (const char* v : {"v30", "v21"}) {
      absl::Status s = RunImport(LeRobotImport(kFixtures + "/" + v, dir_->Join(v)));
      if (!s.ok()) {
        error_ = std::string("import of ") + v + " failed: " + std::string(s.message());
        return;
      }
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    delete expected_;
    expected_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(error_.empty()) << error_;
  }

  static std::string Imported(const std::string& v) { return dir_->Join(v); }
  static std::string InPlace(const std::string& v) { return kFixtures + "/" + v; }
  // The dataset read in place, then its import: every check below holds for both.
  static std::vector<std::string> Both(const std::string& v) { return {InPlace(v), Imported(v)}; }
  static const json& Expected(const std::string& v) { return (*expected_)[v]; }

  // A copy of a fixture dataset to break.
  static std::string CopyOf(const std::string& v, const std::string& name) {
    const std::string to = dir_->Join(name);
    fs::copy(kFixtures + "/" + v, to, fs::copy_options::recursive);
    return to;
  }

  // v2.1's episodes.jsonl says episode 1 has 8 frames (the rows and the video have 7), and
  // info.json's total agrees with the lie.
  static void MakeEpisodeOneLie(const std::string& root) {
    std::string episodes = ReadFile(root + "/meta/episodes.jsonl");
    const std::string from = "\"length\":7", to = "\"length\":8";
    ASSERT_NE(episodes.find(from), std::string::npos) << episodes;
    episodes.replace(episodes.find(from), from.size(), to);
    WriteFile(root + "/meta/episodes.jsonl", episodes);
    json info = json::parse(ReadFile(root + "/meta/info.json"));
    info["total_frames"] = 30;
    WriteFile(root + "/meta/info.json", info.dump());
  }

  static TempDir* dir_;
  static json* expected_;
  static std::string skip_, error_;
};
TempDir* LeRobotImportTest::dir_ = nullptr;
json* LeRobotImportTest::expected_ = nullptr;
std::string LeRobotImportTest::skip_;
std::string LeRobotImportTest::error_;

TEST_F(LeRobotImportTest, V30ManifestMapsFeaturesToStreams) {
  auto ds = Dataset::Open(Imported("v30"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Manifest& m = (*ds)->manifest();
  EXPECT_EQ(m.num_episodes, 4u);
  std::vector<std::string> names;
  for (const StreamInfo& s : m.streams) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"observation.images.top", "observation.images.wrist",
                                             "action", "next.reward", "observation.state",
                                             "instruction"}));
  EXPECT_EQ(m.streams[0].kind, pb::VIDEO);
  EXPECT_EQ(m.streams[0].codec, "h264");
  EXPECT_EQ(m.streams[0].shape, (std::vector<int64_t>{48, 64, 3}));
  EXPECT_EQ(m.streams[0].rate, 30);
  EXPECT_EQ(m.streams[1].codec, "av1");
  EXPECT_EQ(m.streams[1].shape, (std::vector<int64_t>{64, 64, 3}));
  EXPECT_EQ(m.streams[2].kind, pb::LOWDIM);
  EXPECT_EQ(m.streams[2].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(m.streams[2].names,
            (std::vector<std::string>{"motor_0", "motor_1", "motor_2", "motor_3"}));
  EXPECT_EQ(m.streams[3].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(m.streams[4].shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(m.streams[4].names[5], "joint_5");
  EXPECT_EQ(m.streams[5].kind, pb::TEXT);
  // Statistics are meta/stats.json's, quantiles included.
  const json& st = Expected("v30")["stats"]["observation.state"];
  ASSERT_TRUE(m.stats.count("observation.state"));
  const StreamStats& s = m.stats.at("observation.state");
  EXPECT_EQ(s.mean, st["mean"].get<std::vector<double>>());
  EXPECT_EQ(s.std, st["std"].get<std::vector<double>>());
  EXPECT_EQ(s.min, st["min"].get<std::vector<double>>());
  EXPECT_EQ(s.max, st["max"].get<std::vector<double>>());
  EXPECT_EQ(s.count, 42u);
  ASSERT_TRUE(s.quantiles.count("q01") && s.quantiles.count("q99"));
  EXPECT_EQ(s.quantiles.at("q99"), st["q99"].get<std::vector<double>>());
  // next.reward has no statistics in stats.json: computed from the values.
  EXPECT_EQ(m.stats.at("next.reward").count, 42u);
}

TEST_F(LeRobotImportTest, VerifyPasses) {
  for (const char* v : {"v30", "v21"}) {
    for (const std::string& location : Both(v)) {
      InspectOptions o;
      o.dataset = location;
      o.verify = true;
      absl::Status s = RunInspect(o);
      EXPECT_TRUE(s.ok()) << location << ": " << s;
    }
  }
}

// Every frame of every episode and camera, extracted from the import, decodes (ffmpeg CLI) to
// exactly the frames ffmpeg decodes from the original LeRobot file at the episode's place in it.
TEST_F(LeRobotImportTest, EveryFrameEqualsFfmpegsDecodeOfTheOriginalFile) {
  for (const char* v : {"v30", "v21"}) {
    const json& cams = Expected(v)["cameras"];
    const json& episodes = Expected(v)["episodes"];
    for (const auto& [key, cam] : cams.items()) {
      std::map<std::string, std::vector<std::string>> original;  // by file
      for (size_t e = 0; e < episodes.size(); ++e) {
        SCOPED_TRACE(std::string(v) + " " + key + " episode " + std::to_string(e));
        const std::string file = cam["file"][e];
        if (!original.count(file)) original[file] = FrameMd5s(kFixtures + "/" + v + "/" + file);
        const size_t offset = cam["file_frame_offset"][e].get<size_t>();
        const size_t length = episodes[e]["length"].get<size_t>();
        ASSERT_LE(offset + length, original[file].size());
        const std::vector<std::string> want(original[file].begin() + offset,
                                            original[file].begin() + offset + length);
        for (const std::string& location : Both(v)) {
          SCOPED_TRACE(location);
          const std::string out = dir_->Join(std::string(v) + "_" + key + "_" + std::to_string(e) +
                                             (location == InPlace(v) ? "_inplace" : "") + ".mp4");
          ExtractOptions x;
          x.dataset = location;
          x.episode = static_cast<int64_t>(e);
          x.stream = key;
          x.out = out;
          absl::Status extracted = RunExtract(x);
          ASSERT_TRUE(extracted.ok()) << extracted;
          const std::vector<std::string> got = FrameMd5s(out);
          ASSERT_EQ(got.size(), length);
          EXPECT_EQ(got, want);
        }
      }
    }
  }
}

// `conveyor sample` on the import with LeRobot's semantics (anchor `action`, sample i = global row
// i, tolerance 1e-4 s): the RGB frames equal ffmpeg's rgb24 decode of the original file at the
// episode's frame, a frame before the anchor included, and the state equals the parquet row.
TEST_F(LeRobotImportTest, SamplesEqualFfmpegsRgbDecodeOfTheOriginal) {
  const std::string config = dir_->Join("lerobot.yaml");
  WriteFile(config, R"(anchor: action
tolerance_s: 0.0001
streams:
  observation.images.top: {delta_timestamps: [0.0]}
  observation.images.wrist: {delta_timestamps: [-0.0333333, 0.0]}
  observation.state: {delta_timestamps: [0.0]}
)");
  for (const std::string& location : Both("v30")) {
  SCOPED_TRACE(location);
  SampleOptions o;
  o.dataset = location;
  o.config = config;
  o.indices = {0, 9, 10, 22, 25, 41};  // episode starts, an episode's second frame, the last row
  o.out = dir_->Join(location == InPlace("v30") ? "samples_inplace" : "samples");
  o.progress = false;
  ASSERT_TRUE(RunSample(o).ok());
  // The script finds each sample's (episode, frame) from the lengths and the frame's place in
  // each camera's file from expected.json; ffmpeg decodes the original files to rgb24.
  const std::string script = R"(
import json, sys, subprocess
import numpy as np
fixtures, samples, indices = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(',')]
e = json.load(open(fixtures + '/expected.json'))['v30']
starts = np.cumsum([0] + [ep['length'] for ep in e['episodes']])
def decode(file, shape):
    raw = subprocess.run(['ffmpeg', '-v', 'error', '-i', fixtures + '/v30/' + file, '-f', 'rawvideo',
                          '-pix_fmt', 'rgb24', '-'], check=True, capture_output=True).stdout
    return np.frombuffer(raw, np.uint8).reshape((-1,) + shape)
bad = []
for n, i in enumerate(indices):
    ep = int(np.searchsorted(starts, i, side='right') - 1); k = i - starts[ep]
    d = '%s/%06d/' % (samples, n)
    for key, shape, deltas in [('observation.images.top', (48, 64, 3), [0]),
                               ('observation.images.wrist', (64, 64, 3), [-1, 0])]:
        cam = e['cameras'][key]
        frames = decode(cam['file'][ep], shape)
        got = np.load(d + key + '.npy')
        pad = np.load(d + key + '_is_pad.npy')
        for j, dk in enumerate(deltas):
            kk = max(k + dk, 0)
            if pad[j] != (k + dk < 0): bad.append((i, key, j, 'is_pad'))
            if not np.array_equal(got[j], frames[cam['file_frame_offset'][ep] + kk]): bad.append((i, key, j))
    state = np.array(e['episodes'][ep]['state'][k], np.float32)
    if np.load(d + 'observation.state.npy')[0].tobytes() != state.tobytes(): bad.append((i, 'state'))
print(bad if bad else 'ok')
sys.exit(1 if bad else 0)
)";
  WriteFile(dir_->Join("check_samples.py"), script);
  std::string indices;
  for (int64_t i : o.indices) indices += (indices.empty() ? "" : ",") + std::to_string(i);
  const auto r = RunCommand("/usr/bin/python3 " + ShellQuote(dir_->Join("check_samples.py")) + " " +
                                ShellQuote(kFixtures) + " " + ShellQuote(o.out) + " " + indices,
                            120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

// Lowdim values equal the floats the Parquet writer was given, bit for bit; the instruction is
// the episode's task.
TEST_F(LeRobotImportTest, LowdimBitForBitAndTheTask) {
  for (const char* v : {"v30", "v21"}) {
  for (const std::string& location : Both(v)) {
    SCOPED_TRACE(location);
    auto ds = Dataset::Open(location);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const Manifest& m = (*ds)->manifest();
    const json& episodes = Expected(v)["episodes"];
    ASSERT_EQ((*ds)->num_episodes(), episodes.size());
    for (size_t e = 0; e < episodes.size(); ++e) {
      SCOPED_TRACE(std::string(v) + " episode " + std::to_string(e));
      auto index = (*ds)->LoadEpisode(e);
      ASSERT_TRUE(index.ok()) << index.status();
      const size_t length = episodes[e]["length"].get<size_t>();
      for (const auto& [stream, key] : {std::pair<std::string, std::string>{"observation.state",
                                                                            "state"},
                                        {"action", "action"},
                                        {"next.reward", "reward"}}) {
        const int si = m.StreamIndex(stream);
        ASSERT_GE(si, 0) << stream;
        std::vector<float> got;
        ASSERT_TRUE((*ds)->ReadLowdim(**index, si, 0, length, &got).ok());
        std::vector<float> want;
        for (const json& row : episodes[e][key]) {
          if (row.is_array()) {
            for (const json& x : row) want.push_back(static_cast<float>(x.get<double>()));
          } else {
            want.push_back(static_cast<float>(row.get<double>()));
          }
        }
        ASSERT_EQ(got.size(), want.size()) << stream;
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << stream;
        // One step per row at the dataset's fps.
        const auto& ts = (*index)->streams(si).timestamps_s();
        ASSERT_EQ(static_cast<size_t>(ts.size()), length);
        EXPECT_NEAR(ts[static_cast<int>(length) - 1], (length - 1) / 30.0, 1e-6);
      }
      const std::string text = dir_->Join(std::string(v) + "_task_" + std::to_string(e) + ".txt");
      ExtractOptions x;
      x.dataset = location;
      x.episode = static_cast<int64_t>(e);
      x.stream = "instruction";
      x.out = text;
      ASSERT_TRUE(RunExtract(x).ok());
      EXPECT_EQ(ReadFile(text), episodes[e]["task"].get<std::string>());
    }
  }
  }
}

// v2.1's image feature embedded in the parquet: each frame is the PNG the writer embedded.
TEST_F(LeRobotImportTest, V21EmbeddedImagesAreTheBytesWritten) {
  for (const std::string& location : Both("v21")) {
  SCOPED_TRACE(location);
  auto ds = Dataset::Open(location);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const int si = (*ds)->manifest().StreamIndex("observation.images.hand");
  ASSERT_GE(si, 0);
  EXPECT_EQ((*ds)->manifest().streams[si].kind, pb::IMAGE);
  EXPECT_EQ((*ds)->manifest().streams[si].codec, "png");
  EXPECT_EQ((*ds)->manifest().streams[si].shape, (std::vector<int64_t>{24, 32, 3}));
  const json& episodes = Expected("v21")["episodes"];
  for (size_t e = 0; e < episodes.size(); ++e) {
    const std::string out =
        dir_->Join("hand_" + std::to_string(e) + (location == InPlace("v21") ? "_inplace" : ""));
    ExtractOptions x;
    x.dataset = location;
    x.episode = static_cast<int64_t>(e);
    x.stream = "observation.images.hand";
    x.out = out;
    ASSERT_TRUE(RunExtract(x).ok());
    const size_t length = episodes[e]["length"].get<size_t>();
    for (size_t k = 0; k < length; ++k) {
      char name[64];
      std::snprintf(name, sizeof(name), "frame_%06zu.png", k);
      char orig[64];
      std::snprintf(orig, sizeof(orig), "frame_%06zu.png", k + 1);
      EXPECT_EQ(ReadFile(out + "/" + name),
                ReadFile(kFixtures + "/v21_images/episode_" + std::to_string(e) + "/" + orig))
          << "episode " << e << " frame " << k;
    }
  }
  }
}

// `conveyor import --from` recognises a LeRobot root by its meta/info.json.
TEST_F(LeRobotImportTest, FromDetectsALeRobotRoot) {
  ImportOptions o;
  o.from = kFixtures + "/v21";
  o.out = dir_->Join("detected");
  o.progress = false;
  ASSERT_TRUE(RunImport(o).ok());
  auto ds = Dataset::Open(o.out);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_episodes(), 3u);
}

// Broken copies: each error names the file (and the episode where there is one), and nothing is
// left at --out.
TEST_F(LeRobotImportTest, TruncatedParquetIsAClearError) {
  const std::string root = CopyOf("v30", "truncated");
  const std::string file = root + "/data/chunk-000/file-001.parquet";
  fs::resize_file(file, fs::file_size(file) / 2);
  const std::string out = dir_->Join("truncated_out");
  absl::Status s = RunImport(LeRobotImport(root, out));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, "data/chunk-000/file-001.parquet")) << s;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(LeRobotImportTest, LyingFpsIsAClearError) {
  const std::string root = CopyOf("v30", "fps");
  json info = json::parse(ReadFile(root + "/meta/info.json"));
  info["fps"] = 25;
  WriteFile(root + "/meta/info.json", info.dump());
  absl::Status s = RunImport(LeRobotImport(root, dir_->Join("fps_out")));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, "data/chunk-000/file-000.parquet, episode 0")) << s;
  EXPECT_TRUE(Mentions(s, "fps 25")) << s;
}

TEST_F(LeRobotImportTest, MissingVideoIsAClearError) {
  const std::string root = CopyOf("v30", "missing");
  fs::remove(root + "/videos/observation.images.wrist/chunk-000/file-001.mp4");
  absl::Status s = RunImport(LeRobotImport(root, dir_->Join("missing_out")));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_TRUE(Mentions(s, "videos/observation.images.wrist/chunk-000/file-001.mp4")) << s;
  EXPECT_TRUE(Mentions(s, "episode 1, camera 'observation.images.wrist'")) << s;
}

// --skip-broken-episodes: the episodes a missing mp4 breaks (the wrist camera's file-001 holds
// episodes 1-3) are left out and listed; the others are imported whole.
TEST_F(LeRobotImportTest, SkipBrokenEpisodesImportsTheRest) {
  const std::string root = CopyOf("v30", "missing_skip");
  fs::remove(root + "/videos/observation.images.wrist/chunk-000/file-001.mp4");
  ImportOptions o = LeRobotImport(root, dir_->Join("missing_skip_out"));
  o.skip_broken = true;
  absl::Status s = RunImport(o);
  ASSERT_TRUE(s.ok()) << s;
  auto ds = Dataset::Open(o.out);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_episodes(), 1u);
  EXPECT_EQ((*ds)->episodes().record(0).lengths[0], Expected("v30")["episodes"][0]["length"].get<uint32_t>());
  // Without the flag the same import fails and leaves nothing behind.
  o.skip_broken = false;
  o.out = dir_->Join("missing_noskip_out");
  EXPECT_FALSE(RunImport(o).ok());
  EXPECT_FALSE(fs::exists(o.out));
}

TEST_F(LeRobotImportTest, LyingInfoJsonIsAClearError) {
  const std::string root = CopyOf("v21", "frames");
  json info = json::parse(ReadFile(root + "/meta/info.json"));
  info["total_frames"] = 30;
  WriteFile(root + "/meta/info.json", info.dump());
  absl::Status s = RunImport(LeRobotImport(root, dir_->Join("frames_out")));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, "meta/info.json says total_frames 30, the episode lengths add up to 29"))
      << s;
}

// A length in episodes.jsonl that disagrees with the rows and the video.
TEST_F(LeRobotImportTest, LyingEpisodeLengthIsAClearError) {
  const std::string root = CopyOf("v21", "length");
  MakeEpisodeOneLie(root);
  absl::Status s = RunImport(LeRobotImport(root, dir_->Join("length_out")));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, "episode_000001.parquet, episode 1: 7 rows")) << s;
  EXPECT_TRUE(Mentions(s, "length 8")) << s;
}

// ---------------------------------------------------------------------------------------------
// Read in place: the same samples as the import, bit for bit; batches independent of the thread
// count and the same over HTTP; the packet index cache; errors that name the file.

std::map<std::string, std::string> FilesUnder(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != "summary.json") {
      out[fs::relative(e.path(), dir).string()] = ReadFile(e.path().string());
    }
  }
  return out;
}

// Every sample of both datasets, every stream at its own size: the .npy files and meta.json of
// the dataset read in place equal those of its import byte for byte.
TEST_F(LeRobotImportTest, InPlaceSamplesEqualTheImportsBitForBit) {
  for (const char* v : {"v30", "v21"}) {
    SCOPED_TRACE(v);
    size_t total = 0;
    for (const json& ep : Expected(v)["episodes"]) total += ep["length"].get<size_t>();
    std::map<std::string, std::string> files[2];
    for (int i = 0; i < 2; ++i) {
      SampleOptions o;
      o.dataset = Both(v)[static_cast<size_t>(i)];
      o.count = static_cast<int64_t>(total);
      o.stride = 1;
      o.out = dir_->Join(std::string("all_") + v + (i == 0 ? "_inplace" : "_imported"));
      o.progress = false;
      absl::Status s = RunSample(o);
      ASSERT_TRUE(s.ok()) << o.dataset << ": " << s;
      files[i] = FilesUnder(o.out);
    }
    ASSERT_EQ(files[0].size(), files[1].size());
    EXPECT_GE(files[0].size(), total * 4);  // a folder per sample: streams, masks, meta.json
    for (const auto& [name, bytes] : files[1]) {
      ASSERT_TRUE(files[0].count(name)) << name;
      EXPECT_TRUE(files[0][name] == bytes) << name << " differs";
    }
  }
}

constexpr char kBatchesConfig[] = R"(anchor: action
streams:
  observation.images.top: {delta_timestamps: [-0.0333333, 0.0]}
  observation.images.wrist: {delta_timestamps: [0.0], size: [32, 32]}
  observation.state: {delta_timestamps: [0.0], normalize: mean_std}
  action: {delta_timestamps: {start: 0.0, step: 0.0333333, count: 5}, normalize: min_max}
  instruction: {}
pipeline:
  global_batch_size: 4
  seed: 11
  schedule: {mode: gop}
)";

std::string BatchesDigest(const std::string& location, const std::string& config, int threads,
                          int* exit_code) {
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(location) +
                                " --config " + ShellQuote(config) + " --steps 24 --digest" +
                                " --threads " + std::to_string(threads) + " 2>&1",
                            120);
  *exit_code = r.exit_code;
  return r.output;
}

// Two epochs of shuffled batches of the v3.0 dataset in place: the same bits at 1 and 2 threads
// and read over HTTP from nginx (range reads of the parquet and mp4 files).
TEST_F(LeRobotImportTest, InPlaceBatchesAtAnyThreadCountAndOverHttp) {
  const std::string config = dir_->Join("batches.yaml");
  WriteFile(config, kBatchesConfig);
  int code = 0;
  const std::string one = BatchesDigest(InPlace("v30"), config, 1, &code);
  ASSERT_EQ(code, 0) << one;
  EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 24) << one;
  EXPECT_EQ(BatchesDigest(InPlace("v30"), config, 2, &code), one);
  auto nginx = conveyor::testing::NginxServer::Start(kFixtures);
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  EXPECT_EQ(BatchesDigest((*nginx)->base_url() + "v30/", config, 2, &code), one)
      << (*nginx)->ErrorLog();
}

struct Opened {
  std::unique_ptr<Dataset> ds;
  uint64_t bytes_read = 0;  // by opening and loading every episode's index
};

Opened OpenAndLoadAll(const std::string& root, const std::string& cache) {
  Opened out;
  lerobot::DatasetOptions o;
  o.index_cache_dir = cache;
  auto ds = lerobot::OpenDataset(NewLocalStorage(root), root, o);
  EXPECT_TRUE(ds.ok()) << ds.status();
  if (!ds.ok()) return out;
  for (size_t e = 0; e < (*ds)->num_episodes(); ++e) {
    auto index = (*ds)->LoadEpisode(e);
    EXPECT_TRUE(index.ok()) << index.status();
  }
  out.bytes_read = (*ds)->storage().stats().bytes_read;
  out.ds = *std::move(ds);
  return out;
}

uint64_t Mp4Bytes(const std::string& root) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().extension() == ".mp4") n += e.file_size();
  }
  return n;
}

// The first open demuxes every mp4 once; the second finds their packet indexes in the cache and
// reads no video byte. A corrupt cache entry is not trusted: it is rebuilt.
TEST_F(LeRobotImportTest, TheIndexCacheSparesTheSecondOpenTheDemuxing) {
  const std::string root = CopyOf("v30", "cached");
  const std::string cache = dir_->Join("cache_a");
  const uint64_t videos = Mp4Bytes(root);
  ASSERT_GT(videos, 0u);
  const Opened first = OpenAndLoadAll(root, cache);
  const Opened second = OpenAndLoadAll(root, cache);
  EXPECT_GE(first.bytes_read, second.bytes_read + videos);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(cache)) {
    ++entries;
    fs::resize_file(e.path(), e.file_size() - 3);  // torn
  }
  EXPECT_EQ(entries, 4u);  // 2 cameras x 2 files
  const Opened third = OpenAndLoadAll(root, cache);
  EXPECT_EQ(third.bytes_read, first.bytes_read);
  // The same indexes each time.
  for (size_t e = 0; e < first.ds->num_episodes(); ++e) {
    EXPECT_EQ((*first.ds->LoadEpisode(e))->SerializeAsString(),
              (*second.ds->LoadEpisode(e))->SerializeAsString());
    EXPECT_EQ((*first.ds->LoadEpisode(e))->SerializeAsString(),
              (*third.ds->LoadEpisode(e))->SerializeAsString());
  }
}

// A video rewritten in place under the same size and mtime is caught by the packets' checksums,
// never decoded; once its mtime changes, it is indexed afresh.
TEST_F(LeRobotImportTest, AVideoRewrittenInPlaceIsCaught) {
  const std::string root = CopyOf("v30", "rewritten");
  const std::string cache = dir_->Join("cache_b");
  const Opened first = OpenAndLoadAll(root, cache);
  ASSERT_NE(first.ds, nullptr);
  const int cam = first.ds->manifest().StreamIndex("observation.images.wrist");
  auto index = first.ds->LoadEpisode(0);
  ASSERT_TRUE(index.ok());
  const pb::PacketTable& t = (*index)->streams(cam).packets();
  const std::string file = root + "/videos/observation.images.wrist/chunk-000/file-000.mp4";
  const auto mtime = fs::last_write_time(file);
  std::string bytes = ReadFile(file);
  bytes[t.offset(1) + t.size(1) / 2] ^= 0x5a;
  WriteFile(file, bytes);
  fs::last_write_time(file, mtime);

  const Opened second = OpenAndLoadAll(root, cache);
  ASSERT_NE(second.ds, nullptr);
  std::string packet;
  absl::Status s = second.ds->ReadPacket(**second.ds->LoadEpisode(0), cam, 1, &packet);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_TRUE(Mentions(s, "videos/observation.images.wrist/chunk-000/file-000.mp4")) << s;
  EXPECT_TRUE(Mentions(s, "episode 0, stream 'observation.images.wrist', packet 1")) << s;

  fs::last_write_time(file, mtime + std::chrono::seconds(5));
  const Opened third = OpenAndLoadAll(root, cache);
  ASSERT_NE(third.ds, nullptr);
  s = third.ds->ReadPacket(**third.ds->LoadEpisode(0), cam, 1, &packet);
  EXPECT_TRUE(s.ok()) << s;
}

// In place, opening reads the metadata only: a missing video or a lying length is found when the
// episode is first read, with the same messages as the import's.
TEST_F(LeRobotImportTest, InPlaceErrorsNameTheFileAndEpisode) {
  {
    const std::string root = CopyOf("v30", "missing_inplace");
    fs::remove(root + "/videos/observation.images.wrist/chunk-000/file-001.mp4");
    auto ds = Dataset::Open(root);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_TRUE((*ds)->LoadEpisode(0).ok());
    absl::Status s = (*ds)->LoadEpisode(1).status();
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_TRUE(Mentions(s, "videos/observation.images.wrist/chunk-000/file-001.mp4")) << s;
    EXPECT_TRUE(Mentions(s, "episode 1, camera 'observation.images.wrist'")) << s;
    // Through the CLI: the error reaches the user, naming the file.
    const std::string config = dir_->Join("batches_missing.yaml");
    WriteFile(config, kBatchesConfig);
    int code = 0;
    const std::string out = BatchesDigest(root, config, 1, &code);
    EXPECT_NE(code, 0) << out;
    EXPECT_NE(out.find("file-001.mp4"), std::string::npos) << out;
  }
  {
    const std::string root = CopyOf("v21", "length_inplace");
    MakeEpisodeOneLie(root);
    auto ds = Dataset::Open(root);
    ASSERT_TRUE(ds.ok()) << ds.status();
    absl::Status s = (*ds)->LoadEpisode(1).status();
    EXPECT_TRUE(Mentions(s, "episode_000001.parquet, episode 1: 7 rows")) << s;
    EXPECT_TRUE(Mentions(s, "length 8")) << s;
  }
}

// A broken episode read in place: `inspect --verify` fails naming the file; `on_error: skip`
// drops that episode's samples, counted, while the others are served.
TEST_F(LeRobotImportTest, InPlaceVerifyFindsABrokenEpisodeAndSkipSkipsIt) {
  const std::string root = CopyOf("v30", "broken_inplace");
  fs::remove(root + "/videos/observation.images.wrist/chunk-000/file-001.mp4");  // episodes 1-3
  const std::string cli = ShellQuote(CONVEYOR_CLI);
  const auto verify = RunCommand(cli + " inspect " + ShellQuote(root) + " --verify 2>&1", 120);
  EXPECT_NE(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("file-001.mp4"), std::string::npos) << verify.output;
  EXPECT_EQ(RunCommand(cli + " inspect " + ShellQuote(InPlace("v30")) + " --verify 2>&1", 120).exit_code, 0);

  std::string text = kBatchesConfig;
  text.insert(0, "on_error: skip\n");
  const std::string config = dir_->Join("batches_skip.yaml");
  WriteFile(config, text);
  const auto r = RunCommand(cli + " batches " + ShellQuote(root) + " --config " + ShellQuote(config) +
                                " --steps 8 --ids --stats 2>&1",
                            120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t samples = 0, skipped_line = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t open = line.find('[');
    if (line.find(" consumer ") == std::string::npos || open == std::string::npos) continue;
    std::istringstream ids(line.substr(open + 1, line.find(']') - open - 1));
    for (std::string id; ids >> id;) {
      ++samples;
      EXPECT_EQ(id.rfind("0/", 0), 0u) << "a sample of a broken episode was served: " << line;
    }
  }
  EXPECT_GT(samples, 0u) << r.output;
  skipped_line = r.output.find(" skipped)");
  ASSERT_NE(skipped_line, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("(0 skipped)"), std::string::npos) << "no skip was counted: " << r.output;
}

// Exact resume in place: from the cursor of any batch, the same batches follow as in one run.
TEST_F(LeRobotImportTest, InPlaceResumesExactlyFromAnyCursor) {
  const std::string config = dir_->Join("batches_resume.yaml");
  WriteFile(config, kBatchesConfig);
  int code = 0;
  const std::string all = BatchesDigest(InPlace("v30"), config, 2, &code);
  ASSERT_EQ(code, 0) << all;
  const std::vector<std::string> lines = conveyor::testing::SplitLines(all);
  ASSERT_EQ(lines.size(), 24u) << all;
  for (size_t at : {1u, 7u, 13u, 23u}) {
    const std::string cursor = lines[at].substr(0, lines[at].find(' '));
    const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(InPlace("v30")) +
                                  " --config " + ShellQuote(config) + " --digest --threads 1 --cursor " +
                                  cursor + " --steps " + std::to_string(24 - at) + " 2>&1",
                              120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string want;
    for (size_t i = at; i < 24; ++i) want += lines[i] + "\n";
    EXPECT_EQ(r.output, want) << "resumed at " << cursor;
  }
}

// A LeRobot dataset read in place as a member of a mixture with a native dataset of another
// robot: its cameras renamed onto the shared names, every batch half from each, the ids say
// which, and a resume from a mid-run cursor gives the same lines.
TEST_F(LeRobotImportTest, InPlaceAsAMixtureMember) {
  const std::string cli = ShellQuote(CONVEYOR_CLI);
  const std::string synth = dir_->Join("mix_synth");
  auto made = RunCommand(cli + " synth --quiet --out " + ShellQuote(synth) +
                         " --episodes 2 --episode-seconds 2 --cameras 2 --size 64x48 --fps 30 --state-dim 6"
                         " --action-dim 4 --lowdim-rate 30 --audio-codec none --seed 3",
                         120);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string mix = dir_->Join("mix.yaml");
  WriteFile(mix, "mixture:\n  name: two_robots\n  tag: robot\n  datasets:\n"
                 "    - {name: lerobot, uri: " + InPlace("v30") + ", weight: 0.5,\n"
                 "       streams: {cam0: observation.images.top, cam1: observation.images.wrist}}\n"
                 "    - {name: synth, uri: " + synth + ", weight: 0.5}\n");
  const std::string config = dir_->Join("mix_config.yaml");
  WriteFile(config, "anchor: action\nstreams:\n  cam0: {size: [48, 64]}\n  cam1: {size: [64, 64]}\n"
                    "  observation.state: {}\n  action: {}\n"
                    "pipeline: {global_batch_size: 8, seed: 1, schedule: {mode: gop}}\n");
  auto batches = [&](const std::string& cursor, int steps) {
    return RunCommand(cli + " batches " + ShellQuote(mix) + " --config " + ShellQuote(config) +
                          " --digest --ids --threads 2 --cursor " + cursor + " --steps " + std::to_string(steps),
                      120);
  };
  const auto all = batches("0:0", 12);
  ASSERT_EQ(all.exit_code, 0) << all.output;
  const std::vector<std::string> lines = conveyor::testing::SplitLines(all.output);
  ASSERT_EQ(lines.size(), 12u) << all.output;
  for (const std::string& line : lines) {
    const size_t open = line.find('[');
    ASSERT_NE(open, std::string::npos) << line;
    std::istringstream ids(line.substr(open + 1, line.find(']') - open - 1));
    int from_synth = 0, n = 0;
    for (std::string id; ids >> id; ++n) from_synth += id.rfind("1:", 0) == 0 ? 1 : 0;
    EXPECT_EQ(n, 8) << line;
    EXPECT_EQ(from_synth, 4) << "not half from each dataset: " << line;
  }
  const std::string cursor = lines[5].substr(0, lines[5].find(' '));
  const auto rest = batches(cursor, 7);
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  std::string want;
  for (size_t i = 5; i < 12; ++i) want += lines[i] + "\n";
  EXPECT_EQ(rest.output, want) << "resumed at " << cursor;
}

// pi0-style quantile normalization from v3.0's stats.json: 2 (x - q01) / (q99 - q01 + 1e-8) - 1
// in float32, in place and imported; a mode whose quantiles the dataset lacks is refused, naming
// what it has.
TEST_F(LeRobotImportTest, QuantileNormalizationUsesTheDatasetsQuantiles) {
  const json& st = Expected("v30")["stats"]["observation.state"];
  const std::vector<double> q01 = st["q01"].get<std::vector<double>>();
  const std::vector<double> q99 = st["q99"].get<std::vector<double>>();
  const std::string config = dir_->Join("quantile.yaml");
  WriteFile(config, "anchor: action\nstreams:\n  observation.state: {delta_timestamps: [0.0], "
                    "normalize: quantile}\n");
  for (const std::string& location : Both("v30")) {
    SCOPED_TRACE(location);
    SampleOptions o;
    o.dataset = location;
    o.config = config;
    o.indices = {0, 17, 41};
    o.out = dir_->Join(location == InPlace("v30") ? "quantile_inplace" : "quantile_imported");
    o.progress = false;
    absl::Status s = RunSample(o);
    ASSERT_TRUE(s.ok()) << s;
    const json& episodes = Expected("v30")["episodes"];
    for (size_t n = 0; n < o.indices.size(); ++n) {
      // Sample i's row: episode and frame from the lengths.
      size_t i = static_cast<size_t>(o.indices[n]), e = 0;
      while (i >= episodes[e]["length"].get<size_t>()) i -= episodes[e++]["length"].get<size_t>();
      const std::vector<double> x = episodes[e]["state"][i].get<std::vector<double>>();
      char folder[32];
      std::snprintf(folder, sizeof(folder), "/%06zu/", n);
      const std::string npy = ReadFile(o.out + folder + "observation.state.npy");
      ASSERT_GE(npy.size(), x.size() * sizeof(float));
      const float* got = reinterpret_cast<const float*>(npy.data() + npy.size() - x.size() * sizeof(float));
      for (size_t d = 0; d < x.size(); ++d) {
        const float offset = static_cast<float>(q01[d]);
        const float scale = static_cast<float>(2.0 / (q99[d] - q01[d] + 1e-8));
        const float want = (static_cast<float>(x[d]) - offset) * scale + -1.0f;
        EXPECT_EQ(got[d], want) << "sample " << o.indices[n] << " dim " << d;
      }
    }
  }
  WriteFile(config, "anchor: action\nstreams:\n  observation.state: {delta_timestamps: [0.0], "
                    "normalize: quantile10}\n");
  SampleOptions o;
  o.dataset = InPlace("v30");
  o.config = config;
  o.out = dir_->Join("quantile10");
  o.progress = false;
  absl::Status s = RunSample(o);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, "needs the q10 and q90 statistics of 'observation.state'")) << s;
  EXPECT_TRUE(Mentions(s, "the manifest has q01, q99")) << s;
}

}  // namespace
}  // namespace conveyor::tools
