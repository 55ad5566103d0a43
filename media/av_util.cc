#include "media/internal/av_util.h"

#include <mutex>

#include "base/strings.h"

namespace conveyor::av {

void FormatOutputDeleter::operator()(AVFormatContext* c) const {
  if (c == nullptr) return;
  if (c->oformat != nullptr && !(c->oformat->flags & AVFMT_NOFILE) && c->pb != nullptr) {
    avio_closep(&c->pb);
  }
  avformat_free_context(c);
}

UniqueFrame MakeFrame() { return UniqueFrame(av_frame_alloc()); }
UniquePacket MakePacket() { return UniquePacket(av_packet_alloc()); }

std::string ErrorString(int errnum) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(errnum, buf, sizeof(buf));
  return buf;
}

absl::Status AvError(int errnum, std::string_view context) {
  std::string msg = StrCat(context, ": ", ErrorString(errnum));
  if (errnum == AVERROR_INVALIDDATA || errnum == AVERROR_BUG) return absl::DataLossError(msg);
  if (errnum == AVERROR(ENOENT)) return absl::NotFoundError(msg);
  if (errnum == AVERROR(ENOMEM)) return absl::ResourceExhaustedError(msg);
  if (errnum == AVERROR(EINVAL) || errnum == AVERROR_DECODER_NOT_FOUND ||
      errnum == AVERROR_DEMUXER_NOT_FOUND || errnum == AVERROR_ENCODER_NOT_FOUND ||
      errnum == AVERROR_MUXER_NOT_FOUND) {
    return absl::InvalidArgumentError(msg);
  }
  if (errnum == AVERROR(EACCES) || errnum == AVERROR(EPERM)) return absl::PermissionDeniedError(msg);
  if (errnum == AVERROR_EOF) return absl::OutOfRangeError(msg);
  return absl::InternalError(msg);
}

void QuietLogging() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_level(AV_LOG_ERROR); });
}

}  // namespace conveyor::av
