// `conveyor import` and `conveyor extract` (RunImport / RunExtract), checked against independent
// tools: media made and decoded by the ffmpeg CLI (`-f framemd5`, `-f md5`, ffprobe), .npy files
// made and compared by numpy. Extracted video and audio must decode to exactly the frames and
// samples of the imported originals, since import and extract only remux.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "tests/support/media_checks.h"
#include "tests/support/test_env.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using conveyor::testing::CommandResult;
using conveyor::testing::FrameMd5s;
using conveyor::testing::ReadFile;
using conveyor::testing::RunCommand;
using conveyor::testing::ShellQuote;
using conveyor::testing::TempDir;
using conveyor::testing::WriteFile;

using conveyor::testing::kFfmpeg;
using conveyor::testing::Sh;
const std::string kPython = "/usr/bin/python3";

// Runs `command`; on failure returns its output, else "".
// Runs a numpy script in `dir` (numpy imported as np), each key of `vars` in it replaced by its
// value; on failure returns the script's output, else "".
std::string Python(const std::string& dir, std::string script,
                   const std::vector<std::pair<std::string, std::string>>& vars) {
  for (const auto& [key, value] : vars) {
    for (size_t pos = script.find(key); pos != std::string::npos;
         pos = script.find(key, pos + value.size())) {
      script.replace(pos, key.size(), value);
    }
  }
  return Sh("cd " + ShellQuote(dir) + " && " + kPython + " -c " +
            ShellQuote("import numpy as np\n" + script));
}

// MD5 of the whole decoded audio as float32: every sample, exactly (AAC decodes to float).
std::string AudioMd5(const std::string& file) {
  CommandResult r =
      RunCommand(kFfmpeg + " -i " + ShellQuote(file) + " -map 0:a:0 -c:a pcm_f32le -f md5 -", 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// ffprobe's view of the first stream: `entries` as comma-separated values.
std::string Probe(const std::string& file, const std::string& entries) {
  CommandResult r = RunCommand("ffprobe -v error -select_streams 0 -show_entries " + entries +
                                   " -of csv=p=0 " + ShellQuote(file),
                               60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  while (!r.output.empty() && (r.output.back() == '\n' || r.output.back() == ',')) {
    r.output.pop_back();
  }
  return r.output;
}

bool Mentions(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

ImportOptions Import(const std::string& from, const std::string& out) {
  ImportOptions o;
  o.from = from;
  o.out = out;
  o.progress = false;
  return o;
}

ExtractOptions Extract(const std::string& dataset, int64_t episode, const std::string& stream,
                       const std::string& out) {
  ExtractOptions o;
  o.dataset = dataset;
  o.episode = episode;
  o.stream = stream;
  o.out = out;
  return o;
}

// One episode folder with every kind of file import takes: H.264 with B-frames (in MP4, and in
// Matroska with a start offset), H.264 4:4:4 at an odd size, VP9 in WebM, a JPEG folder, PCM WAV,
// FLAC, AAC in M4A, Opus in Ogg, a float32 state with its own float64 timestamps, a float64
// action at a rate from episode.json, and an instruction.
std::string MakeEpisode(const std::string& dir, double seconds, int tone_hz, int seed) {
  const std::string s = std::to_string(seconds);
  std::string err =
      Sh("mkdir -p " + ShellQuote(dir + "/overhead") + " && cd " + ShellQuote(dir) + " && " +
         kFfmpeg + " -f lavfi -i testsrc2=size=160x120:rate=30:duration=" + s +
         " -f lavfi -i sine=frequency=" + std::to_string(tone_hz) +
         ":sample_rate=16000:duration=" + s +
         " -map 0:v -c:v libx264 -preset veryfast -bf 2 -g 30 -pix_fmt yuv420p cam.mp4"
         " -map 0:v -vf scale=161:121 -r 15 -c:v libx264 -preset veryfast -pix_fmt yuv444p side.mp4"
         " -map 0:v -vf scale=96:64 -r 10 -c:v libvpx-vp9 -deadline realtime -cpu-used 8 wrist.webm"
         " -map 0:v -vf scale=64:48 -r 5 -frames:v 3 overhead/%03d.jpg"
         " -map 1:a -c:a pcm_s16le mic.wav"
         " -map 1:a -c:a flac mic_flac.flac"
         " -map 1:a -c:a aac -b:a 32k mic_aac.m4a"
         " -map 1:a -c:a libopus -b:a 24k mic_opus.ogg");
  if (!err.empty()) return err;
  // Matroska leaves the dts of the first reordered frames unset; the offset gives the file a
  // start time of 0.5 s, which is t = 0 of the episode.
  err = Sh("cd " + ShellQuote(dir) + " && " + kFfmpeg +
           " -i cam.mp4 -c copy -output_ts_offset 0.5 front.mkv");
  if (!err.empty()) return err;
  err = Python(dir, R"(
rng = np.random.default_rng(SEED)
T = int(SECONDS * 50)
np.save('state.npy', rng.standard_normal((T, 7)).astype(np.float32))
np.save('state.timestamps.npy', np.arange(T) / 50.0 + rng.uniform(0, 0.002, T))
np.save('action.npy', rng.standard_normal((int(SECONDS * 20), 4)))
)",
               {{"SEED", std::to_string(seed)}, {"SECONDS", s}});
  if (!err.empty()) return err;
  WriteFile(dir + "/episode.json", R"({"instruction": "put the red cup on the plate, episode )" +
                                       std::to_string(seed) +
                                       R"(", "rates": {"action": 20, "overhead": 5},
                 "names": {"action": ["x", "y", "z", "gripper"]}})");
  return "";
}

// Two episodes made and imported once per test process (ctest runs each test in its own).
class ImportExtractTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    error_ = MakeEpisode(In(0), 1.0, 440, 0);
    if (error_.empty()) error_ = MakeEpisode(In(1), 1.4, 660, 1);
    if (!error_.empty()) return;
    absl::Status s = RunImport(Import(dir_->Join("in"), DatasetPath()));
    if (!s.ok()) error_ = "import failed: " + std::string(s.message());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }

  static std::string In(int episode) { return dir_->Join("in/ep_" + std::to_string(episode)); }
  static std::string DatasetPath() { return dir_->Join("dataset"); }
  static std::string Out(const std::string& name) { return dir_->Join(name); }

  static TempDir* dir_;
  static std::string error_;
};
TempDir* ImportExtractTest::dir_ = nullptr;
std::string ImportExtractTest::error_;

