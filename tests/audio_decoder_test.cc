// AudioDecoder against the ffmpeg command line, the independent tool the golden samples come
// from: audio files made by ffmpeg (a stereo chirp in AAC/M4A, Opus/Ogg, FLAC, PCM/WAV, MP3),
// imported with `conveyor import`, read back through Dataset::ReadPacket, and compared with
// `ffmpeg -i FILE -f f32le` (native rate) and `ffmpeg -i FILE -ar R -ac C -f f32le` (resampled).
#include "media/audio_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "tests/support/test_env.h"

namespace conveyor {

// Test names and failure messages say which method (gtest finds this by argument lookup).
void PrintTo(AudioMethod m, std::ostream* os) {
  *os << (m == AudioMethod::kChunks ? "AudioMethod::kChunks" : "AudioMethod::kPerWindow");
}

namespace {

namespace pb = format::v1;
using conveyor::testing::CommandResult;
using conveyor::testing::ReadFile;
using conveyor::testing::RunCommand;
using conveyor::testing::ShellQuote;
using conveyor::testing::TempDir;
using conveyor::testing::WriteFile;

using conveyor::testing::kFfmpeg;
using conveyor::testing::Sh;

// A stereo chirp (different in each channel and episode) of `seconds` at `rate` Hz.
std::string Chirp(int rate, double seconds, int episode) {
  const std::string f0 = std::to_string(150 + 40 * episode);
  return "aevalsrc=0.5*sin(2*PI*(" + f0 + "+400*t)*t)|0.4*sin(2*PI*(" + f0 +
         "+90+150*t)*t+1):s=" + std::to_string(rate) + ":d=" + std::to_string(seconds);
}

// The codecs under test: stream name (= file stem), file extension, encoder arguments, rate, and
// the largest difference from the CLI's samples allowed in a native-rate window (0: bit-exact).
//
// "aac" is encoded without perceptual noise substitution (PNS), "aac_pns" with it (FFmpeg's
// default). PNS fills bands the encoder finds noise-like with noise from the decoder's own
// generator, whose state depends on every packet decoded since the decoder was opened: a window
// decoded from two packets before it (as here) gets different noise of the same band energy than
// a decode from the start of the file (as the CLI's), so it cannot be bit-exact. For this tonal
// chirp those bands carry little energy (differences measured up to 1.4e-5); 1e-4 bounds them.
// A window at t = 0 decodes from the first packet, as the CLI does, and is exact.
struct CodecCase {
  std::string stream;
  std::string ext;
  std::string encode;
  int rate;
  float tol = 0;
};
const std::vector<CodecCase>& Codecs() {
  static const auto* cases = new std::vector<CodecCase>{
      {"aac", "m4a", "-c:a aac -b:a 128k -aac_pns 0", 44100},
      {"aac_pns", "m4a", "-c:a aac -b:a 128k", 44100, 1e-4f},
      {"opus", "ogg", "-c:a libopus -b:a 96k", 48000},
      {"flac", "flac", "-c:a flac", 44100},
      {"pcm", "wav", "-c:a pcm_s16le", 44100},
      {"mp3", "mp3", "-c:a libmp3lame -b:a 128k", 44100},
  };
  return *cases;
}

std::vector<float> ReadF32(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// Two episodes of every codec, imported; the ffmpeg CLI's decoding of each source file. Every
// test runs with both methods (AudioMethod): the contract is the same.
class AudioDecoderTest : public ::testing::TestWithParam<AudioMethod> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string src = dir_->Join("src");
    const double seconds[2] = {3.0, 2.0};
    for (int e = 0; e < 2; ++e) {
      const std::string ep = src + "/ep_000" + std::to_string(e);
      ASSERT_EQ(Sh("mkdir -p " + ShellQuote(ep)), "");
      for (const CodecCase& c : Codecs()) {
        const std::string file = ep + "/" + c.stream + "." + c.ext;
        ASSERT_EQ(Sh(kFfmpeg + " -f lavfi -i '" + Chirp(c.rate, seconds[e], e) + "' " + c.encode +
                     " " + ShellQuote(file)),
                  "");
        const std::string golden = dir_->Join(c.stream + std::to_string(e) + ".f32");
        ASSERT_EQ(Sh(kFfmpeg + " -i " + ShellQuote(file) + " -f f32le " + ShellQuote(golden)), "");
        (*golden_)[{e, c.stream}] = ReadF32(golden);
      }
    }
    ASSERT_EQ(Sh(std::string(CONVEYOR_CLI) + " import --quiet --from " + ShellQuote(src) +
                 " --out " + ShellQuote(dir_->Join("ds"))),
              "");
    auto ds = Dataset::Open(dir_->Join("ds"));
    ASSERT_TRUE(ds.ok()) << ds.status();
    dataset_ = ds->release();
  }
  static void TearDownTestSuite() {
    delete dataset_;
    dataset_ = nullptr;
    delete dir_;
    dir_ = nullptr;
    golden_->clear();
  }

