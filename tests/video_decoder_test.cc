// Frame-exact random access: every frame VideoDecoder returns must equal, byte for byte, what the
// ffmpeg CLI produces for the same frame of the source file (`ffmpeg -i FILE -pix_fmt rgb24 -f
// framemd5`), for clips the test encodes with ffmpeg: B-frames, odd sizes, 4:4:4, 10-bit, VFR,
// full-range and BT.709 tags, rotation metadata, and h264 / hevc / vp9 / av1 / mjpeg.
#include "media/video_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "tests/support/media_checks.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::FrameMd5s;
using testing::Md5Hex;
using testing::ReadFile;
using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;
using testing::WriteFile;

// Replaces the identity matrix of the first track header ('tkhd') of an MP4 with `matrix`
// (a, b, c, d of the 16.16 fixed-point display matrix), as a phone camera writes rotation.
void PatchTrackMatrix(const std::string& path, int32_t a, int32_t b, int32_t c, int32_t d) {
  std::string bytes = ReadFile(path);
  const size_t tkhd = bytes.find("tkhd");
  ASSERT_NE(tkhd, std::string::npos);
  const std::string identity("\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                             "\x00\x00\x00\x00\x00\x01\x00\x00",
                             20);
  const size_t m = bytes.find(identity, tkhd);
  ASSERT_NE(m, std::string::npos);
  auto put = [&](size_t at, int32_t v) {
    const uint32_t u = static_cast<uint32_t>(v);
    bytes[at] = static_cast<char>(u >> 24);
    bytes[at + 1] = static_cast<char>(u >> 16);
    bytes[at + 2] = static_cast<char>(u >> 8);
    bytes[at + 3] = static_cast<char>(u);
  };
  put(m, a);
  put(m + 4, b);
  put(m + 12, c);
  put(m + 16, d);
  WriteFile(path, bytes);
}

struct Clip {
  std::string name;
  std::string ext;
  std::string encode;  // ffmpeg arguments between the lavfi input and the output file
  int rotation = 0;    // 0, 90, 180, 270: patch the track matrix (MP4 only)
};

// Test output and names show the clip's name, not a byte dump of the struct.
void PrintTo(const Clip& c, std::ostream* os) { *os << c.name; }

class VideoDecoderClipTest : public ::testing::TestWithParam<Clip> {};