TEST_F(ImportExtractTest, ManifestDescribesEveryStream) {
  auto ds = Dataset::Open(DatasetPath());
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Manifest& m = (*ds)->manifest();
  EXPECT_EQ(m.name, "in");
  EXPECT_EQ(m.num_episodes, 2u);
  // Kind first (video, image, audio, lowdim, text), then name.
  std::vector<std::string> names;
  for (const StreamInfo& s : m.streams) names.push_back(s.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"cam", "front", "side", "wrist", "overhead", "mic", "mic_aac",
                                      "mic_flac", "mic_opus", "action", "state", "instruction"}));
  ASSERT_EQ(m.streams.size(), 12u);
  const StreamInfo& cam = m.streams[0];
  EXPECT_EQ(cam.kind, pb::VIDEO);
  EXPECT_EQ(cam.codec, "h264");
  EXPECT_EQ(cam.rate, 30);
  EXPECT_EQ(cam.shape, (std::vector<int64_t>{120, 160, 3}));
  EXPECT_EQ(cam.pix_fmt, "yuv420p");
  EXPECT_EQ(m.streams[1].codec, "h264");
  EXPECT_EQ(m.streams[2].shape, (std::vector<int64_t>{121, 161, 3}));
  EXPECT_EQ(m.streams[2].pix_fmt, "yuv444p");
  EXPECT_EQ(m.streams[2].rate, 15);
  EXPECT_EQ(m.streams[3].codec, "vp9");
  EXPECT_EQ(m.streams[4].kind, pb::IMAGE);
  EXPECT_EQ(m.streams[4].codec, "mjpeg");
  EXPECT_EQ(m.streams[4].rate, 5);
  EXPECT_EQ(m.streams[4].shape, (std::vector<int64_t>{48, 64, 3}));
  EXPECT_EQ(m.streams[5].kind, pb::AUDIO);
  EXPECT_EQ(m.streams[5].codec, "pcm_s16le");
  EXPECT_EQ(m.streams[5].rate, 16000);
  EXPECT_EQ(m.streams[5].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(m.streams[6].codec, "aac");
  EXPECT_EQ(m.streams[7].codec, "flac");
  EXPECT_EQ(m.streams[8].codec, "opus");
  const StreamInfo& action = m.streams[9];
  EXPECT_EQ(action.kind, pb::LOWDIM);
  EXPECT_EQ(action.rate, 20);
  EXPECT_EQ(action.shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(action.names, (std::vector<std::string>{"x", "y", "z", "gripper"}));
  const StreamInfo& state = m.streams[10];
  EXPECT_EQ(state.shape, (std::vector<int64_t>{7}));
  EXPECT_EQ(state.names.front(), "state_0");
  EXPECT_NEAR(state.rate, 50, 3);  // 1 / median step of jittered 50 Hz timestamps
  EXPECT_EQ(m.streams[11].kind, pb::TEXT);

  auto index = (*ds)->LoadEpisode(1);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->source(), In(1));
  EXPECT_EQ((*index)->streams(11).text(), "put the red cup on the plate, episode 1");
  // The B-frames survived: presentation order differs from decode order.
  const pb::PacketTable& t = (*index)->streams(0).packets();
  ASSERT_EQ(t.pts_size(), 42);  // 1.4 s at 30 fps
  EXPECT_FALSE(std::is_sorted(t.pts().begin(), t.pts().end()));
  EXPECT_EQ((*index)->streams(0).pts_origin(), 0);
  // Matroska (1/1000 time base): the start time is the origin; the missing dts are filled in.
  const pb::StreamIndex& front = (*index)->streams(1);
  EXPECT_EQ(front.pts_origin(), 500);
  EXPECT_EQ(front.packets().pts(0), 500);
  for (int i = 1; i < front.packets().dts_size(); ++i) {
    EXPECT_LT(front.packets().dts(i - 1), front.packets().dts(i)) << i;
    EXPECT_LE(front.packets().dts(i), front.packets().pts(i)) << i;
  }
  EXPECT_EQ((*index)->streams(10).num_frames(), 70u);
}