  // The CLI's samples of a source file, decoded again with extra output options (resampling).
  static std::vector<float> Golden(int episode, const std::string& stream,
                                   const std::string& options) {
    for (const CodecCase& c : Codecs()) {
      if (c.stream != stream) continue;
      const std::string file =
          dir_->Join("src/ep_000" + std::to_string(episode) + "/" + c.stream + "." + c.ext);
      const std::string out = dir_->Join("golden.f32");
      const std::string err =
          Sh(kFfmpeg + " -i " + ShellQuote(file) + " " + options + " -f f32le " + ShellQuote(out));
      EXPECT_EQ(err, "");
      return ReadF32(out);
    }
    ADD_FAILURE() << "no stream " << stream;
    return {};
  }

  struct Loaded {
    std::shared_ptr<const pb::EpisodeIndex> index;
    int stream = -1;
    const pb::StreamIndex& Stream() const { return index->streams(stream); }
  };
  static Loaded Load(const Dataset& ds, int episode, const std::string& name) {
    Loaded l;
    auto index = ds.LoadEpisode(static_cast<size_t>(episode));
    EXPECT_TRUE(index.ok()) << index.status();
    if (!index.ok()) return l;
    l.index = *index;
    for (int i = 0; i < l.index->streams_size(); ++i) {
      if (l.index->streams(i).name() == name) l.stream = i;
    }
    EXPECT_GE(l.stream, 0) << name;
    return l;
  }

  static absl::Status Decode(AudioDecoder& dec, const Dataset& ds, const Loaded& l, double start_s,
                             int64_t n, int rate, int channels, std::vector<float>* out,
                             std::vector<uint8_t>* pad, const DecodeLimits& limits = {}) {
    return dec.DecodeWindow(
        l.Stream(),
        [&](size_t packet, std::string* bytes) {
          return ds.ReadPacket(*l.index, l.stream, packet, bytes);
        },
        start_s, n, rate, channels, limits, out, pad);
  }

