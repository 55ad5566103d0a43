// FFmpeg plumbing for Conveyor's own .cc files: RAII owners for every libav* handle and one
// function that turns an FFmpeg error code into an absl::Status.
//
// INTERNAL header: it includes FFmpeg. Public headers must not include it, so that code embedding
// the client never needs FFmpeg on its include path.
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>
}

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace conveyor::av {

struct FormatInputDeleter {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
struct FormatOutputDeleter {
  // Closes the output's AVIOContext (if the muxer opened one) and frees the context.
  void operator()(AVFormatContext* c) const;
};
struct CodecContextDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsDeleter {
  void operator()(SwsContext* c) const { sws_freeContext(c); }
};
struct SwrDeleter {
  void operator()(SwrContext* c) const { swr_free(&c); }
};
struct CodecParametersDeleter {
  void operator()(AVCodecParameters* p) const { avcodec_parameters_free(&p); }
};

using UniqueInputFormat = std::unique_ptr<AVFormatContext, FormatInputDeleter>;
using UniqueOutputFormat = std::unique_ptr<AVFormatContext, FormatOutputDeleter>;
using UniqueCodecContext = std::unique_ptr<AVCodecContext, CodecContextDeleter>;
using UniqueFrame = std::unique_ptr<AVFrame, FrameDeleter>;
using UniquePacket = std::unique_ptr<AVPacket, PacketDeleter>;
using UniqueSws = std::unique_ptr<SwsContext, SwsDeleter>;
using UniqueSwr = std::unique_ptr<SwrContext, SwrDeleter>;
using UniqueCodecParameters = std::unique_ptr<AVCodecParameters, CodecParametersDeleter>;

UniqueFrame MakeFrame();
UniquePacket MakePacket();

// FFmpeg's own message for `errnum` (av_strerror).
std::string ErrorString(int errnum);

// A Status for a failed FFmpeg call: "<context>: <av_strerror text>", with a code that fits
// (AVERROR_INVALIDDATA -> DATA_LOSS, ENOENT -> NOT_FOUND, ENOMEM -> RESOURCE_EXHAUSTED, ...).
absl::Status AvError(int errnum, std::string_view context);

// Quiets FFmpeg's logging to errors only, once per process, and takes its lines off stderr: an
// error line becomes context of the AvError that follows it on the same thread ("(FFmpeg: ...)"),
// and every line goes to the debug log. Conveyor reports errors itself.
void QuietLogging();

}  // namespace conveyor::av