// Makes the clip, imports it, and checks every frame, asked for in a shuffled order a few at a
// time (as samples ask), against the CLI.
TEST_P(VideoDecoderClipTest, EveryFrameEqualsTheFfmpegCli) {
  const Clip& clip = GetParam();
  TempDir dir;
  const std::string ep = dir.Join("src/ep_0000");
  std::filesystem::create_directories(ep);
  const std::string file = ep + "/cam." + clip.ext;
  auto r = RunCommand("ffmpeg -v error -nostdin -y " + clip.encode + " " + ShellQuote(file), 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (clip.rotation == 90) PatchTrackMatrix(file, 0, 0x10000, -0x10000, 0);
  if (clip.rotation == 270) PatchTrackMatrix(file, 0, -0x10000, 0x10000, 0);
  if (clip.rotation == 180) PatchTrackMatrix(file, -0x10000, 0, 0, -0x10000);

  const std::vector<std::string> golden = FrameMd5s(file, "v", "-pix_fmt rgb24");
  ASSERT_GT(golden.size(), 5u);

  r = RunCommand(std::string(CONVEYOR_CLI) + " import --quiet --from " +
                 ShellQuote(dir.Join("src")) + " --out " + ShellQuote(dir.Join("ds")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ds = Dataset::Open(dir.Join("ds"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto index = (*ds)->LoadEpisode(0);
  ASSERT_TRUE(index.ok()) << index.status();
  const int s = (*ds)->manifest().StreamIndex("cam");
  ASSERT_GE(s, 0);
  const auto& stream = (*index)->streams(s);
  auto table = FrameTable::Build(stream);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), golden.size()) << "frame count differs from the CLI's";

  if (clip.rotation != 0) {
    // The matrix reached the index (not a vacuous pass where neither side rotates).
    EXPECT_NE(stream.codec().rotation_deg(), 0.0);
  }
  auto read = [&](size_t p, std::string* bytes) {
    return (*ds)->ReadPacket(**index, s, p, bytes);
  };
  VideoDecoder decoder;
  std::vector<int64_t> order(golden.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<RgbImage> images;
  for (size_t i = 0; i < order.size(); i += 3) {
    std::vector<int64_t> ask(order.begin() + i, order.begin() + std::min(order.size(), i + 3));
    ask.push_back(ask.front());  // a repeat, as a clamped window asks
    auto st = decoder.Decode(/*stream_key=*/1, stream, *table, read, ask, VideoOutput{},
                             DecodeLimits{}, &images);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(images.size(), ask.size());
    if (clip.name.find("641x479") != std::string::npos) {
      EXPECT_EQ(images[0].width, 641);  // really odd (lavfi sources round to even otherwise)
      EXPECT_EQ(images[0].height, 479);
    }
    if (clip.rotation == 90 || clip.rotation == 270) {
      EXPECT_EQ(images[0].width, 240) << "a quarter turn swaps width and height";
    }
    for (size_t j = 0; j < ask.size(); ++j) {
      EXPECT_EQ(Md5Hex(images[j].pixels.data(), images[j].pixels.size()), golden[ask[j]])
          << clip.name << ": frame " << ask[j] << " (" << images[j].width << "x"
          << images[j].height << ")";
    }
  }
  // Forward access decodes each frame once.
  VideoDecoder sequential;
  for (size_t k = 0; k < golden.size(); ++k) {
    const int64_t f = static_cast<int64_t>(k);
    ASSERT_TRUE(sequential
                    .Decode(2, stream, *table, read, std::span<const int64_t>(&f, 1),
                            VideoOutput{}, DecodeLimits{}, &images)
                    .ok());
  }
  // Windows of two frames sliding forward ([k-3, k], as [-0.1, 0.0] at 30 fps asks): with
  // keep_recent the frame behind comes from the kept frames. Only frames 1 and 2 (never the
  // newer frame of an earlier window) cost a seek back; after that nothing is decoded twice.
  // (Seeks are not counted here: jumping ahead to a keyframe is also a seek, and free.)
  VideoDecoder windowed;
  VideoOutput keep;
  keep.keep_recent = true;
  for (size_t k = 3; k < golden.size(); ++k) {
    const int64_t w[2] = {static_cast<int64_t>(k) - 3, static_cast<int64_t>(k)};
    ASSERT_TRUE(windowed.Decode(3, stream, *table, read, w, keep, DecodeLimits{}, &images).ok());
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(Md5Hex(images[j].pixels.data(), images[j].pixels.size()), golden[w[j]])
          << clip.name << " window at " << k;
    }
  }
  EXPECT_LE(windowed.stats().frames_decoded, golden.size() + 16) << clip.name;
  EXPECT_EQ(sequential.stats().frames_delivered, golden.size());
  EXPECT_EQ(sequential.stats().frames_decoded, golden.size()) << "sequential access re-decoded";
  EXPECT_EQ(sequential.stats().seeks, 1u);
}

// VideoOutput::crop: the rectangle cut from the decoded planes and converted to the output size
// in one libswscale pass equals the CLI's `-vf crop=W:H:X:Y,scale=OW:OH:flags=F -pix_fmt rgb24`
// byte for byte (after autorotation, as the CLI inserts its transpose before -vf), with odd X and Y
// (rounded down to the chroma grid, as the CLI's crop filter does), an output width that is not a
// multiple of 16, and no scaling at all.
TEST_P(VideoDecoderClipTest, CropAndScaleEqualTheFfmpegCli) {
  const Clip& clip = GetParam();
  TempDir dir;
  const std::string ep = dir.Join("src/ep_0000");
  std::filesystem::create_directories(ep);
  const std::string file = ep + "/cam." + clip.ext;
  auto r = RunCommand("ffmpeg -v error -nostdin -y " + clip.encode + " " + ShellQuote(file), 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (clip.rotation == 90) PatchTrackMatrix(file, 0, 0x10000, -0x10000, 0);
  if (clip.rotation == 270) PatchTrackMatrix(file, 0, -0x10000, 0x10000, 0);
  if (clip.rotation == 180) PatchTrackMatrix(file, -0x10000, 0, 0, -0x10000);
  r = RunCommand(std::string(CONVEYOR_CLI) + " import --quiet --from " +
                 ShellQuote(dir.Join("src")) + " --out " + ShellQuote(dir.Join("ds")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ds = Dataset::Open(dir.Join("ds"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto index = (*ds)->LoadEpisode(0);
  ASSERT_TRUE(index.ok()) << index.status();
  const int s = (*ds)->manifest().StreamIndex("cam");
  const auto& stream = (*index)->streams(s);
  auto table = FrameTable::Build(stream);
  ASSERT_TRUE(table.ok()) << table.status();
  auto read = [&](size_t p, std::string* bytes) { return (*ds)->ReadPacket(**index, s, p, bytes); };
  const DisplayedSize shown = DisplayedSizeOf(stream, true);
  EXPECT_EQ(shown.width, clip.rotation == 90 || clip.rotation == 270 ? 240 : (clip.name.find("641") != std::string::npos ? 641 : 320));

  struct Case {
    VideoCrop crop;
    int width, height;  // 0x0: the crop's size
    ResizeFilter filter;
    const char* flags;
  };
  const Case cases[] = {
      {{33, 17, shown.width * 3 / 5, shown.height * 7 / 10}, 96, 80, ResizeFilter::kBilinear, "bilinear"},
      {{8, 5, shown.width / 2 + 1, shown.height / 2}, 90, 70, ResizeFilter::kBicubic, "bicubic"},
      {{3, 2, 63, 47}, 0, 0, ResizeFilter::kBilinear, ""},
  };
  VideoDecoder decoder;
  std::vector<int64_t> all(table->size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int64_t>(k);
  for (const Case& c : cases) {
    const std::string scale =
        c.width > 0 ? StrCat(",scale=", c.width, ":", c.height, ":flags=", c.flags) : "";
    const std::vector<std::string> golden = FrameMd5s(
        file, "v",
        StrCat("-vf crop=", c.crop.width, ":", c.crop.height, ":", c.crop.x, ":", c.crop.y, scale,
               " -pix_fmt rgb24"));
    ASSERT_EQ(golden.size(), table->size());
    VideoOutput out;
    out.crop = c.crop;
    out.width = c.width;
    out.height = c.height;
    out.filter = c.filter;
    std::vector<RgbImage> images;
    // Out of order, a few frames at a time, as samples ask.
    std::vector<int64_t> order = all;
    std::mt19937 rng(11);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < order.size(); i += 4) {
      std::vector<int64_t> ask(order.begin() + i, order.begin() + std::min(order.size(), i + 4));
      ASSERT_TRUE(decoder.Decode(1, stream, *table, read, ask, out, DecodeLimits{}, &images).ok());
      for (size_t j = 0; j < ask.size(); ++j) {
        if (c.width > 0) EXPECT_EQ(images[j].width, c.width);
        EXPECT_EQ(Md5Hex(images[j].pixels.data(), images[j].pixels.size()), golden[ask[j]])
            << clip.name << ": frame " << ask[j] << ", crop " << c.crop.width << "x"
            << c.crop.height << " at (" << c.crop.x << ", " << c.crop.y << ") to " << c.width
            << "x" << c.height << " " << c.flags;
      }
    }
  }
  // A rectangle outside the displayed frame is an error naming both.
  VideoOutput bad;
  bad.crop = VideoCrop{shown.width - 10, 0, 20, 20};
  bad.width = bad.height = 16;
  std::vector<RgbImage> images;
  const int64_t f0 = 0;
  const absl::Status st = decoder.Decode(1, stream, *table, read, std::span<const int64_t>(&f0, 1),
                                         bad, DecodeLimits{}, &images);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(StrCat("not inside the ", shown.width, "x", shown.height)),
            std::string::npos)
      << st;
}

// A crop of a stream whose planes cannot be cut in its own format after autorotation (4:2:2 turned
// a quarter: chroma subsampled one way only, rotated only after conversion to RGB) goes through
// full-size RGB and a second libswscale pass. It is not the CLI's chain bit for bit (the CLI
// converts to a rotatable format first), so this bounds the difference: every frame at least
// 40 dB PSNR against `ffmpeg -vf crop,scale -pix_fmt rgb24` (measured: 44.4 dB, the worst frame).
TEST(VideoDecoderCropTest, CropThroughRgbStaysNearTheCli) {
  TempDir dir;
  const std::string ep = dir.Join("src/ep_0000");
  std::filesystem::create_directories(ep);
  const std::string file = ep + "/cam.mp4";
  auto r = RunCommand("ffmpeg -v error -nostdin -y -f lavfi -i testsrc2=size=320x240:rate=30 "
                      "-frames:v 12 -c:v libx264 -g 6 -pix_fmt yuv422p " + ShellQuote(file), 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  PatchTrackMatrix(file, 0, 0x10000, -0x10000, 0);  // 90 degrees
  r = RunCommand(std::string(CONVEYOR_CLI) + " import --quiet --from " +
                 ShellQuote(dir.Join("src")) + " --out " + ShellQuote(dir.Join("ds")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ds = Dataset::Open(dir.Join("ds"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto index = (*ds)->LoadEpisode(0);
  ASSERT_TRUE(index.ok()) << index.status();
  const int s = (*ds)->manifest().StreamIndex("cam");
  const auto& stream = (*index)->streams(s);
  auto table = FrameTable::Build(stream);
  ASSERT_TRUE(table.ok()) << table.status();
  auto read = [&](size_t p, std::string* bytes) { return (*ds)->ReadPacket(**index, s, p, bytes); };
  const VideoCrop crop{32, 16, 150, 200};  // even: the same rectangle on both sides
  const std::string raw = dir.Join("cli.rgb");
  r = RunCommand(StrCat("ffmpeg -v error -nostdin -y -i ", ShellQuote(file), " -vf crop=", crop.width,
                        ":", crop.height, ":", crop.x, ":", crop.y,
                        ",scale=96:80:flags=bilinear -pix_fmt rgb24 -f rawvideo ", ShellQuote(raw)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string cli = ReadFile(raw);
  const size_t frame_bytes = 96 * 80 * 3;
  ASSERT_EQ(cli.size(), table->size() * frame_bytes);
  VideoDecoder decoder;
  VideoOutput out;
  out.crop = crop;
  out.width = 96;
  out.height = 80;
  std::vector<int64_t> all(table->size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int64_t>(k);
  std::vector<RgbImage> images;
  DecodeLimits limits;
  ASSERT_TRUE(decoder.Decode(1, stream, *table, read, all, out, limits, &images).ok());
  double worst = 1e9;
  for (size_t k = 0; k < images.size(); ++k) {
    ASSERT_EQ(images[k].pixels.size(), frame_bytes);
    double se = 0;
    for (size_t i = 0; i < frame_bytes; ++i) {
      const double d = images[k].pixels[i] - static_cast<uint8_t>(cli[k * frame_bytes + i]);
      se += d * d;
    }
    const double mse = se / frame_bytes;
    worst = std::min(worst, mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse));
  }
  std::printf("crop through RGB (4:2:2 turned 90 degrees): worst frame %.1f dB against the CLI\n",
              worst);
  EXPECT_GE(worst, 40.0);
}

const char kSrc[] = "-f lavfi -i testsrc2=size=";

INSTANTIATE_TEST_SUITE_P(
    Clips, VideoDecoderClipTest,
    ::testing::Values(
        Clip{"h264_bframes_gop30", "mp4",
             std::string(kSrc) + "320x240:rate=30 -frames:v 75 -c:v libx264 -g 30 -bf 2 "
                                 "-pix_fmt yuv420p"},
        Clip{"h264_444_odd_641x479", "mp4",
             std::string(kSrc) + "641x479:rate=25,format=rgb24 -frames:v 30 -c:v libx264 -g 12 -bf 2 "
                                 "-pix_fmt yuv444p"},
        Clip{"vp9_odd_641x479", "webm",
             std::string(kSrc) + "641x479:rate=25,format=rgb24 -frames:v 30 -pix_fmt yuv420p -c:v libvpx-vp9 -deadline "
                                 "realtime -cpu-used 8 -g 10"},
        Clip{"hevc_10bit", "mp4",
             std::string(kSrc) + "320x240:rate=30 -frames:v 40 -c:v libx265 -pix_fmt "
                                 "yuv420p10le -x265-params log-level=error:keyint=15:bframes=3"},
        Clip{"av1", "mkv",
             std::string(kSrc) + "320x240:rate=30 -frames:v 30 -c:v libaom-av1 -cpu-used 8 "
                                 "-g 10 -row-mt 0"},
        Clip{"mjpeg_full_range", "mkv",
             std::string(kSrc) + "320x240:rate=15 -frames:v 12 -c:v mjpeg -pix_fmt yuvj420p"},
        Clip{"h264_bt709_full_range", "mp4",
             std::string(kSrc) + "320x240:rate=30 -frames:v 30 -c:v libx264 -g 15 -pix_fmt "
                                 "yuv420p -color_range pc -colorspace bt709 -color_primaries "
                                 "bt709 -color_trc bt709"},
        Clip{"h264_vfr", "mp4",
             std::string(kSrc) + "320x240:rate=30 -frames:v 60 -vf "
                                 "select='not(eq(mod(n\\,4)\\,1))' -fps_mode passthrough "
                                 "-c:v libx264 -g 20 -bf 2"},
        Clip{"h264_rotate90", "mp4",
             std::string(kSrc) + "320x240:rate=30 -frames:v 20 -c:v libx264 -g 10 -bf 2", 90},
        Clip{"h264_rotate180", "mp4",
             std::string(kSrc) + "320x240:rate=30 -frames:v 20 -c:v libx264 -g 10", 180},
        Clip{"h264_rotate270", "mp4",
             std::string(kSrc) + "320x240:rate=30 -frames:v 20 -c:v libx264 -g 10", 270}),
    [](const ::testing::TestParamInfo<Clip>& info) { return info.param.name; });

}  // namespace
}  // namespace conveyor