  static TempDir* dir_;
  static Dataset* dataset_;
  static std::map<std::pair<int, std::string>, std::vector<float>>* golden_;
};

TempDir* AudioDecoderTest::dir_ = nullptr;
Dataset* AudioDecoderTest::dataset_ = nullptr;
std::map<std::pair<int, std::string>, std::vector<float>>* AudioDecoderTest::golden_ =
    new std::map<std::pair<int, std::string>, std::vector<float>>();

// Compares window samples [from, to) (frames of `channels`) with `golden` starting at golden frame
// `golden_first`: exactly when tol is 0, else |a - b| <= tol. Returns a message for the first
// difference, or "".
std::string Compare(const std::vector<float>& got, const std::vector<float>& golden, int channels,
                    int64_t from, int64_t to, int64_t golden_first, float tol) {
  float worst = 0;
  int64_t worst_at = -1;
  for (int64_t j = from; j < to; ++j) {
    for (int c = 0; c < channels; ++c) {
      const size_t gi = static_cast<size_t>((golden_first + j) * channels + c);
      if (gi >= golden.size()) return "golden too short at frame " + std::to_string(j);
      const float a = got[static_cast<size_t>(j * channels + c)], b = golden[gi];
      const bool same = tol == 0 ? std::memcmp(&a, &b, sizeof(float)) == 0 : std::abs(a - b) <= tol;
      if (!same && tol == 0) {
        return "frame " + std::to_string(j) + " channel " + std::to_string(c) + ": " +
               std::to_string(a) + " vs ffmpeg " + std::to_string(b);
      }
      if (std::abs(a - b) > worst) {
        worst = std::abs(a - b);
        worst_at = j;
      }
    }
  }
  if (tol != 0 && worst > tol) {
    return "max difference " + std::to_string(worst) + " at frame " + std::to_string(worst_at);
  }
  return "";
}

// At the stream's rate and channels, every window equals the CLI's samples at the same offset,
// bit for bit, for every codec. Windows are decoded out of order (pre-roll, flushes), including
// ones that start on and between packet boundaries and one that starts at t = 0.
TEST_P(AudioDecoderTest, NativeWindowsEqualFfmpegExactly) {
  for (const CodecCase& c : Codecs()) {
    SCOPED_TRACE(c.stream);
    const Loaded l = Load(*dataset_, 0, c.stream);
    ASSERT_GE(l.stream, 0);
    const std::vector<float>& golden = golden_->at({0, c.stream});
    const int64_t golden_frames = static_cast<int64_t>(golden.size() / 2);
    AudioDecoder dec(GetParam());
    const int64_t starts[] = {54321, 0, 1024, 100000, 23, 1 * c.rate, 2 * c.rate + 777};
    const int64_t n = c.rate / 2;
    for (int64_t s : starts) {
      SCOPED_TRACE("window at sample " + std::to_string(s));
      std::vector<float> out;
      std::vector<uint8_t> pad;
      ASSERT_TRUE(
          Decode(dec, *dataset_, l, static_cast<double>(s) / c.rate, n, c.rate, 0, &out, &pad)
              .ok());
      ASSERT_EQ(out.size(), static_cast<size_t>(n * 2));
      const int64_t to = std::min(n, golden_frames - s);
      EXPECT_EQ(Compare(out, golden, 2, 0, to, s, s == 0 ? 0 : c.tol), "");
      for (int64_t j = 0; j < to; ++j) ASSERT_EQ(pad[static_cast<size_t>(j)], 0) << j;
    }
  }
}

// With resampling (down, up, channel mixing only) the output equals the CLI's resampled samples
// bit for bit in the window's interior (tolerance 0): libswresample runs with the CLI's defaults
// on the same float input, and the decoder starts it on an input sample that falls on the output
// grid, so every output sample sees the same filter phase and the same input. They could differ
// only within the filter's reach (~16 output samples from 44.1 to 16 kHz) of where the two
// resamplers start: the CLI's at t = 0, mirroring its first samples as history, this decoder's a
// few hundred input samples before the window. The test leaves 64 samples at the stream's end.
TEST_P(AudioDecoderTest, ResampledWindowsMatchFfmpeg) {
  struct Case {
    std::string stream;
    int rate;
    int channels;
    std::string options;
  };
  const Case cases[] = {
      {"aac", 16000, 1, "-ar 16000 -ac 1"}, {"opus", 16000, 1, "-ar 16000 -ac 1"},
      {"pcm", 48000, 2, "-ar 48000"},       {"flac", 44100, 1, "-ac 1"},
      {"mp3", 22050, 2, "-ar 22050"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.stream + " " + c.options);
    const Loaded l = Load(*dataset_, 0, c.stream);
    ASSERT_GE(l.stream, 0);
    const std::vector<float> golden = Golden(0, c.stream, c.options);
    AudioDecoder dec(GetParam());
    for (double start : {1.0, 0.25, 2.0}) {
      SCOPED_TRACE(start);
      std::vector<float> out;
      std::vector<uint8_t> pad;
      const int64_t n = c.rate * 3 / 4;
      ASSERT_TRUE(Decode(dec, *dataset_, l, start, n, c.rate, c.channels, &out, &pad).ok());
      ASSERT_EQ(out.size(), static_cast<size_t>(n * c.channels));
      const int64_t first = std::llround(start * c.rate);
      const int64_t golden_frames = static_cast<int64_t>(golden.size()) / c.channels;
      const int64_t to = std::min(n, golden_frames - first - 64);
      EXPECT_EQ(Compare(out, golden, c.channels, 0, to, first, 0), "");
    }
  }
}

// A window that starts before t = 0: zeros with is_pad = 1 there, then the stream's first samples.
TEST_P(AudioDecoderTest, PadsBeforeTheStart) {
  const Loaded l = Load(*dataset_, 0, "aac");
  const std::vector<float>& golden = golden_->at({0, "aac"});
  AudioDecoder dec(GetParam());
  std::vector<float> out;
  std::vector<uint8_t> pad;
  // The window [-1, 0] s around t = 0.3 s: its first 0.7 s are before the stream.
  ASSERT_TRUE(Decode(dec, *dataset_, l, 0.3 - 1.0, 44100, 44100, 0, &out, &pad).ok());
  const int64_t lead = 30870;  // 0.7 s
  for (int64_t j = 0; j < 44100; ++j) {
    ASSERT_EQ(pad[static_cast<size_t>(j)], j < lead ? 1 : 0) << j;
  }
  for (int64_t j = 0; j < lead * 2; ++j) ASSERT_EQ(out[static_cast<size_t>(j)], 0.0f) << j;
  EXPECT_EQ(Compare(out, golden, 2, lead, 44100, -lead, 0), "");

  // Resampled to 16 kHz mono: the same split, on the output grid.
  ASSERT_TRUE(Decode(dec, *dataset_, l, -0.7, 16000, 16000, 1, &out, &pad).ok());
  for (int64_t j = 0; j < 16000; ++j) {
    ASSERT_EQ(pad[static_cast<size_t>(j)], j < 11200 ? 1 : 0) << j;
    if (j < 11200) {
      ASSERT_EQ(out[static_cast<size_t>(j)], 0.0f) << j;
    }
  }
  const std::vector<float> golden16 = Golden(0, "aac", "-ar 16000 -ac 1");
  // Past the resampler's filter length after t = 0 (where the CLI mirrors its first samples and
  // this decoder sees the zeros before t = 0).
  EXPECT_EQ(Compare(out, golden16, 1, 11200 + 64, 16000, -11200, 0), "");

  // Entirely before the stream: all pad, nothing decoded.
  const uint64_t packets = dec.packets_decoded();
  ASSERT_TRUE(Decode(dec, *dataset_, l, -5.0, 1000, 44100, 0, &out, &pad).ok());
  EXPECT_EQ(dec.packets_decoded(), packets);
  EXPECT_TRUE(std::all_of(pad.begin(), pad.end(), [](uint8_t p) { return p == 1; }));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
}

// A window that runs past the end of the last packet: the stream's samples, then zeros with
// is_pad = 1. The end is the last packet's pts + duration:
// - PCM, FLAC: the CLI's last sample.
// - Opus: the Ogg granule of the last page cuts the last packet's duration, as the CLI cuts it.
// - AAC: the M4A edit list's duration (3 s) cuts the last packet's duration; the CLI does not
//   apply it there and outputs the whole last frame (820 samples more), so the golden is longer.
// - MP3: the LAME end padding is side data the format does not store (docs/format.md, Known
//   limits); the stream ends up to one frame (1152 samples) after the CLI's output.
TEST_P(AudioDecoderTest, PadsAfterTheEnd) {
  for (const std::string stream : {"pcm", "flac", "opus", "aac", "mp3"}) {
    SCOPED_TRACE(stream);
    const Loaded l = Load(*dataset_, 0, stream);
    const std::vector<float>& golden = golden_->at({0, stream});
    const int rate = l.Stream().codec().sample_rate();
    const int64_t golden_frames = static_cast<int64_t>(golden.size() / 2);
    AudioDecoder dec(GetParam());
    std::vector<float> out;
    std::vector<uint8_t> pad;
    const int64_t first = 3 * rate - rate / 5;
    ASSERT_TRUE(
        Decode(dec, *dataset_, l, static_cast<double>(first) / rate, rate, rate, 0, &out, &pad)
            .ok());
    const int64_t end = first + (std::find(pad.begin(), pad.end(), 1) - pad.begin());
    if (stream == "mp3") {
      EXPECT_GE(end, golden_frames);
      EXPECT_LT(end, golden_frames + 1152);
    } else {
      EXPECT_EQ(end, 3 * rate);
      // AAC: the CLI outputs whole frames of 1024 samples.
      EXPECT_EQ(golden_frames, stream == "aac" ? (3 * rate + 1023) / 1024 * 1024 : 3 * rate);
    }
    for (int64_t j = 0; j < rate; ++j) {
      ASSERT_EQ(pad[static_cast<size_t>(j)], first + j >= end ? 1 : 0) << j;
      if (first + j >= end) {
        ASSERT_EQ(out[static_cast<size_t>(2 * j)], 0.0f) << j;
        ASSERT_EQ(out[static_cast<size_t>(2 * j + 1)], 0.0f) << j;
      }
    }
    EXPECT_EQ(Compare(out, golden, 2, 0, std::min(end, golden_frames) - first, first, 0), "");
  }
}

// The same window gives the same bits whatever the decoder did before: other windows, other
// streams (the codec is reopened), other episodes, and a fresh decoder.
TEST_P(AudioDecoderTest, SameWindowSameBitsAfterOtherWork) {
  for (const CodecCase& c : Codecs()) {
    SCOPED_TRACE(c.stream);
    const Loaded l0 = Load(*dataset_, 0, c.stream);
    const Loaded l1 = Load(*dataset_, 1, c.stream);
    const Loaded other = Load(*dataset_, 0, c.stream == "aac" ? "opus" : "aac");
    for (const auto& [rate, channels] : std::vector<std::pair<int, int>>{{c.rate, 0}, {16000, 1}}) {
      AudioDecoder dec(GetParam());
      std::vector<float> first, again, scratch;
      std::vector<uint8_t> pad_first, pad_again, pad_scratch;
      ASSERT_TRUE(
          Decode(dec, *dataset_, l0, 1.234, rate / 2, rate, channels, &first, &pad_first).ok());
      ASSERT_TRUE(
          Decode(dec, *dataset_, l0, 1.5, rate, rate, channels, &scratch, &pad_scratch).ok());
      ASSERT_TRUE(
          Decode(dec, *dataset_, l1, 0.2, rate, rate, channels, &scratch, &pad_scratch).ok());
      ASSERT_TRUE(
          Decode(dec, *dataset_, other, 0.7, rate, rate, channels, &scratch, &pad_scratch).ok());
      ASSERT_TRUE(
          Decode(dec, *dataset_, l0, 1.234, rate / 2, rate, channels, &again, &pad_again).ok());
      ASSERT_EQ(first.size(), again.size());
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0);
      EXPECT_EQ(pad_first, pad_again);
      AudioDecoder fresh(GetParam());
      ASSERT_TRUE(
          Decode(fresh, *dataset_, l0, 1.234, rate / 2, rate, channels, &again, &pad_again).ok());
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0);
      EXPECT_EQ(dec.windows(), 5u);
      EXPECT_GT(dec.packets_decoded(), 0u);
    }
  }
}

