// ImageDecoder (media/image_decoder.h) against independent decoders: every JPEG must equal
// djpeg's PPM byte for byte, at full size and at the DCT scaling factor the decoder chose; every
// PNG (and BMP) must equal the ffmpeg CLI's `-pix_fmt rgb24` output. Broken and hostile inputs
// must give clear errors and leave the decoder usable, and frames imported with `conveyor import`
// must decode from the dataset to the same pixels.
//
// The images are made here with the ffmpeg CLI and cjpeg; the CMYK JPEG with TurboJPEG's
// compressor (no command-line tool writes one).
#include "media/image_decoder.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using conveyor::testing::CommandResult;
using conveyor::testing::ReadFile;
using conveyor::testing::RunCommand;
using conveyor::testing::ShellQuote;
using conveyor::testing::TempDir;
using conveyor::testing::WriteFile;

using conveyor::testing::kFfmpeg;
using conveyor::testing::Sh;
constexpr int kWidth = 641;  // odd sizes: partial MCUs and chroma blocks on both edges
constexpr int kHeight = 479;

// Runs `command`; on failure returns its output, else "".
bool Mentions(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// A binary PPM (P6, maxval 255) as an RgbImage; width 0 when it is not one.
RgbImage ParsePpm(const std::string& bytes) {
  RgbImage img;
  std::istringstream in(bytes);
  std::string magic;
  int maxval = 0;
  in >> magic >> img.width >> img.height >> maxval;
  if (magic != "P6" || maxval != 255 || !in) return RgbImage{};
  in.get();  // the one whitespace byte before the samples
  const size_t n = size_t(img.width) * img.height * 3;
  const size_t start = static_cast<size_t>(in.tellg());
  if (bytes.size() - start != n) return RgbImage{};
  img.pixels.assign(bytes.begin() + start, bytes.end());
  return img;
}

::testing::AssertionResult SameImage(const RgbImage& got, const RgbImage& want) {
  if (want.width == 0) return ::testing::AssertionFailure() << "no reference image";
  if (got.width != want.width || got.height != want.height) {
    return ::testing::AssertionFailure() << "decoded " << got.width << "x" << got.height
                                         << ", reference " << want.width << "x" << want.height;
  }
  if (got.pixels.size() != want.pixels.size()) {
    return ::testing::AssertionFailure()
           << got.pixels.size() << " bytes, reference " << want.pixels.size();
  }
  size_t diffs = 0, first = 0;
  for (size_t i = 0; i < got.pixels.size(); ++i) {
    if (got.pixels[i] != want.pixels[i] && diffs++ == 0) first = i;
  }
  if (diffs == 0) return ::testing::AssertionSuccess();
  const size_t px = first / 3;
  return ::testing::AssertionFailure()
         << diffs << " of " << got.pixels.size() << " bytes differ; first at pixel ("
         << px % got.width << ", " << px / got.width << ") channel " << first % 3 << ": "
         << int(got.pixels[first]) << " vs " << int(want.pixels[first]);
}

class ImageDecoderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new TempDir; }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string Path(const std::string& name) { return dir_->Join(name); }
  // The path of test image `name`, made on first use (ctest runs each test in its own process,
  // so each makes only what it uses).
  static std::string Image(const std::string& name) {
    const std::string path = Path(name);
    if (!fs::exists(path)) {
      const std::string err = Make(name);
      EXPECT_TRUE(err.empty()) << err;
    }
    return path;
  }
  static std::string Bytes(const std::string& name) { return ReadFile(Image(name)); }

  // Makes test image `name`; returns "" or what failed.
  static std::string Make(const std::string& name) {
    if (name == "cmyk.jpg") return MakeCmykJpeg();
    // testsrc2 rounds its size down to even numbers; the crop (in RGB) makes the odd size.
    const std::string src = "testsrc2=size=642x480,format=rgb24,crop=" + std::to_string(kWidth) +
                            ":" + std::to_string(kHeight) + ":0:0";
    // Alpha that varies across the image, and 16-bit samples whose low bytes are not copies of
    // the high bytes (scaled up at 16-bit precision).
    const std::string alpha =
        src + ",format=rgba,geq=r='r(X,Y)':g='g(X,Y)':b='b(X,Y)':a='mod(X+2*Y,256)'";
    const std::string deep = "testsrc2=size=160x120,scale=" + std::to_string(kWidth) + "x" +
                             std::to_string(kHeight) + ":flags=bicubic,format=rgb48be";
    const std::map<std::string, std::pair<std::string, std::string>> ffmpeg = {
        {"src.ppm", {src, "-pix_fmt rgb24"}},        {"ff420.jpg", {src, "-pix_fmt yuvj420p"}},
        {"ff444.jpg", {src, "-pix_fmt yuvj444p"}},   {"rgb24.png", {src, "-pix_fmt rgb24"}},
        {"rgba.png", {alpha, "-pix_fmt rgba"}},      {"rgb48.png", {deep, "-pix_fmt rgb48be"}},
        {"rgba64.png", {deep, "-pix_fmt rgba64be"}}, {"gray.png", {src, "-pix_fmt gray"}},
        {"gray16.png", {deep, "-pix_fmt gray16be"}}, {"ya8.png", {alpha, "-pix_fmt ya8"}},
        {"pal8.png", {src, "-pix_fmt pal8"}},        {"bgr24.bmp", {src, "-pix_fmt bgr24"}},
    };
    const std::map<std::string, std::string> cjpeg = {
        {"cj444.jpg", "-quality 90 -sample 1x1"},        {"cj420.jpg", "-quality 90 -sample 2x2"},
        {"cj422.jpg", "-quality 90 -sample 2x1"},        {"gray.jpg", "-quality 90 -grayscale"},
        {"progressive.jpg", "-quality 90 -progressive"},
    };
    if (auto it = ffmpeg.find(name); it != ffmpeg.end()) {
      return Sh(kFfmpeg + " -f lavfi -i " + ShellQuote(it->second.first) + " -frames:v 1 " +
                it->second.second + " " + ShellQuote(Path(name)));
    }
    if (auto it = cjpeg.find(name); it != cjpeg.end()) {
      return Sh("cjpeg " + it->second + " -outfile " + ShellQuote(Path(name)) + " " +
                ShellQuote(Image("src.ppm")));
    }
    return "no recipe for test image " + name;
  }

  // A CMYK JPEG (stored as YCCK, with the Adobe marker, as Photoshop writes them) made from the
  // test pattern: C, M, Y from R, G, B and K ramping across the image.
  static std::string MakeCmykJpeg() {
    const RgbImage rgb = ParsePpm(Bytes("src.ppm"));
    if (rgb.width != kWidth) return "src.ppm is not a PPM";
    std::vector<uint8_t> cmyk(size_t(kWidth) * kHeight * 4);
    for (size_t i = 0; i < size_t(kWidth) * kHeight; ++i) {
      for (int c = 0; c < 3; ++c) cmyk[i * 4 + c] = rgb.pixels[i * 3 + c];
      cmyk[i * 4 + 3] = static_cast<uint8_t>(64 + (i % kWidth) * 191 / kWidth);
    }
    std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitCompress(), &tjDestroy);
    if (tj == nullptr) return "tjInitCompress failed";
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    if (tjCompress2(tj.get(), cmyk.data(), kWidth, 0, kHeight, TJPF_CMYK, &jpeg, &size, TJSAMP_444,
                    90, 0) != 0) {
      return std::string("tjCompress2: ") + tjGetErrorStr2(tj.get());
    }
    WriteFile(Path("cmyk.jpg"), std::string(reinterpret_cast<char*>(jpeg), size));
    tjFree(jpeg);
    return "";
  }

  // djpeg's decode of `file`: PPM (-rgb turns grey into RGB; CMYK is converted by djpeg's PPM
  // writer and refuses -rgb), at `scale` ("M/N") unless empty.
  static RgbImage Djpeg(const std::string& file, const std::string& scale = "") {
    const std::string out =
        Path(file + "." + std::to_string(std::hash<std::string>{}(scale)) + ".ppm");
    const std::string err = Sh(std::string("djpeg ") + (file == "cmyk.jpg" ? "" : "-rgb ") +
                               (scale.empty() ? "" : "-scale " + scale + " ") + "-ppm -outfile " +
                               ShellQuote(out) + " " + ShellQuote(Image(file)));
    EXPECT_TRUE(err.empty()) << err;
    return ParsePpm(ReadFile(out));
  }

  // The ffmpeg CLI's rgb24 decode of `file` (kWidth x kHeight).
  static RgbImage FfmpegRgb(const std::string& file, int width = kWidth, int height = kHeight) {
    const std::string out = Path(file + ".rgb");
    const std::string err = Sh(kFfmpeg + " -i " + ShellQuote(Image(file)) +
                               " -pix_fmt rgb24 -f rawvideo " + ShellQuote(out));
    EXPECT_TRUE(err.empty()) << err;
    RgbImage img{width, height, {}};
    const std::string bytes = ReadFile(out);
    img.pixels.assign(bytes.begin(), bytes.end());
    return img;
  }

  // Decodes a good image with `decoder` and checks it: after an error the decoder must still work.
  static void ExpectStillDecodes(ImageDecoder& decoder) {
    RgbImage img;
    absl::Status s = decoder.Decode("mjpeg", Bytes("cj420.jpg"), 0, 0, DecodeLimits{}, &img);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(SameImage(img, Djpeg("cj420.jpg")));
    s = decoder.Decode("png", Bytes("rgba.png"), 0, 0, DecodeLimits{}, &img);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(SameImage(img, FfmpegRgb("rgba.png")));
  }

  static TempDir* dir_;
};