TEST_F(ImportExtractTest, VideoDecodesToTheSameFrames) {
  struct Case {
    std::string stream, original, ext, probe;
  };
  const std::vector<Case> cases = {
      {"cam", "cam.mp4", ".mp4", "h264,160,120,yuv420p"},
      {"cam", "cam.mp4", ".mkv", "h264,160,120,yuv420p"},
      {"front", "front.mkv", ".mp4", "h264,160,120,yuv420p,0.000000"},
      {"side", "side.mp4", ".mov", "h264,161,121,yuv444p"},
      {"wrist", "wrist.webm", ".webm", "vp9,96,64,yuv420p"},
  };
  for (int ep = 0; ep < 2; ++ep) {
    for (const Case& c : cases) {
      SCOPED_TRACE("episode " + std::to_string(ep) + " " + c.stream + c.ext);
      const std::string out = Out("ep" + std::to_string(ep) + "_" + c.stream + c.ext);
      absl::Status s = RunExtract(Extract(DatasetPath(), ep, c.stream, out));
      ASSERT_TRUE(s.ok()) << s;
      const std::string entries = c.stream == "front" ? "stream=codec_name,width,height,pix_fmt,"
                                                        "start_time"
                                                      : "stream=codec_name,width,height,pix_fmt";
      EXPECT_EQ(Probe(out, entries), c.probe);
      const std::vector<std::string> want = FrameMd5s(In(ep) + "/" + c.original, "v");
      const std::vector<std::string> got = FrameMd5s(out, "v");
      EXPECT_FALSE(want.empty());
      EXPECT_EQ(got, want);
    }
  }
}

TEST_F(ImportExtractTest, AudioDecodesToTheSameSamples) {
  struct Case {
    std::string stream, original, ext, probe;
  };
  const std::vector<Case> cases = {
      {"mic", "mic.wav", ".wav", "pcm_s16le,16000,1"},
      {"mic", "mic.wav", ".mka", "pcm_s16le,16000,1"},
      {"mic_flac", "mic_flac.flac", ".flac", "flac,16000,1"},
      {"mic_aac", "mic_aac.m4a", ".m4a", "aac,16000,1"},
      {"mic_opus", "mic_opus.ogg", ".opus", "opus,48000,1"},
  };
  for (int ep = 0; ep < 2; ++ep) {
    for (const Case& c : cases) {
      SCOPED_TRACE("episode " + std::to_string(ep) + " " + c.stream + c.ext);
      const std::string out = Out("ep" + std::to_string(ep) + "_" + c.stream + c.ext);
      absl::Status s = RunExtract(Extract(DatasetPath(), ep, c.stream, out));
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(Probe(out, "stream=codec_name,sample_rate,channels"), c.probe);
      const std::string want = AudioMd5(In(ep) + "/" + c.original);
      EXPECT_NE(want.find("MD5="), std::string::npos) << want;
      EXPECT_EQ(AudioMd5(out), want);
    }
  }
}

