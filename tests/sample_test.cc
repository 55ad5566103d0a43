// Sample assembly end to end: frames equal the ffmpeg CLI's, windows and padding as documented in
// docs/sampling.md, augmentation a pure function of (seed, epoch, index), identical bytes at 1 and
// 2 threads, clear errors for bad configs and bad media (fail or counted skip).
#include "sample/sample_assembler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "sample/augment.h"
#include "datasets/dataset.h"
#include "format/dataset_writer.h"
#include "format/npy.h"
#include "tests/support/media_checks.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using testing::FrameMd5s;
using testing::Md5Hex;
using testing::ReadFile;
using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;
using testing::WriteFile;

const std::string kCli = CONVEYOR_CLI;

// One small synthetic dataset for the whole suite: 2 episodes of 3 s, 2 cameras 96x64 at 30 fps
// (GOP 30, B-frames), 16 kHz AAC, 14-dim state and action at 50 Hz.
class SampleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = RunCommand(kCli + " synth --quiet --out " + ShellQuote(ds()) +
                        " --episodes 2 --episode-seconds 3 --cameras 2 --size 96x64 --seed 3");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string ds() { return dir_->Join("ds"); }

  void Open(const std::string& yaml, CropMethod crop_method = CropMethod::kInDecoder) {
    auto d = Dataset::Open(ds());
    ASSERT_TRUE(d.ok()) << d.status();
    dataset = std::move(*d);
    auto s = SampleSpec::FromYaml(yaml, dataset->manifest(), "test.yaml");
    ASSERT_TRUE(s.ok()) << s.status();
    spec = std::move(*s);
    EXPECT_EQ(spec.crop_method, CropMethod::kInDecoder) << "what a spec gets outside a pipeline";
    spec.crop_method = crop_method;
    auto i = SampleIndex::Build(*dataset, spec.anchor_stream);
    ASSERT_TRUE(i.ok()) << i.status();
    index = std::move(*i);
    assembler = std::make_unique<SampleAssembler>(*dataset, spec, index);
  }

  // The ffmpeg CLI's RGB frames of one episode's camera (extracted to mp4), as MD5s.
  static void CliFrameMd5s(int episode, const std::string& stream, std::vector<std::string>* md5s) {
    TempDir out;
    const std::string mp4 = out.Join(stream + ".mp4");
    auto r = RunCommand(kCli + " extract " + ShellQuote(ds()) + " --episode " + std::to_string(episode) +
                        " --stream " + stream + " --out " + ShellQuote(mp4));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    *md5s = FrameMd5s(mp4, "v", "-pix_fmt rgb24");
  }

  static TempDir* dir_;
  std::unique_ptr<Dataset> dataset;
  SampleSpec spec;
  SampleIndex index;
  std::unique_ptr<SampleAssembler> assembler;
};
TempDir* SampleTest::dir_ = nullptr;

