// `conveyor synth`, `inspect` and `extract` through the real binary, checked with ffprobe,
// `ffmpeg -f framemd5` and the documented action function.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "format/npy.h"
#include "tests/support/media_checks.h"
#include "tests/support/nginx_server.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using json = nlohmann::json;
using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

const std::string kCli = CONVEYOR_CLI;

CommandResult Cli(const std::string& args, int timeout_s = 300) {
  return RunCommand(kCli + " " + args, timeout_s);
}

// Runs synth and fails the test on error.
void Synth(const std::string& out, const std::string& args) {
  CommandResult r = Cli("synth --quiet --out " + ShellQuote(out) + " " + args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

json Inspect(const std::string& dataset) {
  CommandResult r = Cli("inspect --json " + ShellQuote(dataset));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return json::parse(r.output, nullptr, false);
}

std::string Probe(const std::string& file, const std::string& entries) {
  CommandResult r = RunCommand("ffprobe -v error -count_frames -select_streams 0 -show_entries stream=" +
                               entries + " -of csv=p=0 " + ShellQuote(file), 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  while (!r.output.empty() && (r.output.back() == '\n' || r.output.back() == ',')) r.output.pop_back();
  return r.output;
}

const json* FindStream(const json& j, const std::string& name) {
  for (const json& s : j["streams"]) {
    if (s["name"] == name) return &s;
  }
  return nullptr;
}

TEST(SynthCli, InspectJsonDescribesTheDataset) {
  TempDir dir;
  const std::string ds = dir.Join("ds");
  Synth(ds, "--episodes 3 --episode-seconds 1:2 --size 64x48 --episodes-per-shard 2 --seed 3");
  json j = Inspect(ds);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["episodes"], 3);
  EXPECT_EQ(j["shards"], 2);
  EXPECT_GT(j["bytes"].get<int64_t>(), 10000);
  ASSERT_EQ(j["streams"].size(), 7u);  // cam0..2, audio, state, action, instruction
  const json* cam = FindStream(j, "cam1");
  ASSERT_NE(cam, nullptr);
  EXPECT_EQ((*cam)["kind"], "video");
  EXPECT_EQ((*cam)["codec"], "h264");
  EXPECT_EQ((*cam)["shape"], json::array({48, 64, 3}));
  EXPECT_EQ((*FindStream(j, "audio"))["codec"], "aac");
  EXPECT_EQ((*FindStream(j, "observation.state"))["kind"], "lowdim");
  EXPECT_EQ((*FindStream(j, "action"))["shape"], json::array({14}));
  EXPECT_EQ((*FindStream(j, "instruction"))["kind"], "text");
  EXPECT_EQ(j["stats"]["action"]["mean"].size(), 14u);
  // The human-readable form and --verify also work.
  CommandResult text = Cli("inspect --verify " + ShellQuote(ds));
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("every packet, block and index checksum matches"), std::string::npos);
  EXPECT_NE(text.output.find("observation.state"), std::string::npos);
}

// `--preset video-model`: 720p clips of 2-5 s with captions of varying length for video world
// models; flags given explicitly win; examples/video_model.yaml packs its clips.
TEST(SynthCli, VideoModelPresetMakesCaptioned720pClips) {
  TempDir dir;
  const std::string ds = dir.Join("clips");
  Synth(ds, "--preset video-model --episodes 8 --episode-seconds 1");  // short clips: a fast test
  json j = Inspect(ds);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["episodes"], 8);
  EXPECT_EQ(FindStream(j, "cam1"), nullptr);
  EXPECT_EQ(FindStream(j, "audio"), nullptr);
  const json* cam = FindStream(j, "cam0");
  ASSERT_NE(cam, nullptr);
  EXPECT_EQ((*cam)["shape"], json::array({720, 1280, 3}));
  EXPECT_EQ((*cam)["rate"], 24.0);
  std::set<size_t> lengths;
  for (int e = 0; e < 4; ++e) {
    const std::string out = dir.Join("caption" + std::to_string(e) + ".txt");
    CommandResult r = Cli("extract " + ShellQuote(ds) + " --episode " + std::to_string(e) +
                          " --stream instruction --out " + ShellQuote(out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string caption = testing::ReadFile(out);
    EXPECT_EQ(caption.rfind("Seen from ", 0), 0u) << caption;
    EXPECT_NE(caption.find("a robot arm reaches to "), std::string::npos) << caption;
    lengths.insert(caption.size());
  }
  EXPECT_GT(lengths.size(), 1u) << "captions of one length: nothing to pack";
  // An explicit flag beats the preset.
  Synth(dir.Join("two"), "--preset video-model --episodes 1 --episode-seconds 1 --cameras 2 --size 320x180");
  json two = Inspect(dir.Join("two"));
  ASSERT_NE(FindStream(two, "cam1"), nullptr);
  EXPECT_EQ((*FindStream(two, "cam0"))["shape"], json::array({180, 320, 3}));
  // The video model's config: one 49-frame clip per video (all 8 padded: 1 s videos), packed.
  CommandResult b = Cli("batches " + ShellQuote(ds) + " --config " +
                        ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/examples/video_model.yaml") +
                        " --steps 1 --stats");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("packing fill ratio"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("8 episode(s) of"), std::string::npos) << b.output;  // short: counted
  CommandResult bad = Cli("synth --quiet --out " + ShellQuote(dir.Join("bad2")) + " --preset film");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--preset"), std::string::npos) << bad.output;
}

TEST(SynthCli, ExtractedVideoIsStandardAndFrameExact) {
  TempDir dir;
  const std::string ds = dir.Join("ds");
  Synth(ds, "--episodes 1 --episode-seconds 2.5 --size 96x64 --cameras 1 --gop 15");
  json j = Inspect(ds);
  const int64_t frames = (*FindStream(j, "cam0"))["total_frames"];
  EXPECT_EQ(frames, 75);  // 2.5 s at 30 fps
  const std::string mp4 = dir.Join("cam0.mp4"), mkv = dir.Join("cam0.mkv");
  for (const std::string& out : {mp4, mkv}) {
    CommandResult r = Cli("extract " + ShellQuote(ds) + " --episode 0 --stream cam0 --out " + ShellQuote(out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_EQ(Probe(mp4, "codec_name,width,height,nb_read_frames"), "h264,96,64,75");
  // Keyframes every 15 frames (GOP), as requested.
  CommandResult keys = RunCommand("ffprobe -v error -select_streams v:0 -skip_frame nokey -show_entries "
                                  "frame=pts -of csv=p=0 " + ShellQuote(mp4) + " | grep -c '[0-9]'");
  EXPECT_EQ(std::stoi(keys.output), 5);
  // Both containers decode to the same 75 frames.
  std::vector<std::string> a = testing::FrameMd5s(mp4), b = testing::FrameMd5s(mkv);
  EXPECT_EQ(a.size(), 75u);
  EXPECT_EQ(a, b);
  // Audio and arrays come out as standard files too.
  ASSERT_EQ(Cli("extract " + ShellQuote(ds) + " --episode 0 --stream audio --out " + ShellQuote(dir.Join("a.m4a"))).exit_code, 0);
  EXPECT_EQ(Probe(dir.Join("a.m4a"), "codec_name,sample_rate,channels"), "aac,16000,1");
}

// Decodes every frame of `file` to RGB and returns each frame's mean colour in [0, 1].
std::vector<std::array<double, 3>> MeanColours(const std::string& file, int w, int h) {
  TempDir tmp;
  const std::string raw = tmp.Join("f.rgb");
  CommandResult r = RunCommand("ffmpeg -v error -i " + ShellQuote(file) +
                               " -f rawvideo -pix_fmt rgb24 " + ShellQuote(raw), 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::string bytes = testing::ReadFile(raw);
  const size_t frame = static_cast<size_t>(w) * h * 3;
  std::vector<std::array<double, 3>> means;
  for (size_t at = 0; at + frame <= bytes.size(); at += frame) {
    double sum[3] = {0, 0, 0};
    for (size_t i = 0; i < frame; ++i) sum[i % 3] += static_cast<uint8_t>(bytes[at + i]);
    means.push_back({sum[0] / (frame / 3) / 255.0, sum[1] / (frame / 3) / 255.0, sum[2] / (frame / 3) / 255.0});
  }
  return means;
}

TEST(SynthCli, ActionsAreTheDocumentedFunctionOfStateAndFrames) {
  TempDir dir;
  const std::string ds = dir.Join("ds");
  Synth(ds, "--episodes 1 --episode-seconds 2 --size 64x64 --cameras 2 --audio-codec none --seed 11");
  std::vector<std::vector<std::array<double, 3>>> means;
  for (int c = 0; c < 2; ++c) {
    const std::string out = dir.Join("cam" + std::to_string(c) + ".mkv");
    ASSERT_EQ(Cli("extract " + ShellQuote(ds) + " --episode 0 --stream cam" + std::to_string(c) +
                  " --out " + ShellQuote(out)).exit_code, 0);
    means.push_back(MeanColours(out, 64, 64));
    ASSERT_EQ(means.back().size(), 60u);
  }
  for (const char* s : {"observation.state", "action"}) {
    ASSERT_EQ(Cli("extract " + ShellQuote(ds) + " --episode 0 --stream " + s + " --out " +
                  ShellQuote(dir.Join(std::string(s) + ".npy"))).exit_code, 0);
  }
  auto state = ReadNpy(dir.Join("observation.state.npy"));
  auto action = ReadNpy(dir.Join("action.npy"));
  auto ts = ReadNpy(dir.Join("action.timestamps.npy"));
  ASSERT_TRUE(state.ok() && action.ok() && ts.ok());
  ASSERT_EQ(action->shape, (std::vector<int64_t>{100, 14}));
  ASSERT_EQ(ts->shape, (std::vector<int64_t>{100}));
  double worst = 0, spread = 0;
  for (int i = 0; i < 100; ++i) {
    EXPECT_NEAR(ts->values[i], i / 50.0, 1e-6);
    const int k = std::min(59, static_cast<int>(std::floor(i / 50.0 * 30 + 1e-9)));
    for (int j = 0; j < 14; ++j) {
      const double want = 0.5 * state->values[i * 14 + j] + means[j % 2][k][(j / 2) % 3] - 0.5;
      worst = std::max(worst, std::abs(want - action->values[i * 14 + j]));
      spread = std::max(spread, static_cast<double>(std::abs(action->values[i * 14 + j])));
    }
  }
  // Decoded means differ from the pre-encoding means by compression error only.
  EXPECT_LT(worst, 0.02);
  EXPECT_GT(spread, 0.1);  // and the actions are not trivially zero
}

TEST(SynthCli, SameSeedSameBytesAtAnyThreadCount) {
  TempDir dir;
  Synth(dir.Join("a"), "--episodes 4 --episode-seconds 1 --size 32x32 --seed 5 --threads 1");
  Synth(dir.Join("b"), "--episodes 4 --episode-seconds 1 --size 32x32 --seed 5 --threads 2");
  Synth(dir.Join("c"), "--episodes 4 --episode-seconds 1 --size 32x32 --seed 6 --threads 2");
  const std::string shard = "/shards/shard-000000.cvs";
  // Compare digests, not the bytes: a failure must not print a megabyte of binary.
  EXPECT_EQ(std::hash<std::string>()(testing::ReadFile(dir.Join("a") + shard)),
            std::hash<std::string>()(testing::ReadFile(dir.Join("b") + shard)));
  EXPECT_EQ(Inspect(dir.Join("a"))["fingerprint"], Inspect(dir.Join("b"))["fingerprint"]);
  EXPECT_NE(Inspect(dir.Join("a"))["fingerprint"], Inspect(dir.Join("c"))["fingerprint"]);
}

TEST(SynthCli, OtherCodecs) {
  struct Case {
    std::string args, stream, codec;
  };
  const std::vector<Case> cases = {
      {"--video-codec hevc --audio-codec flac", "cam0", "hevc"},
      {"--video-codec vp9 --audio-codec opus --audio-rate 48000", "cam0", "vp9"},
      {"--video-codec av1 --audio-codec none", "cam0", "av1"},
      {"--video-codec vp9 --audio-codec opus --audio-rate 48000", "audio", "opus"},
      {"--video-codec hevc --audio-codec flac", "audio", "flac"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    TempDir dir;
    Synth(dir.Join("ds"), "--episodes 1 --episode-seconds 1 --size 64x64 --cameras 1 " + c.args);
    json j = Inspect(dir.Join("ds"));
    ASSERT_NE(FindStream(j, c.stream), nullptr);
    EXPECT_EQ((*FindStream(j, c.stream))["codec"], c.codec);
    const std::string out = dir.Join("x.mkv");
    ASSERT_EQ(Cli("extract " + ShellQuote(dir.Join("ds")) + " --episode 0 --stream " + c.stream +
                  " --out " + ShellQuote(out)).exit_code, 0);
    EXPECT_EQ(Probe(out, "codec_name"), c.codec);
    EXPECT_FALSE(testing::FrameMd5s(out, c.stream == "audio" ? "a" : "v").empty());
  }
}

TEST(SynthCli, DatasetServedByNginxReadsLikeTheLocalOne) {
  TempDir dir;
  const std::string ds = dir.Join("ds");
  Synth(ds, "--episodes 3 --episode-seconds 1:2 --size 64x48 --episodes-per-shard 2 --seed 9");
  auto nginx = testing::NginxServer::Start(dir.path());
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  const std::string url = (*nginx)->base_url() + "ds/";
  // Every checksum of every shard, over HTTP range reads.
  CommandResult verify = Cli("inspect --verify --json " + url);
  ASSERT_EQ(verify.exit_code, 0) << verify.output;
  json remote = json::parse(verify.output.substr(verify.output.find('{')), nullptr, false);
  EXPECT_EQ(remote["fingerprint"], Inspect(ds)["fingerprint"]);
  EXPECT_EQ(remote["verified"], true);
  const std::string local_mp4 = dir.Join("local.mp4"), remote_mp4 = dir.Join("remote.mp4");
  ASSERT_EQ(Cli("extract " + ds + " --episode 2 --stream cam1 --out " + local_mp4).exit_code, 0);
  CommandResult r = Cli("extract " + url + " --episode 2 --stream cam1 --out " + remote_mp4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::FrameMd5s(local_mp4), testing::FrameMd5s(remote_mp4));
  // A missing dataset under a live server names the URL.
  CommandResult missing = Cli("inspect " + (*nginx)->base_url() + "nope/");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find((*nginx)->base_url() + "nope/"), std::string::npos) << missing.output;
}

TEST(SynthCli, BadFlagsAndMissingDatasetsGiveClearErrors) {
  TempDir dir;
  struct Case {
    std::string args;
    int code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"synth --episodes 2", 2, "--out"},
      {"synth --out " + dir.Join("x") + " --size 12x", 2, "--size '12x'"},
      {"synth --out " + dir.Join("x") + " --size 33x32", 2, "must be even"},
      {"synth --out " + dir.Join("x") + " --video-codec mpeg7", 2, "mpeg7"},
      {"synth --out " + dir.Join("x") + " --episodes 0", 2, "--episodes"},
      {"synth --out " + dir.Join("x") + " --episodes many", 2, "many"},
      {"synth --out " + dir.Join("x") + " --episode-seconds 5:1", 2, "--episode-seconds"},
      {"frobnicate", 2, "frobnicate"},
      {"inspect " + dir.Join("nothing-here"), 1, "no Conveyor dataset at"},
      {"inspect http://127.0.0.1:9/ds/", 1, "127.0.0.1:9"},
      {"inspect s3://bucket/ds", 1, "S3"},
  };
  for (const Case& c : cases) {
    CommandResult r = Cli(c.args, 60);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
  // Synth refuses to write into a non-empty directory.
  testing::WriteFile(dir.Join("keep.txt"), "x");
  CommandResult r = Cli("synth --quiet --out " + dir.path() + " --episodes 1 --episode-seconds 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("not empty"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace conveyor
