// Frame-exact random access into a stored VIDEO stream: decode frame k of an episode's camera the
// way `ffmpeg -i FILE` would show it, starting at the keyframe the shard index names, without
// demuxing or probing anything.
//
// Frame k is the k-th frame in presentation order among the frames that are shown: packets at or
// after the stream's pts_origin (frames before it are decoded as references but, like FFmpeg's
// edit-list handling, never shown) and not flagged discard. Pixels are converted with libswscale
// exactly as the ffmpeg CLI's auto-inserted scaler does (bicubic flags, the frame's colour matrix
// and range), and a 90/180/270 degree display rotation is applied the way the CLI's autorotate
// does (on the decoded planes, before conversion), so frame k equals `ffmpeg -i FILE -pix_fmt
// rgb24` frame k byte for byte. See docs/sampling.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "format/format_fwd.h"
#include "media/decode_common.h"
#include "media/frame_decoder.h"

namespace conveyor {

// The size frames of `stream` are delivered at before any resize: the coded size from its codec
// parameters, width and height swapped when `autorotate` applies a quarter turn. What a crop
// can be drawn from before decoding.
struct DisplayedSize {
  int width = 0;
  int height = 0;
};
DisplayedSize DisplayedSizeOf(const format::v1::StreamIndex& stream, bool autorotate);

// libswscale's flags for `f`.
int SwsFlagsFor(ResizeFilter f);

// The CPU backend of FrameDecoder (media/frame_decoder.h). Synchronous, no threads inside (one
// libavcodec thread), reused across samples and episodes by one thread. It remembers where it is
// in the stream it decoded last, so reading frames of one episode forward continues decoding
// instead of seeking; the codec context stays open while the codec parameters stay the same.
class VideoDecoder final : public FrameDecoder {
 public:
  VideoDecoder();
  ~VideoDecoder() override;
  VideoDecoder(const VideoDecoder&) = delete;
  VideoDecoder& operator=(const VideoDecoder&) = delete;

  // FrameDecoder::Decode; `stream_key` also says which kept frames (keep_recent) belong to the
  // stream.
  absl::Status Decode(uint64_t stream_key, const format::v1::StreamIndex& stream,
                      const FrameTable& table, PacketReader read, std::span<const int64_t> frames,
                      const VideoOutput& output, const DecodeLimits& limits,
                      std::vector<RgbImage>* out) override;

  const FrameDecoderStats& stats() const override { return stats_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  FrameDecoderStats stats_;
};

}  // namespace conveyor