TempDir* ImageDecoderTest::dir_ = nullptr;

const char* const kJpegs[] = {"ff420.jpg", "ff444.jpg", "cj444.jpg",       "cj420.jpg",
                              "cj422.jpg", "gray.jpg",  "progressive.jpg", "cmyk.jpg"};

TEST_F(ImageDecoderTest, JpegFullSizeEqualsDjpeg) {
  ImageDecoder decoder;
  RgbImage img;
  uint64_t n = 0;
  for (const char* name : kJpegs) {
    SCOPED_TRACE(name);
    absl::Status s = decoder.Decode("mjpeg", Bytes(name), 0, 0, DecodeLimits{}, &img);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(SameImage(img, Djpeg(name)));
    EXPECT_EQ(decoder.images_decoded(), ++n);
  }
  EXPECT_EQ(decoder.scaled_decodes(), 0u);
}

TEST_F(ImageDecoderTest, JpegScaledDecodeIsTheSmallestFactorAboveTheMinimum) {
  struct Case {
    int min_w, min_h;
    std::string scale;  // what the decoder must pick among TurboJPEG's M/8 factors
    int want_w, want_h;
  };
  const Case cases[] = {
      {300, 200, "1/2", 321, 240},  // 3/8 would give 241 < 300
      {100, 100, "1/4", 161, 120},  // 1/8 would give 60 < 100
      {500, 300, "7/8", 561, 420},  // 3/4 would give 481 < 500
      {0, 50, "1/8", 81, 60},       // only the height constrained
      {321, 0, "1/2", 321, 240},    // exactly the scaled width
      {322, 0, "5/8", 401, 300},
      {641, 479, "", 641, 479},   // the full size is the minimum: no scaling
      {2000, 100, "", 641, 479},  // larger than the image: full size, never upscaled
  };
  ImageDecoder decoder;
  RgbImage img;
  uint64_t scaled = 0;
  for (const char* name : {"cj420.jpg", "ff444.jpg", "gray.jpg", "progressive.jpg", "cmyk.jpg"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(name) + " min " + std::to_string(c.min_w) + "x" +
                   std::to_string(c.min_h));
      absl::Status s = decoder.Decode("mjpeg", Bytes(name), c.min_w, c.min_h, DecodeLimits{}, &img);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(img.width, c.want_w);
      EXPECT_EQ(img.height, c.want_h);
      EXPECT_TRUE(SameImage(img, Djpeg(name, c.scale)));
      if (!c.scale.empty()) ++scaled;
      EXPECT_EQ(decoder.scaled_decodes(), scaled);
    }
  }
}

