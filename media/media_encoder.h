// Encoding rendered video frames and audio samples with libavcodec into a stream the
// DatasetWriter stores (packets, codec parameters, time base). Used by `conveyor synth`; the
// encoders are set up for deterministic output: the same input gives the same bytes on every run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/dataset_writer.h"

namespace conveyor {

// Bytes VideoEncoder::Encode reads past the last pixel of a frame: libswscale's SIMD readers
// load up to 16 bytes beyond it, and those bytes reach the output, so they must be zeroed.
inline constexpr size_t kVideoEncoderInputPadding = 16;

// True for the video codecs VideoEncoder knows: h264 (libx264), hevc (libx265), av1 (libsvtav1,
// else libaom-av1) and vp9 (libvpx-vp9). Says nothing about whether this FFmpeg build has them.
bool IsKnownVideoCodec(const std::string& codec);
// True for the audio codecs EncodeMonoAudio knows: aac, opus (libopus, else FFmpeg's own) and flac.
bool IsKnownAudioCodec(const std::string& codec);

// OK when this FFmpeg build has an encoder for `codec`, so a caller can fail before any work.
// INVALID_ARGUMENT for an unknown codec; FAILED_PRECONDITION naming the encoder looked for when
// the build lacks it.
absl::Status CheckVideoEncoderAvailable(const std::string& codec);
absl::Status CheckAudioEncoderAvailable(const std::string& codec);

struct VideoEncoderOptions {
  std::string codec = "h264";  // see IsKnownVideoCodec
  int width = 0;               // REQUIRES: even and > 0 (4:2:0 chroma)
  int height = 0;              // REQUIRES: even and > 0
  double fps = 30;             // frames per second; the time base is 1/fps (as av_d2q rounds it)
  // Keyframe interval in frames. Scene-cut keyframes are off, so keyframes come exactly every
  // `gop` frames. h264 and hevc use up to 2 B-frames, av1 and vp9 none.
  int gop = 30;
};

// One video stream: RGB24 frames in, YUV 4:2:0 packets out. The encoder runs single-threaded and
// x264's instruction sets are capped at AVX2 (its AVX-512 kernels gave different bytes from run to
// run), so output is deterministic; run several encoders in parallel for speed.
//
// Not thread-safe: one thread uses an encoder. Encoders are independent of each other.
class VideoEncoder {
 public:
  // `where` names the stream in every error ("synth episode 3, stream 'cam0'").
  static absl::StatusOr<std::unique_ptr<VideoEncoder>> Open(const VideoEncoderOptions& options,
                                                            const std::string& where);
  ~VideoEncoder();
  VideoEncoder(const VideoEncoder&) = delete;
  VideoEncoder& operator=(const VideoEncoder&) = delete;

  // Encodes one frame with presentation time `pts` (in frames). `rgb` is width x height packed
  // RGB24, row-major, followed by at least kVideoEncoderInputPadding zero bytes.
  absl::Status Encode(std::span<const uint8_t> rgb, int64_t pts);

  // Drains the frames the encoder still holds and returns the stream: kind VIDEO, codec, rate
  // (fps), shape [height, width, 3], pix_fmt, codec parameters, time base, pts_origin 0 and every
  // packet in decode order. info.name is left empty for the caller. Call once, last.
  absl::StatusOr<EpisodeData::Stream> Finish();

 private:
  struct Impl;
  explicit VideoEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct AudioEncoderOptions {
  std::string codec = "aac";  // see IsKnownAudioCodec
  // Samples per second. opus takes 8, 12, 16, 24 or 48 kHz only; others are an error from Open.
  int sample_rate = 16000;
};

// Encodes mono `samples` (floats in [-1, 1]) into one audio stream: kind AUDIO, codec, rate,
// shape [1], names ["mono"], codec parameters, time base 1/sample_rate, pts_origin 0 and the
// packets in decode order. aac and opus at 32 kbit/s; flac lossless. The encoder's first sample
// format of float, s16 or s32 (packed or planar) is used. info.name is left empty for the caller.
// `where` names the stream in every error.
absl::StatusOr<EpisodeData::Stream> EncodeMonoAudio(const AudioEncoderOptions& options,
                                                    const std::vector<float>& samples,
                                                    const std::string& where);

}  // namespace conveyor