TEST_F(ImportExtractTest, LowdimTextAndImagesComeBackExactly) {
  for (int ep = 0; ep < 2; ++ep) {
    SCOPED_TRACE("episode " + std::to_string(ep));
    const std::string e = std::to_string(ep);
    const std::string state = Out("ep" + e + "_state.npy");
    const std::string action = Out("ep" + e + "_action.npy");
    ASSERT_TRUE(RunExtract(Extract(DatasetPath(), ep, "state", state)).ok());
    ASSERT_TRUE(RunExtract(Extract(DatasetPath(), ep, "action", action)).ok());
    // numpy is the independent reader of our .npy writer; float64 actions are stored as float32.
    const std::string err = Python(In(ep), R"(
s, st = np.load('OUT_state.npy'), np.load('OUT_state.timestamps.npy')
assert s.dtype == np.float32 and np.array_equal(s, np.load('state.npy')), s
assert st.dtype == np.float64 and np.array_equal(st, np.load('state.timestamps.npy')), st
a, at = np.load('OUT_action.npy'), np.load('OUT_action.timestamps.npy')
o = np.load('action.npy')
assert a.dtype == np.float32 and np.array_equal(a, o.astype(np.float32)), a
assert np.array_equal(at, np.arange(len(o)) / 20.0), at
)",
                                   {{"OUT_", Out("ep" + e + "_")}});
    ASSERT_TRUE(err.empty()) << err;

    const std::string text = Out("ep" + e + "_instruction.txt");
    ASSERT_TRUE(RunExtract(Extract(DatasetPath(), ep, "instruction", text)).ok());
    EXPECT_EQ(ReadFile(text), "put the red cup on the plate, episode " + e);

    const std::string frames = Out("ep" + e + "_overhead");
    absl::Status s = RunExtract(Extract(DatasetPath(), ep, "overhead", frames));
    ASSERT_TRUE(s.ok()) << s;
    // Byte for byte the JPEGs ffmpeg wrote (it numbers from 1, extract from 0).
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(ReadFile(frames + "/frame_00000" + std::to_string(i) + ".jpg"),
                ReadFile(In(ep) + "/overhead/00" + std::to_string(i + 1) + ".jpg"));
    }
    EXPECT_FALSE(fs::exists(frames + "/frame_000003.jpg"));
  }
}

TEST_F(ImportExtractTest, ExtractErrorsSayWhatIsWrong) {
  absl::Status s = RunExtract(Extract(DatasetPath(), 0, "depth", Out("x.mp4")));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(s, "'depth'") && Mentions(s, "cam (video)") && Mentions(s, "state (lowdim)"))
      << s;

  s = RunExtract(Extract(DatasetPath(), 2, "cam", Out("x.mp4")));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(Mentions(s, "episode 2") && Mentions(s, "2 episodes")) << s;
  s = RunExtract(Extract(DatasetPath(), -1, "cam", Out("x.mp4")));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);

  const std::string unwritable = "/nonexistent-conveyor-dir/cam.mp4";
  s = RunExtract(Extract(DatasetPath(), 0, "cam", unwritable));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, unwritable)) << s;
  s = RunExtract(Extract(DatasetPath(), 0, "state", "/nonexistent-conveyor-dir/state.npy"));
  EXPECT_TRUE(Mentions(s, "/nonexistent-conveyor-dir/state.npy")) << s;

  // PCM does not fit MP4 audio; the error suggests a container that takes anything.
  s = RunExtract(Extract(DatasetPath(), 0, "mic", Out("mic.m4a")));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "pcm_s16le") && Mentions(s, ".mka")) << s;
  EXPECT_FALSE(fs::exists(Out("mic.m4a")));
  // H.264 does not fit WebM.
  s = RunExtract(Extract(DatasetPath(), 0, "cam", Out("cam.webm")));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "h264") && Mentions(s, ".mkv")) << s;
  EXPECT_FALSE(fs::exists(Out("cam.webm")));
  // The extension must fit the stream kind.
  s = RunExtract(Extract(DatasetPath(), 0, "state", Out("state.mp4")));
  EXPECT_TRUE(Mentions(s, "lowdim") && Mentions(s, ".npy")) << s;

  s = RunExtract(Extract(dir_->Join("no-such-dataset"), 0, "cam", Out("x.mp4")));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// Bad input: each is an error naming the file (or folder) at fault, and leaves no dataset.