// The second episode decodes as its own file does (the decoder crosses episodes cleanly).
TEST_P(AudioDecoderTest, SecondEpisodeEqualsFfmpeg) {
  AudioDecoder dec(GetParam());
  for (const CodecCase& c : Codecs()) {
    SCOPED_TRACE(c.stream);
    for (int e : {0, 1, 0, 1}) {
      const Loaded l = Load(*dataset_, e, c.stream);
      const std::vector<float>& golden = golden_->at({e, c.stream});
      std::vector<float> out;
      std::vector<uint8_t> pad;
      const int64_t s = c.rate / 3;
      ASSERT_TRUE(
          Decode(dec, *dataset_, l, static_cast<double>(s) / c.rate, c.rate, c.rate, 0, &out, &pad)
              .ok());
      EXPECT_EQ(Compare(out, golden, 2, 0, c.rate, s, c.tol), "");
    }
  }
}

TEST_P(AudioDecoderTest, BadRequestsAndLimits) {
  const Loaded l = Load(*dataset_, 0, "aac");
  AudioDecoder dec(GetParam());
  std::vector<float> out;
  std::vector<uint8_t> pad;
  DecodeLimits limits;
  limits.max_audio_samples = 48000;
  absl::Status s = Decode(dec, *dataset_, l, 0, 48001, 48000, 0, &out, &pad, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(out.empty());  // refused before allocating
  // The input a window needs counts too: 1 s at 16 kHz is 2.76 s of 44.1 kHz input.
  limits.max_audio_samples = 100000;
  s = Decode(dec, *dataset_, l, 0, 16000 * 5, 16000, 1, &out, &pad, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  limits.max_sample_bytes = 1000;
  s = Decode(dec, *dataset_, l, 0, 1000, 44100, 0, &out, &pad, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;

  for (int rate : {0, -16000, 100, 10000000}) {
    s = Decode(dec, *dataset_, l, 0, 100, rate, 0, &out, &pad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << rate << " " << s;
  }
  EXPECT_EQ(Decode(dec, *dataset_, l, 0, 100, 16000, -1, &out, &pad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Decode(dec, *dataset_, l, NAN, 100, 16000, 1, &out, &pad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Decode(dec, *dataset_, l, 0, -1, 16000, 1, &out, &pad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dec.windows(), 0u);
  // An empty window is fine.
  ASSERT_TRUE(Decode(dec, *dataset_, l, 0, 0, 16000, 1, &out, &pad).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(pad.empty());
}

// A source file with garbage in its packets (written before import, so the checksums agree):
// decoding a window over them is DATA_LOSS naming the codec and packet; the decoder then goes on
// to decode clean windows exactly.
TEST_P(AudioDecoderTest, CorruptPacketsAreDataLoss) {
  TempDir dir;
  const std::string ep = dir.Join("src/ep_0000");
  ASSERT_EQ(Sh("mkdir -p " + ShellQuote(ep)), "");
  const std::string file = ep + "/aac.m4a";
  ASSERT_EQ(Sh(kFfmpeg + " -f lavfi -i '" + Chirp(44100, 3, 0) + "' -c:a aac -b:a 128k " +
               "-movflags +faststart " + ShellQuote(file)),
            "");
  ASSERT_EQ(
      Sh(kFfmpeg + " -i " + ShellQuote(file) + " -f f32le " + ShellQuote(dir.Join("clean.f32"))),
      "");
  const std::vector<float> golden = ReadF32(dir.Join("clean.f32"));
  // Overwrite ~6 KB in the middle of the media data (after the moov atom, which +faststart puts
  // first) with pseudo-random bytes.
  std::string bytes = ReadFile(file);
  ASSERT_GT(bytes.size(), 30000u);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  const size_t at = bytes.size() / 2;
  for (size_t i = at; i < at + 6000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    bytes[i] = static_cast<char>(x);
  }
  WriteFile(file, bytes);
  ASSERT_EQ(Sh(std::string(CONVEYOR_CLI) + " import --quiet --from " + ShellQuote(dir.Join("src")) +
               " --out " + ShellQuote(dir.Join("ds"))),
            "");
  auto ds = Dataset::Open(dir.Join("ds"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Loaded l = Load(**ds, 0, "aac");
  AudioDecoder dec(GetParam());
  std::vector<float> out;
  std::vector<uint8_t> pad;
  const absl::Status s = Decode(dec, **ds, l, 0, 3 * 44100, 44100, 0, &out, &pad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("aac"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("packet"), absl::string_view::npos) << s;
  // The first 0.5 s lie before the damage and still equal the clean file.
  ASSERT_TRUE(Decode(dec, **ds, l, 0, 22050, 44100, 0, &out, &pad).ok());
  EXPECT_EQ(Compare(out, golden, 2, 0, 22050, 0, 0), "");
}

INSTANTIATE_TEST_SUITE_P(Methods, AudioDecoderTest,
                         ::testing::Values(AudioMethod::kPerWindow, AudioMethod::kChunks),
                         [](const ::testing::TestParamInfo<AudioMethod>& info) {
                           return info.param == AudioMethod::kPerWindow ? "PerWindow" : "Chunks";
                         });

// AudioMethod::kChunks on streams long enough for several chunks (4 s each): 10 s of AAC with and
// without PNS at 16 kHz mono and 44.1 kHz stereo (the benchmark's two kinds of stream: a chirp
// with noise, and a tone left with pink noise right, as the bench's import), MP3, Opus and FLAC.
struct LongCase {
  std::string stream;
  std::string ext;
  std::string source;  // lavfi graph
  std::string encode;
  bool pns;  // AAC with PNS (FFmpeg's encoder enables it by default)
  // The per-window method gives the CLI's samples for every window here (so the two methods give
  // the same bits). Not for PNS, nor for this low-rate Opus (SILK/hybrid at 16 kHz input): its
  // 0.8 s pre-roll does not converge for the window at 1 s, whose per-window decode starts at
  // 0.2 s; its chunk decodes from t = 0 and equals the CLI.
  bool per_window_exact = true;
};
const std::vector<LongCase>& LongCases() {
  const std::string mono16 =
      "aevalsrc=0.3*sin(2*PI*(200+60*t)*t)+0.05*(random(0)-0.5):s=16000:d=10";
  const std::string stereo44 =
      "sine=f=440:r=44100:d=10[l];anoisesrc=c=pink:r=44100:d=10:a=0.3[r];[l][r]amerge=inputs=2";
  static const auto* cases = new std::vector<LongCase>{
      {"aac16", "m4a", mono16, "-c:a aac -b:a 32k -aac_pns 0", false},
      {"aac44", "m4a", stereo44, "-c:a aac -b:a 128k -aac_pns 0", false},
      {"aac16_pns", "m4a", mono16, "-c:a aac -b:a 32k", true, false},
      {"aac44_pns", "m4a", stereo44, "-c:a aac -b:a 128k", true, false},
      {"mp3", "mp3", stereo44, "-c:a libmp3lame -b:a 128k", false},
      {"opus", "ogg", mono16, "-c:a libopus -b:a 32k", false, false},
      {"flac", "flac", stereo44, "-c:a flac", false},
  };
  return *cases;
}

class AudioChunkTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string ep = dir_->Join("src/ep_0000");
    ASSERT_EQ(Sh("mkdir -p " + ShellQuote(ep)), "");
    for (const LongCase& c : LongCases()) {
      const std::string file = ep + "/" + c.stream + "." + c.ext;
      ASSERT_EQ(Sh(kFfmpeg + " -f lavfi -i '" + c.source + "' " + c.encode + " " +
                   ShellQuote(file)),
                "");
      const std::string golden = dir_->Join(c.stream + ".f32");
      ASSERT_EQ(Sh(kFfmpeg + " -i " + ShellQuote(file) + " -f f32le " + ShellQuote(golden)), "");
      golden_[c.stream] = ReadF32(golden);
    }
    ASSERT_EQ(Sh(std::string(CONVEYOR_CLI) + " import --quiet --from " +
                 ShellQuote(dir_->Join("src")) + " --out " + ShellQuote(dir_->Join("ds"))),
              "");
    auto ds = Dataset::Open(dir_->Join("ds"));
    ASSERT_TRUE(ds.ok()) << ds.status();
    dataset_ = ds->release();
    auto index = dataset_->LoadEpisode(0);
    ASSERT_TRUE(index.ok()) << index.status();
    index_ = *index;
  }
  static void TearDownTestSuite() {
    delete dataset_;
    dataset_ = nullptr;
    index_.reset();
    delete dir_;
    dir_ = nullptr;
    golden_.clear();
  }

  static int StreamOf(const std::string& name) {
    for (int i = 0; i < index_->streams_size(); ++i) {
      if (index_->streams(i).name() == name) return i;
    }
    ADD_FAILURE() << name;
    return 0;
  }

  // One window request: start, samples, rate (0: the stream's), channels (0: the stream's).
  struct Window {
    double start;
    double seconds;
    int rate;
    int channels;
  };
  // 1 s windows at the stream's rate and resampled to 16 kHz mono, at and across chunk
  // boundaries (4 s, 8 s), at t = 0, before it and past the end (10 s).
  static std::vector<Window> Windows() {
    std::vector<Window> v;
    for (double start : {0.0, 0.37, 1.0, 2.5, 3.2, 3.999, 4.0, 4.51, 6.0, 7.5, 8.0, 9.3, -0.4}) {
      v.push_back({start, 1.0, 0, 0});
      v.push_back({start, 1.0, 16000, 1});
    }
    v.push_back({0.0, 10.0, 0, 0});  // the whole stream: three chunks
    return v;
  }

  struct Result {
    absl::Status status;
    std::vector<float> out;
    std::vector<uint8_t> pad;
  };
  static Result Decode(AudioDecoder& dec, int stream, const Window& w) {
    const pb::StreamIndex& s = index_->streams(stream);
    const int rate = w.rate > 0 ? w.rate : s.codec().sample_rate();
    Result r;
    r.status = dec.DecodeWindow(
        s,
        [&](size_t packet, std::string* bytes) {
          return dataset_->ReadPacket(*index_, stream, packet, bytes);
        },
        w.start, std::llround(w.seconds * rate), rate, w.channels, DecodeLimits{}, &r.out, &r.pad);
    return r;
  }
  static bool Same(const Result& a, const Result& b) {
    return a.status.ok() && b.status.ok() && a.out.size() == b.out.size() && a.pad == b.pad &&
           std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)) == 0;
  }

  static TempDir* dir_;
  static Dataset* dataset_;
  static std::shared_ptr<const pb::EpisodeIndex> index_;
  static std::map<std::string, std::vector<float>> golden_;
};

TempDir* AudioChunkTest::dir_ = nullptr;
Dataset* AudioChunkTest::dataset_ = nullptr;
std::shared_ptr<const pb::EpisodeIndex> AudioChunkTest::index_;
std::map<std::string, std::vector<float>> AudioChunkTest::golden_;

// Where the per-window method gives the CLI's samples, the chunks give the same bits: the two
// methods are interchangeable there. Without PNS, native windows from chunks equal the CLI's.
TEST_F(AudioChunkTest, ChunksEqualPerWindowWithoutPns) {
  for (const LongCase& c : LongCases()) {
    if (c.pns) continue;
    SCOPED_TRACE(c.stream);
    const int stream = StreamOf(c.stream);
    const int channels = index_->streams(stream).codec().channels();
    const int rate = index_->streams(stream).codec().sample_rate();
    AudioDecoder per_window(AudioMethod::kPerWindow), chunks(AudioMethod::kChunks);
    for (const Window& w : Windows()) {
      SCOPED_TRACE(::testing::Message() << "window at " << w.start << " s, rate " << w.rate);
      const Result a = Decode(per_window, stream, w);
      const Result b = Decode(chunks, stream, w);
      ASSERT_TRUE(a.status.ok()) << a.status;
      ASSERT_TRUE(b.status.ok()) << b.status;
      if (c.per_window_exact) {
        EXPECT_TRUE(Same(a, b));
      }
      if (w.rate == 0 && w.start >= 0 && c.stream != "mp3") {  // MP3: the end differs (above)
        const int64_t first = std::llround(w.start * rate);
        const std::vector<float>& golden = golden_.at(c.stream);
        const int64_t golden_frames = static_cast<int64_t>(golden.size()) / channels;
        const int64_t n = static_cast<int64_t>(b.pad.size());
        const int64_t to = std::min(n, golden_frames - first);
        const int64_t real = std::find(b.pad.begin(), b.pad.end(), 1) - b.pad.begin();
        EXPECT_EQ(Compare(b.out, golden, channels, 0, std::min(to, real), first, 0), "");
      }
    }
    EXPECT_EQ(chunks.chunks_decoded(), 3u);  // 0-4 s, 4-8 s, 8-10 s, each once
  }
}

// With PNS the methods differ: a chunk's noise generator runs from the chunk's first packet, a
// window's from its own (both differ from the CLI's, which runs from the file's start). The
// per-window method stays what jobs recorded with it get (docs/pipeline.md "Schedule versions").
TEST_F(AudioChunkTest, PnsNoiseDiffersBetweenMethods) {
  for (const LongCase& c : LongCases()) {
    if (!c.pns) continue;
    SCOPED_TRACE(c.stream);
    const int stream = StreamOf(c.stream);
    AudioDecoder per_window(AudioMethod::kPerWindow), chunks(AudioMethod::kChunks);
    int differ = 0;
    for (const Window& w : Windows()) {
      const Result a = Decode(per_window, stream, w);
      const Result b = Decode(chunks, stream, w);
      ASSERT_TRUE(a.status.ok() && b.status.ok());
      if (!Same(a, b)) ++differ;
      // Both start at the file's first packet there.
      if (w.start == 0 && w.seconds == 1) {
        EXPECT_TRUE(Same(a, b));
      }
    }
    EXPECT_GT(differ, 0) << "the encoder used no PNS: the test no longer shows the difference";
  }
}

// A window's bits are a function of the stream and the window only: decoded alone by a fresh
// decoder, in order, in shuffled order, with the kept chunks dropped at random, and on 4 threads
// (each its own decoder and order, streams interleaved), every window is the same.
TEST_F(AudioChunkTest, WindowsArePureFunctionsOfTheWindow) {
  struct Job {
    int stream;
    Window w;
  };
  std::vector<Job> jobs;
  for (const LongCase& c : LongCases()) {
    for (const Window& w : Windows()) jobs.push_back({StreamOf(c.stream), w});
  }
  std::vector<Result> want(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    AudioDecoder fresh(AudioMethod::kChunks);
    want[i] = Decode(fresh, jobs[i].stream, jobs[i].w);
    ASSERT_TRUE(want[i].status.ok()) << want[i].status;
  }
  auto run = [&](uint64_t seed, bool clear, std::vector<std::string>* errors) {
    std::vector<size_t> order(jobs.size());
    std::iota(order.begin(), order.end(), size_t{0});
    uint64_t x = seed;
    auto next = [&x] {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return x;
    };
    if (seed != 0) {
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[next() % i]);
    }
    AudioDecoder dec(AudioMethod::kChunks);
    for (size_t i : order) {
      if (clear && next() % 5 == 0) dec.ClearChunkCache();
      const Result got = Decode(dec, jobs[i].stream, jobs[i].w);
      if (!Same(got, want[i])) {
        errors->push_back("seed " + std::to_string(seed) + ": job " + std::to_string(i) + " " +
                          got.status.ToString());
      }
      if (dec.chunk_cache_bytes() > (size_t{16} << 20)) errors->push_back("cache over 16 MiB");
    }
  };
  std::vector<std::string> errors;
  run(0, false, &errors);  // in order
  run(1, false, &errors);  // shuffled
  run(2, true, &errors);   // shuffled, chunks dropped at random
  std::vector<std::vector<std::string>> thread_errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { run(10 + t, t % 2 == 1, &thread_errors[t]); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& e : thread_errors) errors.insert(errors.end(), e.begin(), e.end());
  EXPECT_TRUE(errors.empty()) << errors.size() << " mismatches, first: " << errors.front();
}

}  // namespace
}  // namespace conveyor
