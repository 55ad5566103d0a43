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
#include "media/decode_common.h"
#include "format/format_fwd.h"

namespace conveyor {

// The shown frames of one VIDEO or IMAGE stream of one episode, in presentation order, with the
// packet each one needs decoding to start from. Built once per episode and stream from the
// episode index; O(packets log packets).
struct FrameTable {
  std::vector<int64_t> pts;            // presentation order, strictly increasing
  std::vector<double> time_s;          // seconds on the episode clock
  std::vector<uint32_t> packet;        // decode-order packet of frame k
  std::vector<uint32_t> start_packet;  // keyframe packet to start decoding at for frame k

  size_t size() const { return pts.size(); }
  // The frame whose time is nearest to `t` (ties go to the earlier frame); -1 when empty.
  int64_t Nearest(double t) const;
  // The last frame at or before `t`; 0 when `t` is before the first frame; -1 when empty.
  int64_t AtOrBefore(double t) const;

  // INVALID_ARGUMENT/DATA_LOSS for a stream without packets, duplicate or missing presentation
  // timestamps, or no keyframe before a shown frame.
  static absl::StatusOr<FrameTable> Build(const format::v1::StreamIndex& stream);
};

// The size frames of `stream` are delivered at before any resize: the coded size from its codec
// parameters, width and height swapped when `autorotate` applies a quarter turn. What a crop
// can be drawn from before decoding.
struct DisplayedSize {
  int width = 0;
  int height = 0;
};
DisplayedSize DisplayedSizeOf(const format::v1::StreamIndex& stream, bool autorotate);

// Resizing filter for VideoDecoder and image resizes (libswscale's).
enum class ResizeFilter { kBilinear, kBicubic, kArea, kNearest, kLanczos };
int SwsFlagsFor(ResizeFilter f);

// A rectangle of the displayed frame (after rotation), in pixels.
struct VideoCrop {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

struct VideoOutput {
  // Output size in pixels (after rotation); 0x0 = the frame's own size (or the crop's). Scaling
  // happens in the same libswscale pass as the RGB conversion.
  int width = 0;
  int height = 0;
  ResizeFilter filter = ResizeFilter::kBilinear;
  // Crop before scaling, in the decoder's pixel format: one libswscale pass from the rectangle
  // of the decoded planes to the output size and RGB, as `ffmpeg -i FILE -vf
  // crop=W:H:X:Y,scale=OW:OH:flags=F -pix_fmt rgb24` does (bit for bit). Like the CLI's crop
  // filter, x, y, width and height are rounded down to the chroma subsampling (even for 4:2:0),
  // so the chroma planes are cut on whole samples. With 0x0 output, the output is the rounded
  // rectangle's size. Formats whose planes cannot
  // be cut that way (bitstream, packed subsampled, or rotated only after conversion) are
  // converted to RGB at full size first and cropped there. The rectangle must lie inside the
  // displayed frame (INVALID_ARGUMENT otherwise, naming both).
  std::optional<VideoCrop> crop;
  // Apply the stream's display rotation when it is a multiple of 90 degrees (as the ffmpeg CLI
  // does by default).
  bool autorotate = true;
  // Keep the last few delivered frames (up to 8, 32 MB) so the next call can take frames just
  // behind the decoder's position without seeking back: what windows of several frames
  // ([-0.1, 0.0]) over consecutive samples need. Costs one copy per delivered frame.
  bool keep_recent = false;
};

// Counters since construction. amplification = frames_decoded / frames_delivered.
struct VideoDecoderStats {
  uint64_t packets_sent = 0;
  uint64_t frames_decoded = 0;
  uint64_t frames_delivered = 0;
  uint64_t seeks = 0;             // times decoding restarted at a keyframe
  uint64_t decoders_opened = 0;   // codec contexts created (params changed)
};

// Synchronous, no threads inside (one libavcodec thread), reused across samples and episodes by
// one thread. It remembers where it is in the stream it decoded last, so reading frames of one
// episode forward continues decoding instead of seeking; the codec context stays open while the
// codec parameters stay the same.
class VideoDecoder {
 public:
  VideoDecoder();
  ~VideoDecoder();
  VideoDecoder(const VideoDecoder&) = delete;
  VideoDecoder& operator=(const VideoDecoder&) = delete;

  // Decodes `frames` (indices into `table`, any order, repeats allowed) of `stream` and writes
  // one RGB image per entry of `frames` into `out` (resized to out.size()). `stream_key`
  // identifies the (episode, stream) for the decoder's lifetime, so it knows when it may continue
  // where it stopped (and which kept frames belong to the stream).
  // Errors say which frame and packet failed and why; the caller adds dataset, shard, episode and
  // stream.
  absl::Status Decode(uint64_t stream_key, const format::v1::StreamIndex& stream,
                      const FrameTable& table, PacketReader read, std::span<const int64_t> frames,
                      const VideoOutput& output, const DecodeLimits& limits,
                      std::vector<RgbImage>* out);

  const VideoDecoderStats& stats() const { return stats_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  VideoDecoderStats stats_;
};

}  // namespace conveyor
