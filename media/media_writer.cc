#include "media/media_writer.h"

#include <cctype>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/internal/av_codec_params.h"
#include "media/internal/av_util.h"

namespace conveyor {
namespace {

std::string LowerExtension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

}  // namespace

struct MediaFileWriter::Impl {
  std::string path;
  std::string where;
  std::string codec_name;
  const char* fallback = nullptr;  // the extension that holds any codec of this kind
  AVRational src_tb{1, 1};
  av::UniqueOutputFormat ctx;
  AVStream* stream = nullptr;  // owned by ctx
  av::UniquePacket pkt;
  int64_t packets_written = 0;
  bool started = false;   // the file may exist from here on
  bool finished = false;  // the file is complete and stays
};

MediaFileWriter::MediaFileWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MediaFileWriter::~MediaFileWriter() {
  // Removed before the context (and its AVIOContext) is closed; what closing flushes lands in
  // the unlinked file.
  if (impl_->started && !impl_->finished) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(impl_->path, ec)) std::filesystem::remove(impl_->path, ec);
  }
}

absl::StatusOr<std::unique_ptr<MediaFileWriter>> MediaFileWriter::Create(
    const std::string& path, const MuxedStream& stream, const std::string& where) {
  const bool video = stream.kind == MediaKind::kVideo;
  const std::string ext = LowerExtension(path);
  auto m = std::make_unique<Impl>();
  m->path = path;
  m->where = where;
  m->codec_name = stream.codec->codec();
  m->fallback = video ? ".mkv" : ".mka";
  av::QuietLogging();

  AVFormatContext* raw = nullptr;
  int ret = avformat_alloc_output_context2(&raw, nullptr, nullptr, path.c_str());
  if (ret < 0 || raw == nullptr) {
    return av::AvError(ret < 0 ? ret : AVERROR_MUXER_NOT_FOUND,
                       StrCat("no FFmpeg muxer for ", path));
  }
  m->ctx.reset(raw);
  AVStream* st = avformat_new_stream(m->ctx.get(), nullptr);
  if (st == nullptr) return av::AvError(AVERROR(ENOMEM), "adding an output stream");
  m->stream = st;
  RETURN_IF_ERROR(Annotate(av::CodecParamsToAv(*stream.codec, st->codecpar), where));
  if (avformat_query_codec(m->ctx->oformat, st->codecpar->codec_id, FF_COMPLIANCE_NORMAL) == 0) {
    return absl::InvalidArgumentError(StrCat(
        "cannot write ", where, " to ", path, ": the ", ext, " container (",
        m->ctx->oformat->name, ") cannot hold ", m->codec_name, "; extract to ", m->fallback,
        " instead"));
  }
  m->src_tb = AVRational{stream.time_base_num, stream.time_base_den};
  st->time_base = m->src_tb;
  if (video) {
    if (stream.frame_rate > 0) st->avg_frame_rate = av_d2q(stream.frame_rate, 1 << 20);
    RETURN_IF_ERROR(av::SetStreamRotation(st, stream.codec->rotation_deg()));
  }
  return std::unique_ptr<MediaFileWriter>(new MediaFileWriter(std::move(m)));
}

absl::Status MediaFileWriter::Start() {
  Impl& m = *impl_;
  AVFormatContext* ctx = m.ctx.get();
  int ret = 0;
  if (!(ctx->oformat->flags & AVFMT_NOFILE)) {
    ret = avio_open(&ctx->pb, m.path.c_str(), AVIO_FLAG_WRITE);
    if (ret < 0) return av::AvError(ret, StrCat("cannot open ", m.path, " for writing"));
  }
  m.started = true;
  ret = avformat_write_header(ctx, nullptr);
  if (ret < 0) {
    return av::AvError(ret, StrCat("cannot write ", m.where, " as ", ctx->oformat->name, " to ",
                                   m.path, " (if the container cannot hold ", m.codec_name,
                                   ", extract to ", m.fallback, ")"));
  }
  m.pkt = av::MakePacket();
  if (m.pkt == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating a packet");
  return absl::OkStatus();
}

absl::Status MediaFileWriter::WritePacket(std::string_view bytes, int64_t pts, int64_t dts,
                                          int64_t duration, bool key, bool discard) {
  Impl& m = *impl_;
  AVPacket* pkt = m.pkt.get();
  int ret = av_new_packet(pkt, static_cast<int>(bytes.size()));
  if (ret < 0) return av::AvError(ret, "allocating a packet");
  std::memcpy(pkt->data, bytes.data(), bytes.size());
  pkt->pts = pts;
  pkt->dts = dts;
  pkt->duration = duration;
  pkt->flags = (key ? AV_PKT_FLAG_KEY : 0) | (discard ? AV_PKT_FLAG_DISCARD : 0);
  pkt->stream_index = m.stream->index;
  pkt->pos = -1;
  av_packet_rescale_ts(pkt, m.src_tb, m.stream->time_base);
  // Takes the packet's reference and leaves it blank, ready for the next av_new_packet.
  ret = av_interleaved_write_frame(m.ctx.get(), pkt);
  if (ret < 0) {
    return av::AvError(ret, StrCat("writing packet ", m.packets_written, " of ", m.where, " to ",
                                   m.path));
  }
  ++m.packets_written;
  return absl::OkStatus();
}

absl::Status MediaFileWriter::Finish() {
  Impl& m = *impl_;
  int ret = av_write_trailer(m.ctx.get());
  if (ret < 0) return av::AvError(ret, StrCat("finishing ", m.path));
  if (m.ctx->pb != nullptr) {
    ret = avio_closep(&m.ctx->pb);
    if (ret < 0) return av::AvError(ret, StrCat("closing ", m.path));
  }
  m.finished = true;
  return absl::OkStatus();
}

}  // namespace conveyor