TEST_F(ImageDecoderTest, PngEqualsFfmpegRgb24) {
  ImageDecoder decoder;
  RgbImage img;
  for (const char* name : {"rgb24.png", "rgba.png", "rgb48.png", "rgba64.png", "gray.png",
                           "gray16.png", "ya8.png", "pal8.png"}) {
    SCOPED_TRACE(name);
    // A minimum size never scales a PNG.
    absl::Status s = decoder.Decode("png", Bytes(name), 100, 100, DecodeLimits{}, &img);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(SameImage(img, FfmpegRgb(name)));
  }
  EXPECT_EQ(decoder.images_decoded(), 8u);
  EXPECT_EQ(decoder.scaled_decodes(), 0u);
}

TEST_F(ImageDecoderTest, OtherFfmpegStillImageCodecs) {
  ImageDecoder decoder;
  RgbImage img;
  absl::Status s = decoder.Decode("bmp", Bytes("bgr24.bmp"), 0, 0, DecodeLimits{}, &img);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(SameImage(img, FfmpegRgb("bgr24.bmp")));

  // FFmpeg's own max_pixels guards codecs whose header the decoder does not read; the error
  // code is the FFmpeg decoder's own (bmp says AVERROR_INVALIDDATA).
  DecodeLimits small;
  small.max_pixels = 1000;
  s = decoder.Decode("bmp", Bytes("bgr24.bmp"), 0, 0, small, &img);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, "bmp: decoder rejected the image")) << s;
  ExpectStillDecodes(decoder);

  for (const char* codec : {"nonesuch", "aac", ""}) {
    s = decoder.Decode(codec, Bytes("rgb24.png"), 0, 0, DecodeLimits{}, &img);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Mentions(s, "unknown image codec '" + std::string(codec) + "'")) << s;
  }
}

TEST_F(ImageDecoderTest, MixedSequenceReusesOneDecoder) {
  ImageDecoder decoder;
  RgbImage img;
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(decoder.Decode("png", Bytes("rgb48.png"), 0, 0, DecodeLimits{}, &img).ok());
    EXPECT_TRUE(SameImage(img, FfmpegRgb("rgb48.png")));
    ASSERT_TRUE(decoder.Decode("mjpeg", Bytes("cj444.jpg"), 200, 200, DecodeLimits{}, &img).ok());
    EXPECT_TRUE(SameImage(img, Djpeg("cj444.jpg", "1/2")));
    ASSERT_TRUE(decoder.Decode("bmp", Bytes("bgr24.bmp"), 0, 0, DecodeLimits{}, &img).ok());
    EXPECT_TRUE(SameImage(img, FfmpegRgb("bgr24.bmp")));
    ASSERT_TRUE(decoder.Decode("png", Bytes("pal8.png"), 0, 0, DecodeLimits{}, &img).ok());
    EXPECT_TRUE(SameImage(img, FfmpegRgb("pal8.png")));
    ASSERT_TRUE(decoder.Decode("mjpeg", Bytes("cmyk.jpg"), 0, 0, DecodeLimits{}, &img).ok());
    EXPECT_TRUE(SameImage(img, Djpeg("cmyk.jpg")));
  }
  EXPECT_EQ(decoder.images_decoded(), 10u);
  EXPECT_EQ(decoder.scaled_decodes(), 2u);
}

TEST_F(ImageDecoderTest, EmptyInput) {
  ImageDecoder decoder;
  RgbImage img;
  for (const char* codec : {"mjpeg", "png"}) {
    absl::Status s = decoder.Decode(codec, "", 0, 0, DecodeLimits{}, &img);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_TRUE(Mentions(s, std::string(codec) + ": empty image (0 bytes)")) << s;
  }
  EXPECT_EQ(decoder.images_decoded(), 0u);
  ExpectStillDecodes(decoder);
}

TEST_F(ImageDecoderTest, TruncatedJpeg) {
  ImageDecoder decoder;
  RgbImage img;
  for (const char* name : {"cj420.jpg", "progressive.jpg"}) {
    const std::string jpeg = Bytes(name);
    // In the headers, in the middle of the entropy-coded data, and only the EOI marker missing.
    for (size_t cut : {size_t{100}, jpeg.size() / 2, jpeg.size() - 2}) {
      SCOPED_TRACE(std::string(name) + " cut at " + std::to_string(cut));
      absl::Status s = decoder.Decode("mjpeg", jpeg.substr(0, cut), 0, 0, DecodeLimits{}, &img);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_TRUE(Mentions(s, "mjpeg: ")) << s;
      if (cut > 1000) {
        EXPECT_TRUE(Mentions(s, "Premature end of JPEG file")) << s;
        EXPECT_TRUE(Mentions(s, "treated as an error")) << s;
      }
    }
  }
  EXPECT_EQ(decoder.images_decoded(), 0u);
  ExpectStillDecodes(decoder);
}

// Finds the first marker `code` (0xFF, code) after SOI; npos if none.
size_t FindMarker(const std::string& jpeg, uint8_t code) {
  for (size_t i = 2; i + 1 < jpeg.size(); ++i) {
    if (uint8_t(jpeg[i]) == 0xFF && uint8_t(jpeg[i + 1]) == code) return i;
  }
  return std::string::npos;
}

