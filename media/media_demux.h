// Demuxing one media file's best video or audio stream with libavformat, reading through a
// RandomAccessFile (so local files, HTTP and S3 alike). Used by `conveyor import` (which copies the
// packets) and by datasets read in place (which keep only where each packet lies in the file).
// Also probing single image files, for image streams `conveyor import` makes of image folders.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/dataset_writer.h"
#include "format/format_fwd.h"
#include "storage/storage.h"

namespace conveyor {

enum class MediaKind { kVideo, kAudio };

struct DemuxedStream {
  // Name, kind, codec, rate, shape, codec parameters, time base, pts_origin (the stream's start
  // time, else the first pts) and the packets in decode order. Missing dts are filled in as
  // ffmpeg's stream copy does. Packet bytes are kept only when asked for.
  EpisodeData::Stream stream;
  // Per packet: where its bytes lie in the file and their XXH3-64. Reading `sizes[i]` bytes at
  // `offsets[i]` gives exactly the packet (checked when the bytes are kept; a demuxer that does not
  // read packets verbatim from one place, which MP4 and Matroska do, is an error).
  std::vector<uint64_t> offsets;
  std::vector<uint32_t> sizes;
  std::vector<uint64_t> xxh3;
};

// Reads every packet of `file`'s best stream of `kind` and names the stream `name`. A truncated or
// corrupt file is an error naming the file; so is a file without such a stream.
absl::StatusOr<DemuxedStream> DemuxBestStream(const RandomAccessFile& file, MediaKind kind,
                                              const std::string& name, bool keep_bytes);

// The codec parameters of the image file at local `path` (JPEG, PNG, or any single-picture format
// libavformat reads), found by libavformat, which decodes the picture once: a corrupt file is
// caught here. The codec name is FFmpeg's ("mjpeg", "png", ...). An error names the file; so is a
// file that is not one picture with a size. Callers read the result's fields through
// "conveyor/format/v1/shard.pb.h" (format/format_fwd.h declares it).
absl::StatusOr<format::v1::CodecParams> ProbeImageFile(const std::string& path);

// The codec parameters of a PNG or JPEG image held in memory (a LeRobot parquet's embedded
// image), decoded once to learn its size and pixel format. `where` names it in errors.
absl::StatusOr<format::v1::CodecParams> ProbeImageBytes(std::string_view bytes, const std::string& where);

// A stream time base: num / den seconds per tick.
struct TimeBase {
  int num = 1;
  int den = 1;
};

// One tick per frame at `rate` frames per second: 1/rate, rounded as FFmpeg rounds a frame rate
// to a fraction (av_d2q with denominators up to 2^20), so it matches the time base FFmpeg
// gives a stream of that rate. REQUIRES: rate > 0.
TimeBase FrameTimeBase(double rate);

}  // namespace conveyor