class ImportErrorTest : public ::testing::Test {
 protected:
  // The command making a tiny valid H.264 MP4 (moov atom last, as ffmpeg writes by default).
  static std::string Mp4Command(const std::string& path, const std::string& extra = "") {
    return kFfmpeg + " -f lavfi -i testsrc2=size=64x48:rate=30:duration=0.5 -c:v libx264 " +
           "-preset veryfast -bf 2 " + extra + " " + ShellQuote(path);
  }
  std::string Episode(int i) {
    const std::string d = dir_.Join("in/ep_" + std::to_string(i));
    fs::create_directories(d);
    return d;
  }
  absl::Status RunIt() { return RunImport(Import(dir_.Join("in"), dir_.Join("out"))); }
  // A .npy of float32 [rows, cols] with `data_bytes` bytes of data after the header.
  static std::string NpyBytes(int rows, int cols, size_t data_bytes) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                         std::to_string(rows) + ", " + std::to_string(cols) + "), }";
    header.append(64 - (10 + header.size() + 1) % 64, ' ');
    header += '\n';
    std::string out = "\x93NUMPY\x01";
    out += '\0';
    out += static_cast<char>(header.size());
    out += '\0';
    return out + header + std::string(data_bytes, '\0');
  }

  TempDir dir_;
};

TEST_F(ImportErrorTest, RandomBytesNamedMp4) {
  const std::string file = Episode(0) + "/cam.mp4";
  std::string bytes;
  for (int i = 0; i < 8192; ++i) bytes.push_back(static_cast<char>((i * 2654435761u) >> 13));
  WriteFile(file, bytes);
  absl::Status s = RunIt();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, file)) << s;
  EXPECT_FALSE(fs::exists(dir_.Join("out"))) << "a failed import leaves no dataset behind";
}

TEST_F(ImportErrorTest, Mp4TruncatedToHalfIsAnError) {
  // Decision: a truncated file is always an error, never a partial import. Without its moov
  // atom (written last) the file cannot even be opened.
  const std::string full = dir_.Join("full.mp4");
  ASSERT_SH(Mp4Command(full));
  const std::string data = ReadFile(full);
  const std::string file = Episode(0) + "/cam.mp4";
  WriteFile(file, data.substr(0, data.size() / 2));
  absl::Status s = RunIt();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, file)) << s;
}

TEST_F(ImportErrorTest, FaststartMp4TruncatedToHalfIsAnError) {
  // With the moov atom first the file opens, but its index lists packets that are not there.
  const std::string full = dir_.Join("full.mp4");
  ASSERT_SH(Mp4Command(full, "-movflags +faststart"));
  const std::string data = ReadFile(full);
  const std::string file = Episode(0) + "/cam.mp4";
  WriteFile(file, data.substr(0, data.size() / 2));
  absl::Status s = RunIt();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(Mentions(s, file) && Mentions(s, "truncated")) << s;
}

TEST_F(ImportErrorTest, MalformedNpy) {
  const std::string ep = Episode(0);
  WriteFile(ep + "/episode.json", R"({"rates": {"state": 10}})");
  WriteFile(ep + "/state.npy", "this is not a numpy file at all");
  absl::Status s = RunIt();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, ep + "/state.npy") && Mentions(s, "magic")) << s;

  WriteFile(ep + "/state.npy", NpyBytes(10, 3, 10 * 3 * 4 - 7));
  s = RunIt();
  EXPECT_TRUE(Mentions(s, ep + "/state.npy") && Mentions(s, "truncated")) << s;

  WriteFile(ep + "/state.npy", NpyBytes(10, 3, 10 * 3 * 4));  // the same, whole: imports
  s = RunIt();
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(ImportErrorTest, TimestampsMustMatchTheSteps) {
  const std::string ep = Episode(0);
  WriteFile(ep + "/state.npy", NpyBytes(10, 3, 10 * 3 * 4));
  // float32 [9]: one timestamp short.
  std::string ts = NpyBytes(9, 1, 9 * 4);
  ts.replace(ts.find("(9, 1)"), 6, "(9,)  ");
  WriteFile(ep + "/state.timestamps.npy", ts);
  absl::Status s = RunIt();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, ep + "/state.timestamps.npy") && Mentions(s, "9 timestamps") &&
              Mentions(s, "10 steps"))
      << s;
}