TEST_F(ImageDecoderTest, CorruptHuffmanTable) {
  std::string jpeg = Bytes("cj444.jpg");
  const size_t dht = FindMarker(jpeg, 0xC4);
  ASSERT_NE(dht, std::string::npos);
  // DHT: FF C4, length (2), class/id (1), then 16 code counts. All 255: more codes than a
  // table can hold.
  for (size_t i = dht + 5; i < dht + 5 + 16; ++i) jpeg[i] = char(0xFF);
  ImageDecoder decoder;
  RgbImage img;
  absl::Status s = decoder.Decode("mjpeg", jpeg, 0, 0, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(Mentions(s, "mjpeg: ") && Mentions(s, "Huffman")) << s;
  ExpectStillDecodes(decoder);
}

TEST_F(ImageDecoderTest, CorruptEntropyCodedData) {
  // Headers intact, the scan data overwritten with pseudo-random bytes (no 0xFF, so no markers).
  std::string jpeg = Bytes("cj420.jpg");
  const size_t sos = FindMarker(jpeg, 0xDA);
  ASSERT_NE(sos, std::string::npos);
  uint64_t x = 42;
  for (size_t i = sos + 100; i + 2 < jpeg.size(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    jpeg[i] = char((x >> 33) % 255);
  }
  ImageDecoder decoder;
  RgbImage img;
  absl::Status s = decoder.Decode("mjpeg", jpeg, 0, 0, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  ExpectStillDecodes(decoder);
}

TEST_F(ImageDecoderTest, JpegHeaderOverThePixelLimit) {
  std::string jpeg = Bytes("cj444.jpg");
  const size_t sof = FindMarker(jpeg, 0xC0);
  ASSERT_NE(sof, std::string::npos);
  // SOF0: FF C0, length (2), precision (1), height (2), width (2), big-endian. The fields are
  // 16-bit and libjpeg refuses more than 65500, so the largest claim a JPEG can make is about
  // 60000x60000; the decoder must refuse it before allocating 10 GB.
  for (size_t at : {sof + 5, sof + 7}) {
    jpeg[at] = char(60000 >> 8);
    jpeg[at + 1] = char(60000 & 0xFF);
  }
  ImageDecoder decoder;
  RgbImage img;
  absl::Status s = decoder.Decode("mjpeg", jpeg, 0, 0, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "JPEG header says 60000x60000 = 3600000000 pixels, over the limit of 33177600 "
            "(limits.max_pixels)");
  EXPECT_TRUE(img.pixels.empty());
  // Also when scaling would make the output small: decoding still costs the full size.
  s = decoder.Decode("mjpeg", jpeg, 64, 64, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;

  // The limit is inclusive.
  DecodeLimits limits;
  limits.max_pixels = int64_t{kWidth} * kHeight - 1;
  s = decoder.Decode("mjpeg", Bytes("cj444.jpg"), 0, 0, limits, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  limits.max_pixels += 1;
  s = decoder.Decode("mjpeg", Bytes("cj444.jpg"), 0, 0, limits, &img);
  EXPECT_TRUE(s.ok()) << s;
  ExpectStillDecodes(decoder);
}

TEST_F(ImageDecoderTest, PngHeaderOverThePixelLimit) {
  std::string png = Bytes("rgb24.png");
  // Signature (8), IHDR length (4), "IHDR", width (4), height (4), big-endian. The chunk CRC no
  // longer matches, but the size is refused before FFmpeg sees the file.
  ASSERT_EQ(png.substr(12, 4), "IHDR");
  for (size_t at : {size_t{16}, size_t{20}}) {
    const uint32_t v = 100000;
    for (int b = 0; b < 4; ++b) png[at + b] = char(v >> (24 - 8 * b));
  }
  ImageDecoder decoder;
  RgbImage img;
  absl::Status s = decoder.Decode("png", png, 0, 0, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "PNG header says 100000x100000 = 10000000000 pixels, over the limit of 33177600 "
            "(limits.max_pixels)");
  DecodeLimits limits;
  limits.max_pixels = int64_t{kWidth} * kHeight - 1;
  s = decoder.Decode("png", Bytes("rgb24.png"), 0, 0, limits, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ExpectStillDecodes(decoder);
}

TEST_F(ImageDecoderTest, RandomBytes) {
  std::string noise(4096, '\0');
  uint64_t x = 7;
  for (char& c : noise) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = char(x >> 56);
  }
  ImageDecoder decoder;
  RgbImage img;
  for (const char* codec : {"mjpeg", "png", "bmp"}) {
    absl::Status s = decoder.Decode(codec, noise, 0, 0, DecodeLimits{}, &img);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << codec << ": " << s;
    EXPECT_TRUE(Mentions(s, std::string(codec) + ": ")) << s;
  }
  absl::Status s = decoder.Decode("mjpeg", noise, 0, 0, DecodeLimits{}, &img);
  EXPECT_TRUE(Mentions(s, "Not a JPEG file")) << s;
  s = decoder.Decode("png", noise, 0, 0, DecodeLimits{}, &img);
  EXPECT_TRUE(Mentions(s, "png: not a PNG file")) << s;
  // Random bytes behind a valid signature.
  s = decoder.Decode("png", Bytes("rgb24.png").substr(0, 8) + noise, 0, 0, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  ExpectStillDecodes(decoder);
}

TEST_F(ImageDecoderTest, TruncatedPng) {
  const std::string png = Bytes("rgb24.png");
  ImageDecoder decoder;
  RgbImage img;
  // ffmpeg writes IHDR, pHYs, then IDAT chunks of 4096 bytes, then IEND.
  ASSERT_EQ(png.substr(54 + 4, 4), "IDAT");
  ASSERT_EQ(png.substr(4162 + 4, 4), "IDAT");
  // In the signature, in IHDR, before the first IDAT, between two IDATs (a cut a chunk walk
  // cannot see), at half, and inside the last IDAT (IEND is the last 12 bytes).
  for (size_t cut :
       {size_t{5}, size_t{20}, size_t{54}, size_t{4162}, png.size() / 2, png.size() - 40}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    absl::Status s = decoder.Decode("png", png.substr(0, cut), 0, 0, DecodeLimits{}, &img);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_TRUE(Mentions(s, cut < 8 ? "png: not a PNG file" : "png: truncated")) << s;
  }
  // Only IEND missing: every pixel is there (FFmpeg accepts it), but the file is still cut.
  absl::Status s =
      decoder.Decode("png", png.substr(0, png.size() - 12), 0, 0, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(Mentions(
      s, "png: truncated PNG: " + std::to_string(png.size() - 12) + " bytes and no IEND chunk"))
      << s;
  s = decoder.Decode("png", png.substr(0, 4162), 0, 0, DecodeLimits{}, &img);
  EXPECT_TRUE(Mentions(s, "png: truncated PNG: 4162 bytes and no IEND chunk")) << s;
  s = decoder.Decode("png", png.substr(0, png.size() - 40), 0, 0, DecodeLimits{}, &img);
  EXPECT_TRUE(Mentions(s, "the IDAT chunk at byte")) << s;
  // Bytes after IEND are ignored, as by FFmpeg.
  s = decoder.Decode("png", png + "trailing", 0, 0, DecodeLimits{}, &img);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(decoder.images_decoded(), 1u);
  ExpectStillDecodes(decoder);
}

TEST_F(ImageDecoderTest, PngChunkWithBadCrc) {
  std::string png = Bytes("rgb24.png");
  png[png.size() / 2] ^= 0x01;  // inside an IDAT chunk: only its CRC can tell
  ImageDecoder decoder;
  RgbImage img;
  absl::Status s = decoder.Decode("png", png, 0, 0, DecodeLimits{}, &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(ImageDecoderTest, PngCompressedMetadataIsSkipped) {
  // zTXt and iCCP chunks that inflate to 8 MiB each (FFmpeg would inflate them, unbounded):
  // the pixels are those of the file without them.
  const std::string script = R"(
import struct, sys, zlib
png = open(sys.argv[1], 'rb').read()
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
bomb = zlib.compress(b'\0' * (8 << 20), 9)
extra = chunk(b'zTXt', b'Comment\0\0' + bomb) + chunk(b'iCCP', b'icc\0\0' + bomb)
at = 8 + 25  # after the signature and IHDR
open(sys.argv[2], 'wb').write(png[:at] + extra + png[at:])
)";
  ASSERT_SH("python3 -c " + ShellQuote(script) + " " + ShellQuote(Image("rgba.png")) + " " +
            ShellQuote(Path("rgba_meta.png")));
  ASSERT_GT(Bytes("rgba_meta.png").size(), Bytes("rgba.png").size() + 16000);
  ImageDecoder decoder;
  RgbImage img;
  absl::Status s = decoder.Decode("png", Bytes("rgba_meta.png"), 0, 0, DecodeLimits{}, &img);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(SameImage(img, FfmpegRgb("rgba.png")));
}

// Frames imported with the CLI, read back through Dataset, decode to djpeg's (and ffmpeg's)
// pixels of the original files.
TEST_F(ImageDecoderTest, ImportedFramesDecodeFromTheDataset) {
  TempDir dir;
  const std::string in = dir.Join("in"), ds = dir.Join("ds");
  const std::string ep = in + "/ep_0000";
  fs::create_directories(ep + "/overhead");
  fs::create_directories(ep + "/side");
  ASSERT_SH(kFfmpeg + " -f lavfi -i testsrc2=size=320x240:rate=5 -frames:v 3 " +
            ShellQuote(ep + "/overhead/%06d.jpg"));
  ASSERT_SH(kFfmpeg + " -f lavfi -i testsrc2=size=160x96:rate=5 -frames:v 3 -pix_fmt rgba " +
            ShellQuote(ep + "/side/%06d.png"));
  WriteFile(ep + "/episode.json", R"({"rates": {"overhead": 5, "side": 5}})");
  ASSERT_SH(std::string(CONVEYOR_CLI) + " import --quiet --from " + ShellQuote(in) + " --out " +
            ShellQuote(ds));

  auto dataset = Dataset::Open(ds);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto index = (*dataset)->LoadEpisode(0);
  ASSERT_TRUE(index.ok()) << index.status();
  ImageDecoder decoder;
  RgbImage img;
  std::string packet;
  int checked = 0;
  for (int s = 0; s < (*index)->streams_size(); ++s) {
    const auto& stream = (*index)->streams(s);
    if (stream.kind() != format::v1::IMAGE) continue;
    const std::string& codec = stream.codec().codec();
    SCOPED_TRACE(stream.name() + " (" + codec + ")");
    ASSERT_EQ(stream.num_frames(), 3u);
    ASSERT_EQ(codec, stream.name() == "overhead" ? "mjpeg" : "png");
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE((*dataset)->ReadPacket(**index, s, i, &packet).ok());
      // The original file, beside the suite's images for Djpeg / FfmpegRgb.
      const std::string ext = codec == "mjpeg" ? ".jpg" : ".png";
      const std::string copy = "e2e_" + stream.name() + std::to_string(i) + ext;
      fs::copy_file(ep + "/" + stream.name() + "/00000" + std::to_string(i + 1) + ext, Path(copy),
                    fs::copy_options::overwrite_existing);
      absl::Status st = decoder.Decode(codec, packet, 0, 0, DecodeLimits{}, &img);
      ASSERT_TRUE(st.ok()) << st;
      if (codec == "mjpeg") {
        EXPECT_TRUE(SameImage(img, Djpeg(copy)));
        st = decoder.Decode(codec, packet, 160, 120, DecodeLimits{}, &img);
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_TRUE(SameImage(img, Djpeg(copy, "1/2")));
      } else {
        EXPECT_TRUE(SameImage(img, FfmpegRgb(copy, 160, 96)));
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);
  EXPECT_EQ(decoder.scaled_decodes(), 3u);
}

// A binary PPM with maxval 255 is copied straight out (ImageDecoder's fast path, for HDF5's raw
// camera arrays): equal to libavcodec's decode of the same file, as the ffmpeg CLI gives it, with
// and without a comment in the header; a grey PGM likewise, replicated to R = G = B. A 16-bit PPM (maxval 65535) still goes through
// libavcodec, and agrees with the CLI too; a short one is an error.
TEST(PpmFastPath, EqualsFfmpegDecode) {
  TempDir dir;
  std::string samples(37 * 23 * 3, '\0');
  uint32_t x = 12345;
  for (char& c : samples) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  const std::vector<std::string> files = {"P6\n37 23\n255\n" + samples,
                                          "P6 # a comment\n37\t23 255 " + samples};
  ImageDecoder decoder;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string ppm = dir.Join("x" + std::to_string(i) + ".ppm");
    WriteFile(ppm, files[i]);
    const std::string raw = dir.Join("x" + std::to_string(i) + ".rgb");
    ASSERT_SH(kFfmpeg + " -i " + ShellQuote(ppm) + " -f rawvideo -pix_fmt rgb24 " + ShellQuote(raw));
    RgbImage img;
    ASSERT_TRUE(decoder.Decode("ppm", files[i], 0, 0, DecodeLimits{}, &img).ok());
    EXPECT_EQ(img.width, 37);
    EXPECT_EQ(img.height, 23);
    EXPECT_EQ(std::string(img.pixels.begin(), img.pixels.end()), ReadFile(raw)) << i;
    EXPECT_EQ(std::string(img.pixels.begin(), img.pixels.end()), samples);
  }
  // 16-bit samples: libavcodec and libswscale, as the CLI.
  const std::string wide = "P6\n37 23\n65535\n" + samples + samples;
  WriteFile(dir.Join("w.ppm"), wide);
  ASSERT_SH(kFfmpeg + " -i " + ShellQuote(dir.Join("w.ppm")) + " -f rawvideo -pix_fmt rgb24 " +
            ShellQuote(dir.Join("w.rgb")));
  RgbImage img;
  ASSERT_TRUE(decoder.Decode("ppm", wide, 0, 0, DecodeLimits{}, &img).ok());
  EXPECT_EQ(std::string(img.pixels.begin(), img.pixels.end()), ReadFile(dir.Join("w.rgb")));
  EXPECT_FALSE(decoder.Decode("ppm", files[0].substr(0, 500), 0, 0, DecodeLimits{}, &img).ok());
  DecodeLimits small;
  small.max_pixels = 100;
  EXPECT_EQ(decoder.Decode("ppm", files[0], 0, 0, small, &img).code(),
            absl::StatusCode::kResourceExhausted);
  // A grey PGM (every value 0..255): R = G = B, as the CLI's gray to rgb24.
  std::string grey(37 * 23, '\0');
  for (size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<char>(i * 7 % 256);
  const std::string pgm = "P5\n37 23\n255\n" + grey;
  WriteFile(dir.Join("g.pgm"), pgm);
  ASSERT_SH(kFfmpeg + " -i " + ShellQuote(dir.Join("g.pgm")) + " -f rawvideo -pix_fmt rgb24 " +
            ShellQuote(dir.Join("g.rgb")));
  ASSERT_TRUE(decoder.Decode("pgm", pgm, 0, 0, DecodeLimits{}, &img).ok());
  EXPECT_EQ(std::string(img.pixels.begin(), img.pixels.end()), ReadFile(dir.Join("g.rgb")));
}

}  // namespace
}  // namespace conveyor
