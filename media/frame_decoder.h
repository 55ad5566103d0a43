// FrameDecoder: the one interface a video stream's frames are decoded through, whatever decodes
// them. Two backends implement it:
//   - VideoDecoder (media/video_decoder.h): libavcodec on the CPU, frame k exactly as the ffmpeg
//     CLI shows it;
//   - NvdecDecoder (media/nvdec_decoder.h): the GPU's NVDEC engines, built with CUDA, its frames
//     copied back to host memory (within docs/nvdec.md's tolerance of the CPU's).
// A stream's backend is chosen once, from its spec's `decode:` (ChooseDecodeBackend,
// media/decode_backend.h), and OpenFrameDecoder makes the decoder; callers hold a FrameDecoder and
// never ask which one it is. A third backend is a class implementing this interface and one case
// in OpenFrameDecoder (docs/architecture.md "Where a change goes").
//
// Also here, because every backend takes them: the frame table a request indexes (FrameTable) and
// the output a request asks for (VideoOutput).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "format/format_fwd.h"
#include "media/decode_backend.h"
#include "media/decode_common.h"

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

// Resizing filter for VideoDecoder and image resizes (libswscale's). NVDEC's kernel resizes
// bilinearly only.
enum class ResizeFilter { kBilinear, kBicubic, kArea, kNearest, kLanczos };

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
  // displayed frame (INVALID_ARGUMENT otherwise, naming both). The CPU backend's alone: NVDEC
  // refuses it (FAILED_PRECONDITION).
  std::optional<VideoCrop> crop;
  // Apply the stream's display rotation when it is a multiple of 90 degrees (as the ffmpeg CLI
  // does by default). NVDEC refuses a stream it would rotate (its kernel does not rotate).
  bool autorotate = true;
  // Keep the last few delivered frames (up to 8, 32 MB) so the next call can take frames just
  // behind the decoder's position without seeking back: what windows of several frames
  // ([-0.1, 0.0]) over consecutive samples need. Costs one copy per delivered frame. A hint:
  // backends that keep nothing ignore it, and the frames are the same bytes either way.
  bool keep_recent = false;
};

// Counters since a decoder was made. amplification = frames_decoded / frames_delivered.
struct FrameDecoderStats {
  uint64_t packets_sent = 0;
  uint64_t frames_decoded = 0;    // pictures decoded, references and skipped-over ones included
  uint64_t frames_delivered = 0;  // frames written to the caller's memory
  uint64_t seeks = 0;             // times decoding restarted at a keyframe
  uint64_t decoders_opened = 0;   // codec contexts or NVDEC decoders made (parameters changed)
};

// Synchronous and reused across samples and episodes by one thread at a time (a worker holds one
// per video stream, so each camera keeps its decode position). Not thread-safe.
class FrameDecoder {
 public:
  virtual ~FrameDecoder() = default;

  // Decodes `frames` (indices into `table`, any order, repeats allowed) of `stream` and writes
  // one 8-bit RGB image per entry of `frames` into `out` (resized to out.size()), as `output`
  // says. `stream_key` identifies the (episode, stream) for the decoder's lifetime, so it knows
  // when it may continue where it stopped. Errors say which frame and packet failed and why; the
  // caller adds dataset, shard, episode and stream. A request the backend cannot honour (NVDEC:
  // a crop, a rotation, a resize other than bilinear, a codec it lacks) is FAILED_PRECONDITION.
  virtual absl::Status Decode(uint64_t stream_key, const format::v1::StreamIndex& stream,
                              const FrameTable& table, PacketReader read,
                              std::span<const int64_t> frames, const VideoOutput& output,
                              const DecodeLimits& limits, std::vector<RgbImage>* out) = 0;

  virtual const FrameDecoderStats& stats() const = 0;
};

// A decoder on `backend`: kCpu a VideoDecoder; kGpu an NVDEC session on CUDA device `device`
// (FAILED_PRECONDITION with NvdecUnavailable()'s reason where NVDEC cannot be used). kAuto is
// INVALID_ARGUMENT: ChooseDecodeBackend decides it first.
absl::StatusOr<std::unique_ptr<FrameDecoder>> OpenFrameDecoder(DecodeBackend backend,
                                                               int device = 0);

}  // namespace conveyor