TEST_F(ImportErrorTest, NpyNeedsTimestampsOrARate) {
  const std::string ep = Episode(0);
  WriteFile(ep + "/state.npy", NpyBytes(10, 3, 10 * 3 * 4));
  absl::Status s = RunIt();
  EXPECT_TRUE(Mentions(s, ep + "/state.npy") && Mentions(s, "state.timestamps.npy") &&
              Mentions(s, "rates"))
      << s;
}

TEST_F(ImportErrorTest, EmptyInputAndEmptyEpisode) {
  fs::create_directories(dir_.Join("in"));
  absl::Status s = RunIt();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "no episode folders") && Mentions(s, dir_.Join("in"))) << s;

  const std::string ep = Episode(0);
  s = RunIt();
  EXPECT_TRUE(Mentions(s, ep) && Mentions(s, "no streams")) << s;

  s = RunImport(Import(dir_.Join("missing"), dir_.Join("out")));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(s, dir_.Join("missing"))) << s;
}

TEST_F(ImportErrorTest, EpisodesNeedTheSameStreams) {
  for (int i = 0; i < 2; ++i) {
    const std::string ep = Episode(i);
    WriteFile(ep + "/state.npy", NpyBytes(10, 3, 10 * 3 * 4));
    WriteFile(ep + "/episode.json", i == 0 ? R"({"instruction": "go", "rates": {"state": 10}})"
                                           : R"({"rates": {"state": 10}})");
  }
  absl::Status s = RunIt();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, Episode(1)) && Mentions(s, "missing instruction")) << s;
  EXPECT_FALSE(fs::exists(dir_.Join("out")));

  // The same names, but a different dimension.
  WriteFile(Episode(1) + "/episode.json", R"({"instruction": "go", "rates": {"state": 10}})");
  WriteFile(Episode(1) + "/state.npy", NpyBytes(10, 4, 10 * 4 * 4));
  s = RunIt();
  EXPECT_TRUE(Mentions(s, Episode(1)) && Mentions(s, "lowdim zstd-shuffle4 [4]") &&
              Mentions(s, "lowdim zstd-shuffle4 [3]"))
      << s;
}

TEST_F(ImportErrorTest, BadEpisodeJsonAndClashingNames) {
  const std::string ep = Episode(0);
  WriteFile(ep + "/state.npy", NpyBytes(10, 3, 10 * 3 * 4));
  WriteFile(ep + "/episode.json", R"({"rates": {"state": 10}, )");
  absl::Status s = RunIt();
  EXPECT_TRUE(Mentions(s, ep + "/episode.json") && Mentions(s, "JSON")) << s;

  WriteFile(ep + "/episode.json", R"({"rates": {"state": -1}})");
  s = RunIt();
  EXPECT_TRUE(Mentions(s, ep + "/episode.json") && Mentions(s, "rates.state")) << s;

  WriteFile(ep + "/episode.json", R"({"rates": {"state": 10}})");
  WriteFile(ep + "/state.wav", "never opened: the name clash is found first");
  s = RunIt();
  EXPECT_TRUE(Mentions(s, ep + "/state.wav") && Mentions(s, ep + "/state.npy") &&
              Mentions(s, "'state'"))
      << s;
}

TEST_F(ImportErrorTest, RotationSurvivesTheRoundTrip) {
  // ffmpeg 5.1 turns the rotate tag into a display matrix only when stream copying.
  const std::string plain = dir_.Join("plain.mp4");
  ASSERT_SH(Mp4Command(plain));
  const std::string original = Episode(0) + "/cam.mp4";
  ASSERT_SH(kFfmpeg + " -i " + ShellQuote(plain) + " -c copy -metadata:s:v rotate=90 " +
            ShellQuote(original));
  const std::string want = Probe(original, "stream_side_data=rotation");
  ASSERT_FALSE(want.empty());
  ASSERT_TRUE(RunIt().ok());
  const std::string out = dir_.Join("cam.mp4");
  absl::Status s = RunExtract(Extract(dir_.Join("out"), 0, "cam", out));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Probe(out, "stream_side_data=rotation"), want);
  // Stored counter-clockwise, as av_display_rotation_get (and ffprobe) report it.
  auto ds = Dataset::Open(dir_.Join("out"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto index = (*ds)->LoadEpisode(0);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->streams(0).codec().rotation_deg(), std::stod(want));
  EXPECT_EQ(FrameMd5s(out, "v"), FrameMd5s(original, "v"));
}

}  // namespace
}  // namespace conveyor::tools
