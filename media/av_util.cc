#include "media/internal/av_util.h"

#include <spdlog/spdlog.h>

#include <cstdarg>
#include <mutex>

#include "base/strings.h"

namespace conveyor::av {
namespace {

// FFmpeg's last error line on this thread, for the error it goes with (AvError adds it).
thread_local std::string last_line;

// FFmpeg's log, never written raw to stderr: an error line becomes context of the Conveyor error
// that follows it on this thread (AvError), and every line goes to the debug log.
void LogCallback(void* avcl, int level, const char* fmt, va_list vl) {
  if (level > AV_LOG_ERROR && !spdlog::should_log(spdlog::level::debug)) return;
  char line[1024];
  int print_prefix = 1;
  va_list copy;
  va_copy(copy, vl);
  av_log_format_line2(avcl, level, fmt, copy, line, sizeof(line), &print_prefix);
  va_end(copy);
  std::string text(line);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) return;
  if (level <= AV_LOG_ERROR) last_line = text;
  spdlog::debug("ffmpeg: {}", text);
}

}  // namespace

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
  if (!last_line.empty()) {
    StrAppend(&msg, " (FFmpeg: ", last_line, ")");
    last_line.clear();
  }
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
  std::call_once(once, [] {
    av_log_set_level(AV_LOG_ERROR);
    av_log_set_callback(LogCallback);
  });
}

}  // namespace conveyor::av