TEST_F(SampleTest, IndexCountsAnchorSteps) {
  Open("streams: {action: {}}");
  // 3 s at 50 Hz per episode.
  EXPECT_EQ(index.size(), 300u);
  EXPECT_EQ(index.Locate(0, 0).episode, 0u);
  EXPECT_EQ(index.Locate(149, 0).step, 149u);
  EXPECT_EQ(index.Locate(150, 0).episode, 1u);
  EXPECT_EQ(index.Locate(150, 0).step, 0u);
  auto past = assembler->Assemble(300, 0, 0);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(SampleTest, FramesEqualTheFfmpegCliAndPadAtTheStart) {
  Open("streams:\n  cam0: {delta_timestamps: [-0.1, 0.0]}\n  cam1: {}\n");
  std::vector<std::string> golden;
  ASSERT_NO_FATAL_FAILURE(CliFrameMd5s(1, "cam0", &golden));
  ASSERT_EQ(golden.size(), 90u);
  const uint64_t first = index.EpisodeStart(1);
  // Anchor steps of episode 1 at 50 Hz; the camera runs at 30 fps: nearest frames.
  for (uint32_t step : {0u, 1u, 2u, 3u, 4u, 5u, 17u, 50u, 101u, 149u, 75u, 74u}) {
    auto s = assembler->Assemble(first + step, 0, 0);
    ASSERT_TRUE(s.ok()) << s.status();
    const OwnedTensor* cam = s->Find("cam0");
    const OwnedTensor* pad = s->Find("cam0_is_pad");
    ASSERT_NE(cam, nullptr);
    ASSERT_EQ(cam->shape, (std::vector<int64_t>{2, 64, 96, 3}));
    const double t = step / 50.0;
    for (int i = 0; i < 2; ++i) {
      const double q = t + (i == 0 ? -0.1 : 0.0);
      // Padding: more than the tolerance (half a frame) outside [0, 89/30].
      const double tol = 0.5 / 30 + 1e-6;
      const bool expect_pad = q < -tol || q > 89 / 30.0 + tol;
      const long k = std::min(89L, std::lround(std::max(q, 0.0) * 30.0));  // nearest frame
      EXPECT_EQ(pad->data[i], expect_pad ? 1 : 0) << "step " << step;
      EXPECT_EQ(Md5Hex(cam->data.data() + i * 64 * 96 * 3, 64 * 96 * 3), golden[k])
          << "step " << step << " entry " << i << " frame " << k;
    }
  }
}

// Anchored at the 50 Hz actions, one frame of a 30 fps camera per sample: consecutive samples ask
// for the same frame about every other step. Read in order, each frame is still decoded about once
// (the decoder keeps the frames it just passed instead of seeking back to the keyframe), and the
// frames are the CLI's.
TEST_F(SampleTest, SamplesFasterThanTheCameraDecodeEachFrameOnceInOrder) {
  Open("anchor: action\nstreams:\n  cam1: {}\n  action: {}\n");
  std::vector<std::string> golden;
  ASSERT_NO_FATAL_FAILURE(CliFrameMd5s(1, "cam1", &golden));
  ASSERT_EQ(golden.size(), 90u);
  const uint64_t first = index.EpisodeStart(1);
  for (uint32_t step = 0; step < 150; ++step) {
    auto s = assembler->Assemble(first + step, 0, 0);
    ASSERT_TRUE(s.ok()) << s.status();
    const OwnedTensor* cam = s->Find("cam1");
    ASSERT_NE(cam, nullptr);
    const long k = std::min(89L, std::lround(step / 50.0 * 30.0));
    ASSERT_EQ(Md5Hex(cam->data.data(), 64 * 96 * 3), golden[k]) << "step " << step;
  }
  // 90 frames shown; B-frame reordering and the first GOP's references may add a few. Seeking
  // back for every repeated frame decoded about 15 frames per repeat (over 900 in all).
  EXPECT_LE(assembler->stats().frames_decoded, 120u);
  EXPECT_EQ(assembler->stats().frames_delivered, 150u);
}

TEST_F(SampleTest, LowdimWindowsMatchTheStoredStepsAndPadAtTheEnd) {
  Open(
      "streams:\n"
      "  observation.state: {}\n"
      "  action: {delta_timestamps: {start: 0.0, step: 0.02, count: 50}}\n");
  TempDir out;
  auto r = RunCommand(kCli + " extract " + ShellQuote(ds()) + " --episode 0 --stream action --out " +
                      ShellQuote(out.Join("action.npy")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto actions = ReadNpy(out.Join("action.npy"));
  ASSERT_TRUE(actions.ok()) << actions.status();
  ASSERT_EQ(actions->shape, (std::vector<int64_t>{150, 14}));
  for (uint32_t step : {0u, 60u, 100u, 120u, 149u}) {
    auto s = assembler->Assemble(step, 0, 0);
    ASSERT_TRUE(s.ok()) << s.status();
    const OwnedTensor* a = s->Find("action");
    const OwnedTensor* pad = s->Find("action_is_pad");
    ASSERT_EQ(a->shape, (std::vector<int64_t>{50, 14}));
    const float* v = reinterpret_cast<const float*>(a->data.data());
    for (int i = 0; i < 50; ++i) {
      const uint32_t want = std::min<uint32_t>(step + i, 149);
      EXPECT_EQ(pad->data[i], step + i > 149 ? 1 : 0) << step << "+" << i;
      for (int d = 0; d < 14; ++d) {
        ASSERT_EQ(v[i * 14 + d], actions->values[want * 14 + d]) << step << "+" << i;
      }
    }
  }
}

TEST_F(SampleTest, NormalizationUsesTheManifestStatistics) {
  Open("streams:\n  action: {normalize: mean_std}\n  observation.state: {normalize: min_max}\n");
  auto s = assembler->Assemble(42, 0, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  Open("streams:\n  action: {}\n  observation.state: {}\n");
  auto raw = assembler->Assemble(42, 0, 0);
  ASSERT_TRUE(raw.ok());
  const auto& stats = dataset->manifest().stats;
  const float* n = reinterpret_cast<const float*>(s->Find("action")->data.data());
  const float* x = reinterpret_cast<const float*>(raw->Find("action")->data.data());
  const float* ns = reinterpret_cast<const float*>(s->Find("observation.state")->data.data());
  const float* xs = reinterpret_cast<const float*>(raw->Find("observation.state")->data.data());
  const StreamStats& a = stats.at("action");
  const StreamStats& st = stats.at("observation.state");
  for (int d = 0; d < 14; ++d) {
    EXPECT_NEAR(n[d], (x[d] - a.mean[d]) / (a.std[d] + 1e-8), 1e-4);
    EXPECT_NEAR(ns[d], 2 * (xs[d] - st.min[d]) / (st.max[d] - st.min[d] + 1e-8) - 1, 1e-4);
    EXPECT_GE(ns[d], -1.0001f);
    EXPECT_LE(ns[d], 1.0001f);
  }
}

TEST_F(SampleTest, AudioWindowPadsBeforeTheStart) {
  Open("streams:\n  audio: {delta_timestamps: [-1.0, 0.0], rate: 8000}\n");
  auto s = assembler->Assemble(15, 0, 0);  // t = 0.3 s
  ASSERT_TRUE(s.ok()) << s.status();
  const OwnedTensor* a = s->Find("audio");
  const OwnedTensor* pad = s->Find("audio_is_pad");
  ASSERT_EQ(a->shape, (std::vector<int64_t>{8000, 1}));
  ASSERT_EQ(pad->shape, (std::vector<int64_t>{8000}));
  size_t padded = 0;
  for (uint8_t p : pad->data) padded += p;
  EXPECT_NEAR(static_cast<double>(padded), 0.7 * 8000, 2);
  const float* v = reinterpret_cast<const float*>(a->data.data());
  for (size_t i = 0; i < 5000; ++i) ASSERT_EQ(v[i], 0.0f) << i;
  double energy = 0;
  for (size_t i = 6000; i < 8000; ++i) energy += v[i] * v[i];
  EXPECT_GT(energy, 0.0) << "the real part of the window is silent";
}

TEST_F(SampleTest, ToleranceErrorNamesEpisodeStreamAndTime) {
  Open("tolerance_s: 0.0001\nstreams:\n  cam0: {}\n");
  auto s = assembler->Assemble(index.EpisodeStart(1) + 1, 0, 0);  // t = 0.02: 13 ms from a frame
  ASSERT_FALSE(s.ok());
  const std::string msg(s.status().message());
  EXPECT_NE(msg.find("episode 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stream 'cam0'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("t=0.02"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shard-000000.cvs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tolerance_s"), std::string::npos) << msg;
  // A frame time itself is fine (step 5 = 0.1 s = frame 3).
  EXPECT_TRUE(assembler->Assemble(5, 0, 0).ok());
}

TEST_F(SampleTest, AugmentationIsAPureFunctionOfSeedEpochAndIndex) {
  const std::string yaml =
      "streams:\n"
      "  cam0:\n"
      "    delta_timestamps: [0.0, 0.0]\n"
      "    size: [48, 48]\n"
      "    augment:\n"
      "      random_resized_crop: {scale: [0.3, 0.6]}\n"
      "      hflip: 0.5\n"
      "      color_jitter: {brightness: 0.4, contrast: 0.4, saturation: 0.4}\n";
  Open(yaml);
  auto a = assembler->Assemble(77, 5, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  // Decoding other samples first changes nothing.
  Open(yaml);
  for (uint64_t i : {3u, 200u, 78u}) ASSERT_TRUE(assembler->Assemble(i, 5, 2).ok());
  auto b = assembler->Assemble(77, 5, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->Find("cam0")->data, b->Find("cam0")->data);
  // Both entries are the same frame, so the same crop/flip/jitter gives the same pixels.
  const auto& px = a->Find("cam0")->data;
  const size_t one = 48 * 48 * 3;
  EXPECT_TRUE(std::equal(px.begin(), px.begin() + one, px.begin() + one));
  // Another epoch or seed draws differently.
  auto c = assembler->Assemble(77, 5, 3);
  auto d = assembler->Assemble(77, 6, 2);
  ASSERT_TRUE(c.ok() && d.ok());
  EXPECT_NE(a->Find("cam0")->data, c->Find("cam0")->data);
  EXPECT_NE(a->Find("cam0")->data, d->Find("cam0")->data);
}

// CropMethod::kInDecoder (pipeline version 4): a video stream's random resized crop is cut from
// the decoded planes and converted to the output size in one libswscale pass, so a sample's frame
// equals `ffmpeg -vf crop=W:H:X:Y,scale=OW:OH:flags=F -pix_fmt rgb24` of the same frame, the crop
// being the one drawn from (seed, epoch, sample). An odd X, Y, W or H is rounded down to even as
// the CLI's crop filter does (4:2:0). A flip mirrors that output; the crop itself is the same draw.
TEST_F(SampleTest, CropInDecoderEqualsTheCliCropAndScale) {
  const std::string base =
      "anchor: cam0\n"
      "streams:\n"
      "  cam0:\n"
      "    delta_timestamps: [0.0]\n"
      "    size: [40, 48]\n";
  const std::string crop = "      random_resized_crop: {scale: [0.2, 0.7], ratio: [0.5, 2.0]}\n";
  TempDir out;
  const std::string mp4 = out.Join("cam0.mp4");
  auto r = RunCommand(kCli + " extract " + ShellQuote(ds()) + " --episode 0 --stream cam0 --out " +
                      ShellQuote(mp4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const uint64_t epoch = 1, seed = 9;
  int checked = 0;
  for (const char* filter : {"bilinear", "bicubic"}) {
    const std::string yaml = base + "    resize: " + filter + "\n    augment:\n" + crop;
    Open(yaml);
    auto draw = [&](uint64_t sample) {
      SampleRng rng(seed, epoch, sample, static_cast<uint64_t>(spec.streams[0].stream));
      return DrawImageAugment(spec.streams[0].augment, 96, 64, &rng);
    };
    // Samples (frames of episode 0) whose boxes have an odd x, y, width and height, so that the
    // rounding to the chroma grid is exercised on each.
    std::vector<uint64_t> samples = {42};
    for (int part = 0; part < 4; ++part) {
      uint64_t k = 0;
      while (k < 90) {
        const ImageDraw d = draw(k);
        if ((part == 0 ? d.x : part == 1 ? d.y : part == 2 ? d.w : d.h) % 2 == 1) break;
        ++k;
      }
      ASSERT_LT(k, 90u) << "no box with an odd " << "xywh"[part] << " among 90 draws";
      samples.push_back(k);
    }
    for (uint64_t sample : samples) {
      auto got = assembler->Assemble(sample, seed, epoch);
      ASSERT_TRUE(got.ok()) << got.status();
      const OwnedTensor* cam = got->Find("cam0");
      ASSERT_EQ(cam->shape, (std::vector<int64_t>{1, 40, 48, 3}));
      const ImageDraw d = draw(sample);
      ASSERT_TRUE(d.crop);
      // The CLI's frames of the whole episode with that crop; anchored at the camera, sample k of
      // episode 0 is frame k.
      const std::vector<std::string> golden = FrameMd5s(
          mp4, "v",
          StrCat("-vf crop=", d.w, ":", d.h, ":", d.x, ":", d.y, ",scale=48:40:flags=", filter,
                 " -pix_fmt rgb24"));
      ASSERT_EQ(golden.size(), 90u);
      EXPECT_EQ(Md5Hex(cam->data.data(), cam->data.size()), golden[sample])
          << filter << ": sample " << sample << ", crop " << d.w << "x" << d.h << " at (" << d.x
          << ", " << d.y << ")";
      ++checked;
    }
    // hflip: 1.0 draws the same crop (the flip is drawn after it) and mirrors the output.
    Open(base + "    resize: " + filter + "\n    augment:\n" + crop + "      hflip: 1.0\n");
    auto flipped = assembler->Assemble(42, 9, 1);
    Open(yaml);
    auto plain = assembler->Assemble(42, 9, 1);
    ASSERT_TRUE(flipped.ok() && plain.ok());
    const auto& f = flipped->Find("cam0")->data;
    const auto& p = plain->Find("cam0")->data;
    for (int y = 0; y < 40; ++y) {
      for (int x = 0; x < 48; ++x) {
        for (int c = 0; c < 3; ++c) {
          ASSERT_EQ(f[(y * 48 + x) * 3 + c], p[(y * 48 + (47 - x)) * 3 + c]) << filter;
        }
      }
    }
  }
  EXPECT_EQ(checked, 10);
}

// CropMethod::kFromRgb (pipeline versions 1 to 3, what a resumed job of those versions gets): the
// frame at full size in RGB (the CLI's), then Conveyor's triangle filter over the drawn box, as
// before version 4: bit for bit the same as recomputing it here from the full frame. The two
// methods give different pixels (a job cannot switch between them mid-run).
TEST_F(SampleTest, CropFromRgbKeepsTheBitsOfVersionsBeforeFour) {
  const std::string yaml =
      "anchor: cam0\n"
      "streams:\n"
      "  cam0:\n"
      "    delta_timestamps: [-0.1, 0.0]\n"
      "    size: [40, 48]\n"
      "    augment:\n"
      "      random_resized_crop: {scale: [0.2, 0.7], ratio: [0.5, 2.0]}\n"
      "      hflip: 0.5\n"
      "      color_jitter: {brightness: 0.3, contrast: 0.3, saturation: 0.3}\n";
  Open("anchor: cam0\nstreams:\n  cam0: {delta_timestamps: [-0.1, 0.0]}\n");
  std::map<uint64_t, Sample> full;
  for (uint64_t sample : {4u, 30u, 77u, 150u}) {
    auto s = assembler->Assemble(sample, 3, 2);
    ASSERT_TRUE(s.ok()) << s.status();
    full.emplace(sample, std::move(*s));
  }
  Open(yaml, CropMethod::kFromRgb);
  const StreamSpec& cam = spec.streams[0];
  int differ = 0;
  for (auto& [sample, f] : full) {
    auto got = assembler->Assemble(sample, 3, 2);
    ASSERT_TRUE(got.ok()) << got.status();
    SampleRng rng(3, 2, sample, static_cast<uint64_t>(cam.stream));
    const ImageDraw d = DrawImageAugment(cam.augment, 96, 64, &rng);
    std::vector<uint8_t> want;
    const std::vector<uint8_t>& px = f.Find("cam0")->data;
    for (int i = 0; i < 2; ++i) {
      RgbImage frame{96, 64, std::vector<uint8_t>(px.begin() + i * 96 * 64 * 3,
                                                  px.begin() + (i + 1) * 96 * 64 * 3)};
      RgbImage r;
      ResizeRgb(frame, d.x, d.y, d.w, d.h, d.flip, 48, 40, &r);
      ApplyColorJitter(d, &r);
      want.insert(want.end(), r.pixels.begin(), r.pixels.end());
    }
    EXPECT_EQ(got->Find("cam0")->data, want) << "sample " << sample;
    SampleSpec v4 = spec;
    v4.crop_method = CropMethod::kInDecoder;
    SampleAssembler in_decoder(*dataset, v4, index);
    auto other = in_decoder.Assemble(sample, 3, 2);
    ASSERT_TRUE(other.ok()) << other.status();
    differ += other->Find("cam0")->data != want;
  }
  EXPECT_GT(differ, 0);
}

TEST_F(SampleTest, FlipMirrorsTheUnaugmentedFrame) {
  Open("streams:\n  cam0: {augment: {hflip: 1.0}}\n");
  auto flipped = assembler->Assemble(10, 0, 0);
  Open("streams:\n  cam0: {}\n");
  auto plain = assembler->Assemble(10, 0, 0);
  ASSERT_TRUE(flipped.ok() && plain.ok());
  const auto& f = flipped->Find("cam0")->data;
  const auto& p = plain->Find("cam0")->data;
  for (int y = 0; y < 64; ++y) {
    for (int x = 0; x < 96; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(f[(y * 96 + x) * 3 + c], p[(y * 96 + (95 - x)) * 3 + c]);
      }
    }
  }
}

TEST_F(SampleTest, FloatChwOutputIsNormalizedUint8) {
  Open("streams:\n  cam0: {layout: chw, dtype: float32, normalize: {mean: [0.5, 0.5, 0.5], std: [0.25, 0.5, 1.0]}}\n");
  auto f = assembler->Assemble(33, 0, 0);
  Open("streams:\n  cam0: {}\n");
  auto u = assembler->Assemble(33, 0, 0);
  ASSERT_TRUE(f.ok() && u.ok());
  ASSERT_EQ(f->Find("cam0")->shape, (std::vector<int64_t>{1, 3, 64, 96}));
  const float* fv = reinterpret_cast<const float*>(f->Find("cam0")->data.data());
  const auto& uv = u->Find("cam0")->data;
  const float stdv[3] = {0.25f, 0.5f, 1.0f};
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 64 * 96; i += 97) {
      EXPECT_NEAR(fv[c * 64 * 96 + i], (uv[i * 3 + c] / 255.0f - 0.5f) / stdv[c], 1e-5);
    }
  }
}

TEST_F(SampleTest, ResizedFramesKeepTheirContent) {
  Open("streams:\n  cam0: {size: [32, 48]}\n");
  auto small = assembler->Assemble(60, 0, 0);
  Open("streams:\n  cam0: {}\n");
  auto full = assembler->Assemble(60, 0, 0);
  ASSERT_TRUE(small.ok() && full.ok());
  ASSERT_EQ(small->Find("cam0")->shape, (std::vector<int64_t>{1, 32, 48, 3}));
  // Mean colour survives a 2x downscale.
  auto mean = [](const std::vector<uint8_t>& v) {
    double s = 0;
    for (uint8_t b : v) s += b;
    return s / v.size();
  };
  EXPECT_NEAR(mean(small->Find("cam0")->data), mean(full->Find("cam0")->data), 2.0);
}

TEST_F(SampleTest, CliWritesTheSameBytesAtOneAndTwoThreads) {
  TempDir out;
  WriteFile(out.Join("spec.yaml"),
            "streams:\n"
            "  cam0: {delta_timestamps: [-0.1, 0.0], size: [40, 40], augment: {random_resized_crop: {scale: [0.5, 1.0]}, hflip: 0.5, color_jitter: {brightness: 0.3}}}\n"
            "  cam1: {}\n"
            "  observation.state: {normalize: mean_std}\n"
            "  action: {delta_timestamps: {start: 0.0, step: 0.02, count: 50}}\n"
            "  audio: {delta_timestamps: [-0.5, 0.0]}\n"
            "  instruction: {}\n");
  for (int threads : {1, 2}) {
    auto r = RunCommand(kCli + " sample " + ShellQuote(ds()) + " --config " +
                        ShellQuote(out.Join("spec.yaml")) + " --count 24 --seed 9 --epoch 1 --quiet --threads " +
                        std::to_string(threads) + " --out " + ShellQuote(out.Join("t" + std::to_string(threads))));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(out.Join("t1"))) {
    if (!e.is_regular_file() || e.path().filename() == "summary.json") continue;
    const std::string rel = fs::relative(e.path(), out.Join("t1")).string();
    ASSERT_EQ(ReadFile(e.path().string()), ReadFile(out.Join("t2/" + rel))) << rel;
    ++files;
  }
  EXPECT_EQ(files, 24u * 12u);  // 5 streams x (data + pad) + instruction + meta.json
  const auto meta = nlohmann::json::parse(ReadFile(out.Join("t1/000000/meta.json")));
  EXPECT_EQ(meta["tensors"]["cam0"]["shape"], nlohmann::json::array({2, 40, 40, 3}));
  EXPECT_FALSE(meta["text"]["instruction"].get<std::string>().empty());
}

TEST_F(SampleTest, ConfigErrorsSayWhatToFix) {
  auto d = Dataset::Open(ds());
  ASSERT_TRUE(d.ok());
  const Manifest& m = (*d)->manifest();
  struct Case {
    std::string yaml, expect;
  } cases[] = {
      {"streams:\n  cam9: {}\n", "stream 'cam9' is not in the dataset"},
      {"streams:\n  cam0: {sise: [1, 2]}\n", "unknown key 'sise'"},
      {"streams:\n  cam0: {layout: nhwc}\n", "layout is 'nhwc'"},
      {"streams:\n  action: {normalize: zscore}\n", "expected one of"},
      {"streams:\n  audio: {}\n", "audio needs delta_timestamps"},
      {"streams:\n  cam0: {augment: {random_resized_crop: {}}}\n", "needs an output size"},
      {"streams: [1, 2\n", "not valid YAML"},
      {"anchor: nope\nstreams: {action: {}}\n", "anchor stream 'nope'"},
      {"streams:\n  action: {delta_timestamps: {start: 0, step: 0.02}}\n", "start, step and count"},
      {"streams:\n  cam0: {delta_timestamps: [0.0, x]}\n", "must be a number"},
      {"limits: {max_pixels: -4}\nstreams: {action: {}}\n", "max_pixels is -4"},
      {"streams: {}\n", "at least one"},
  };
  for (const Case& c : cases) {
    auto s = SampleSpec::FromYaml(c.yaml, m, "bad.yaml");
    ASSERT_FALSE(s.ok()) << c.yaml;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(std::string(s.status().message()).find(c.expect), std::string::npos)
        << c.yaml << " -> " << s.status();
    EXPECT_EQ(std::string(s.status().message()).rfind("bad.yaml", 0), 0u) << s.status();
  }
}

// ---------------------------------------------------------------------------------------------
// Bad media: each case is an error for that sample naming where, or a counted skip.

// Writes a one-episode dataset with one IMAGE or VIDEO stream made of `packets`, plus an action
// stream at 10 Hz to anchor on.
std::string WriteTinyDataset(const std::string& dir, const pb::CodecParams& codec,
                             pb::StreamKind kind, const std::vector<std::string>& packets) {
  auto w = DatasetWriter::Create(dir, {});
  EXPECT_TRUE(w.ok()) << w.status();
  EpisodeData ep;
  ep.source = "test";
  EpisodeData::Stream& v = ep.streams.emplace_back();
  v.info.name = "cam";
  v.info.kind = kind;
  v.info.codec = codec.codec();
  v.info.rate = 10;
  v.info.shape = {codec.height(), codec.width(), 3};
  v.codec = codec;
  v.time_base_num = 1;
  v.time_base_den = 10;
  for (size_t i = 0; i < packets.size(); ++i) {
    EpisodeData::Packet& p = v.packets.emplace_back();
    p.pts = p.dts = static_cast<int64_t>(i);
    p.duration = 1;
    p.key = true;
    p.bytes = packets[i];
  }
  EpisodeData::Stream& a = ep.streams.emplace_back();
  a.info.name = "action";
  a.info.kind = pb::LOWDIM;
  a.info.codec = "zstd-shuffle4";
  a.info.rate = 10;
  a.info.shape = {1};
  a.codec->set_codec("zstd-shuffle4");
  for (size_t i = 0; i < packets.size(); ++i) {
    a.timestamps_s.push_back(i / 10.0);
    a.values.push_back(static_cast<float>(i));
  }
  EXPECT_TRUE((*w)->AddEpisode(ep).ok());
  EXPECT_TRUE((*w)->Finish().ok());
  return dir;
}

absl::Status AssembleFirst(const std::string& dir, const std::string& yaml = "streams: {cam: {}}") {
  auto ds = Dataset::Open(dir);
  if (!ds.ok()) return ds.status();
  auto spec = SampleSpec::FromYaml(yaml, (*ds)->manifest(), "t.yaml");
  if (!spec.ok()) return spec.status();
  auto index = SampleIndex::Build(**ds, spec->anchor_stream);
  if (!index.ok()) return index.status();
  SampleAssembler a(**ds, *spec, *index);
  absl::Status last;
  for (uint64_t i = 0; i < index->size(); ++i) {
    auto s = a.Assemble(i, 0, 0);
    if (!s.ok()) return s.status();
  }
  return absl::OkStatus();
}

TEST(SampleBadMediaTest, HeaderClaiming100000x100000IsRefusedBeforeDecoding) {
  TempDir dir;
  pb::CodecParams codec;
  codec.set_codec("h264");
  codec.set_width(100000);
  codec.set_height(100000);
  codec.set_pix_fmt("yuv420p");
  WriteTinyDataset(dir.Join("ds"), codec, pb::VIDEO, {std::string(100, '\x01'), "xyz"});
  absl::Status st = AssembleFirst(dir.Join("ds"));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("100000x100000"), std::string::npos) << st;
  EXPECT_NE(std::string(st.message()).find("stream 'cam'"), std::string::npos) << st;
}

TEST(SampleBadMediaTest, ZeroByteAndGarbageImagesAreErrors) {
  TempDir dir;
  pb::CodecParams codec;
  codec.set_codec("mjpeg");
  codec.set_width(64);
  codec.set_height(48);
  WriteTinyDataset(dir.Join("zero"), codec, pb::IMAGE, {"", ""});
  absl::Status st = AssembleFirst(dir.Join("zero"));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("frame 0"), std::string::npos) << st;
  EXPECT_NE(std::string(st.message()).find("episode 0"), std::string::npos) << st;
  WriteTinyDataset(dir.Join("garbage"), codec, pb::IMAGE, {std::string(5000, '\x37'), "x"});
  EXPECT_FALSE(AssembleFirst(dir.Join("garbage")).ok());
}

// A real clip whose packets were damaged before import: checksums match (the damage is in the
// source), so it is the decoder that must refuse. `fail` stops; `skip` counts every skip.
TEST(SampleBadMediaTest, CorruptPacketsFailOrAreCountedSkips) {
  TempDir dir;
  const std::string ep = dir.Join("src/ep_0000");
  fs::create_directories(ep);
  auto r = RunCommand("ffmpeg -v error -nostdin -y -f lavfi -i testsrc2=size=160x120:rate=10 "
                      "-frames:v 40 -c:v libx264 -g 10 -bf 0 -bsf:v h264_mp4toannexb "
                      "-f h264 " + ShellQuote(dir.Join("cam.h264")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Damage the middle of the elementary stream, then wrap it in MP4.
  std::string bytes = ReadFile(dir.Join("cam.h264"));
  for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 3000 && i < bytes.size(); i += 7) {
    bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
  }
  WriteFile(dir.Join("bad.h264"), bytes);
  r = RunCommand("ffmpeg -v quiet -nostdin -y -r 10 -i " + ShellQuote(dir.Join("bad.h264")) +
                 " -c copy " + ShellQuote(ep + "/cam.mp4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<float> steps(40);
  for (int i = 0; i < 40; ++i) steps[i] = static_cast<float>(i);
  ASSERT_TRUE(WriteNpy(ep + "/action.npy", {40, 1}, steps.data()).ok());
  WriteFile(ep + "/episode.json", R"({"rates": {"action": 10}})");
  r = RunCommand(kCli + " import --quiet --from " + ShellQuote(dir.Join("src")) + " --out " +
                 ShellQuote(dir.Join("ds")));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  WriteFile(dir.Join("fail.yaml"), "streams: {cam: {}}\n");
  r = RunCommand(kCli + " sample " + ShellQuote(dir.Join("ds")) + " --config " +
                 ShellQuote(dir.Join("fail.yaml")) + " --quiet --start 0 --stride 1 --count 40 --out " +
                 ShellQuote(dir.Join("out_fail")));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("stream 'cam'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("episode 0"), std::string::npos) << r.output;

  WriteFile(dir.Join("skip.yaml"), "on_error: skip\nstreams: {cam: {}}\n");
  r = RunCommand(kCli + " sample " + ShellQuote(dir.Join("ds")) + " --config " +
                 ShellQuote(dir.Join("skip.yaml")) + " --start 0 --stride 1 --count 40 --out " +
                 ShellQuote(dir.Join("out_skip")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto summary = nlohmann::json::parse(ReadFile(dir.Join("out_skip/summary.json")));
  const size_t skipped = summary["skipped"].size();
  EXPECT_GT(skipped, 0u) << "the damage went unnoticed";
  EXPECT_LT(skipped, 40u);
  EXPECT_EQ(summary["written"].get<size_t>() + skipped, 40u);
  EXPECT_NE(r.output.find("skipped"), std::string::npos) << "skips are logged";
  // Every skip says why.
  for (const auto& s : summary["skipped"]) {
    EXPECT_NE(s["error"].get<std::string>().find("stream 'cam'"), std::string::npos) << s;
  }
}

// Raw payload of a .npy written by `conveyor sample` (format 1.0).
std::string NpyPayload(const std::string& path) {
  const std::string b = ReadFile(path);
  const size_t header = static_cast<uint8_t>(b[8]) | (static_cast<size_t>(static_cast<uint8_t>(b[9])) << 8);
  return b.substr(10 + header);
}

// The "done when" check of the sampling issue: `conveyor sample` on an imported dataset of odd
// clips (VP9 641x479, 10-bit HEVC, H.264 with B-frames) gives the ffmpeg CLI's frames.
TEST(SampleImportedTest, OddClipsSampleToTheCliFrames) {
  TempDir dir;
  const std::string ep = dir.Join("src/ep_0000");
  fs::create_directories(ep);
  const std::string src = "ffmpeg -v error -nostdin -y -f lavfi -i testsrc2=size=";
  struct Cam {
    std::string name, encode;
  } cams[] = {
      {"vp9_odd.webm", "641x479:rate=25,format=rgb24 -t 2 -pix_fmt yuv420p -c:v libvpx-vp9 -deadline realtime -cpu-used 8 -g 25"},
      {"hevc10.mp4", "320x240:rate=25 -t 2 -c:v libx265 -pix_fmt yuv420p10le -x265-params log-level=error:keyint=25"},
      {"h264.mp4", "320x240:rate=25 -t 2 -c:v libx264 -g 25 -bf 2"},
  };
  for (const Cam& c : cams) {
    auto r = RunCommand(src + c.encode + " " + ShellQuote(ep + "/" + c.name), 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::vector<float> steps(100);
  for (int i = 0; i < 100; ++i) steps[i] = static_cast<float>(i);
  ASSERT_TRUE(WriteNpy(ep + "/action.npy", {100, 1}, steps.data()).ok());
  WriteFile(ep + "/episode.json", R"({"rates": {"action": 50}, "instruction": "sort the blocks"})");
  auto r = RunCommand(kCli + " import --quiet --from " + ShellQuote(dir.Join("src")) + " --out " +
                      ShellQuote(dir.Join("ds")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  WriteFile(dir.Join("spec.yaml"),
            "streams:\n"
            "  vp9_odd: {delta_timestamps: [-0.04, 0.0, 0.04]}\n"
            "  hevc10: {delta_timestamps: [0.0]}\n"
            "  h264: {delta_timestamps: [0.0, 0.2]}\n"
            "  action: {delta_timestamps: {start: 0, step: 0.02, count: 10}}\n"
            "  instruction: {}\n");
  r = RunCommand(kCli + " sample --quiet " + ShellQuote(dir.Join("ds")) + " --config " +
                 ShellQuote(dir.Join("spec.yaml")) + " --count 12 --out " + ShellQuote(dir.Join("out")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const struct {
    std::string name;
    std::vector<double> deltas;
    int w, h;
  } checks[] = {{"vp9_odd", {-0.04, 0.0, 0.04}, 641, 479}, {"hevc10", {0.0}, 320, 240},
                {"h264", {0.0, 0.2}, 320, 240}};
  for (const auto& c : checks) {
    const std::string file = ep + "/" + (c.name == "vp9_odd" ? "vp9_odd.webm" : c.name + ".mp4");
    const auto golden = FrameMd5s(file, "v", "-pix_fmt rgb24");
    ASSERT_EQ(golden.size(), 50u) << c.name;
    for (int j = 0; j < 12; ++j) {
      char sub[16];
      std::snprintf(sub, sizeof(sub), "%06d", j);
      const std::string d = dir.Join(std::string("out/") + sub);
      const auto meta = nlohmann::json::parse(ReadFile(d + "/meta.json"));
      const double t = meta["anchor_time_s"].get<double>();
      const std::string px = NpyPayload(d + "/" + c.name + ".npy");
      const size_t frame_bytes = static_cast<size_t>(c.w) * c.h * 3;
      ASSERT_EQ(px.size(), frame_bytes * c.deltas.size()) << c.name;
      for (size_t i = 0; i < c.deltas.size(); ++i) {
        const long k = std::clamp(std::lround((t + c.deltas[i]) * 25.0), 0L, 49L);
        EXPECT_EQ(Md5Hex(px.data() + i * frame_bytes, frame_bytes),
                  golden[k])
            << c.name << " sample " << j << " t=" << t << " delta " << c.deltas[i];
      }
    }
  }
  EXPECT_EQ(nlohmann::json::parse(ReadFile(dir.Join("out/000000/meta.json")))["text"]["instruction"],
            "sort the blocks");
}

// Image streams: native size equals djpeg; an output of exactly 1/4 the size comes from
// TurboJPEG's DCT-domain scaling and equals `djpeg -scale 1/4`.
TEST(SampleImportedTest, JpegFramesEqualDjpegFullAndScaled) {
  TempDir dir;
  const std::string ep = dir.Join("src/ep_0000");
  fs::create_directories(ep + "/wrist");
  auto r = RunCommand("ffmpeg -v error -nostdin -y -f lavfi -i testsrc2=size=640x480:rate=5 -frames:v 6 " +
                      ShellQuote(ep + "/wrist/%03d.jpg"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<float> steps(6, 1.0f);
  ASSERT_TRUE(WriteNpy(ep + "/action.npy", {6, 1}, steps.data()).ok());
  WriteFile(ep + "/episode.json", R"({"rates": {"action": 5, "wrist": 5}})");
  r = RunCommand(kCli + " import --quiet --from " + ShellQuote(dir.Join("src")) + " --out " +
                 ShellQuote(dir.Join("ds")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto djpeg = [&](int frame, const std::string& scale) {
    char name[16];
    std::snprintf(name, sizeof(name), "%03d.jpg", frame + 1);
    auto d = RunCommand("djpeg " + scale + " -ppm " + ShellQuote(ep + "/wrist/" + name));
    EXPECT_EQ(d.exit_code, 0);
    // Skip the "P6\nW H\n255\n" header.
    size_t pos = 0;
    for (int lines = 0; lines < 3; ++lines) pos = d.output.find('\n', pos) + 1;
    return d.output.substr(pos);
  };
  for (const auto& [yaml, scale] : std::vector<std::pair<std::string, std::string>>{
           {"streams: {wrist: {}}", ""}, {"streams: {wrist: {size: [120, 160]}}", "-scale 1/4"}}) {
    auto ds = Dataset::Open(dir.Join("ds"));
    ASSERT_TRUE(ds.ok()) << ds.status();
    auto spec = SampleSpec::FromYaml(yaml, (*ds)->manifest(), "t.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto index = SampleIndex::Build(**ds, spec->anchor_stream);
    ASSERT_TRUE(index.ok());
    SampleAssembler a(**ds, *spec, *index);
    for (uint64_t i = 0; i < 6; ++i) {
      auto s = a.Assemble(i, 0, 0);
      ASSERT_TRUE(s.ok()) << s.status();
      const OwnedTensor* t = s->Find("wrist");
      const std::string want = djpeg(static_cast<int>(i), scale);
      ASSERT_EQ(t->data.size(), want.size()) << yaml;
      EXPECT_TRUE(std::equal(t->data.begin(), t->data.end(),
                             reinterpret_cast<const uint8_t*>(want.data())))
          << yaml << " frame " << i;
    }
    EXPECT_EQ(a.stats().images_decoded, 6u);
  }
}

}  // namespace
}  // namespace conveyor
