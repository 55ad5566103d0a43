// Writing one stored video or audio stream back out as a standard media file with libavformat:
// the packets go in as stored (no re-encode), so the file decodes to the same frames or samples.
// Used by `conveyor extract`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "media/media_demux.h"
#include "format/codec_params_value.h"
#include "format/format.h"

namespace conveyor {

// What the file's one stream is.
struct MuxedStream {
  MediaKind kind = MediaKind::kVideo;
  // As stored. A video's rotation_deg becomes the stream's display matrix where the container
  // has a place for it (MP4 and MOV do; FFmpeg 5.1's Matroska and WebM muxers drop it).
  CodecParamsValue codec;
  // The time base of the timestamps given to WritePacket; the muxer may rescale them.
  int time_base_num = 1;
  int time_base_den = 1;
  double frame_rate = 0;  // video: written as the average frame rate when > 0
};

// One output file, written in three steps: Create checks that the container can hold the stream
// and touches no file; Start creates the file and writes the header; WritePacket for each packet
// in decode order; Finish writes the trailer. A writer destroyed after Start without a successful
// Finish removes the file, so a failed write leaves nothing that looks like a finished file.
//
// Not thread-safe: one thread uses a writer.
class MediaFileWriter {
 public:
  // The container is FFmpeg's guess from `path`'s extension. INVALID_ARGUMENT when no muxer
  // matches, or when the container cannot hold the codec (the message suggests .mkv for video,
  // .mka for audio). `where` names the stream in every error ("episode 3 stream 'cam0' (h264)").
  static absl::StatusOr<std::unique_ptr<MediaFileWriter>> Create(const std::string& path,
                                                                 const MuxedStream& stream,
                                                                 const std::string& where);
  ~MediaFileWriter();
  MediaFileWriter(const MediaFileWriter&) = delete;
  MediaFileWriter& operator=(const MediaFileWriter&) = delete;

  // Creates (or truncates) the file and writes the container header. REQUIRES: called once.
  absl::Status Start();

  // Writes one packet; `bytes` is copied. Timestamps are in the stream's time base.
  // REQUIRES: Start() returned OK.
  absl::Status WritePacket(std::string_view bytes, int64_t pts, int64_t dts, int64_t duration,
                           bool key, bool discard);

  // Writes the trailer and closes the file, which then stays. REQUIRES: Start() returned OK.
  absl::Status Finish();

 private:
  struct Impl;
  explicit MediaFileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor
