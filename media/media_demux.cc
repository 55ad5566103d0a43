#include "media/media_demux.h"

#include <algorithm>
#include <string_view>

extern "C" {
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
}

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/internal/av_codec_params.h"
#include "media/internal/av_util.h"
#include "format/format.h"

namespace conveyor {
namespace {

namespace pb = format::v1;
using av::CodecParamsFromAv;
using av::StreamRotationDeg;

// libavformat's reads and seeks, served by a RandomAccessFile. The first failure is kept so the
// caller reports it (with the file's own message) instead of FFmpeg's generic EIO.
struct FileReader {
  const RandomAccessFile* file;
  uint64_t pos = 0;
  absl::Status error;

  static int ReadPacket(void* opaque, uint8_t* buf, int size) {
    auto* r = static_cast<FileReader*>(opaque);
    const uint64_t total = r->file->size();
    if (r->pos >= total) return AVERROR_EOF;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(size), total - r->pos));
    absl::Status s = r->file->Read(r->pos, n, reinterpret_cast<char*>(buf));
    if (!s.ok()) {
      if (r->error.ok()) r->error = std::move(s);
      return AVERROR(EIO);
    }
    r->pos += n;
    return static_cast<int>(n);
  }

  static int64_t Seek(void* opaque, int64_t offset, int whence) {
    auto* r = static_cast<FileReader*>(opaque);
    const int64_t total = static_cast<int64_t>(r->file->size());
    switch (whence & ~AVSEEK_FORCE) {
      case AVSEEK_SIZE: return total;
      case SEEK_SET: break;
      case SEEK_CUR: offset += static_cast<int64_t>(r->pos); break;
      case SEEK_END: offset += total; break;
      default: return AVERROR(EINVAL);
    }
    if (offset < 0) return AVERROR(EINVAL);
    r->pos = static_cast<uint64_t>(offset);
    return offset;
  }
};

struct AvioDeleter {
  void operator()(AVIOContext* c) const {
    if (c == nullptr) return;
    av_freep(&c->buffer);
    avio_context_free(&c);
  }
};
using UniqueAvio = std::unique_ptr<AVIOContext, AvioDeleter>;


// Packets keep the demuxer's timestamps. Where one is missing (Matroska leaves the dts of the
// first reordered frames unset; some demuxers leave pts unset on non-reordered streams), it is
// filled in as ffmpeg's stream copy would: pts from dts, and dts stepped back from the first
// known one (or forward from the last) by packet durations.
absl::Status FillMissingTimestamps(const std::string& file,
                                   std::vector<EpisodeData::Packet>* packets) {
  auto& p = *packets;
  for (auto& pk : p) {
    if (pk.pts == AV_NOPTS_VALUE && pk.dts != AV_NOPTS_VALUE) pk.pts = pk.dts;
  }
  size_t first_dts = p.size();
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].dts != AV_NOPTS_VALUE) {
      first_dts = i;
      break;
    }
  }
  if (first_dts == p.size()) {
    // No decode timestamps at all: only usable when presentation order is decode order.
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i].pts == AV_NOPTS_VALUE || (i > 0 && p[i].pts < p[i - 1].pts)) {
        return absl::InvalidArgumentError(
            StrCat(file, ": packet ", i, " has no usable timestamps (no dts in the whole stream ",
                   "and pts missing or reordered); remux it with `ffmpeg -i IN -c copy OUT.mkv`"));
      }
      p[i].dts = p[i].pts;
    }
    return absl::OkStatus();
  }
  for (size_t i = first_dts; i-- > 0;) {
    p[i].dts = p[i + 1].dts - std::max<int64_t>(p[i].duration, 1);
  }
  for (size_t i = first_dts + 1; i < p.size(); ++i) {
    if (p[i].dts == AV_NOPTS_VALUE)
      p[i].dts = p[i - 1].dts + std::max<int64_t>(p[i - 1].duration, 1);
  }
  for (auto& pk : p) {
    if (pk.pts == AV_NOPTS_VALUE) pk.pts = pk.dts;
  }
  return absl::OkStatus();
}

std::vector<std::string> ChannelNames(const AVChannelLayout& layout) {
  std::vector<std::string> names;
  if (layout.order != AV_CHANNEL_ORDER_NATIVE && layout.order != AV_CHANNEL_ORDER_CUSTOM) {
    return names;
  }
  for (int i = 0; i < layout.nb_channels; ++i) {
    char buf[64] = {0};
    const AVChannel ch = av_channel_layout_channel_from_index(&layout, static_cast<unsigned>(i));
    if (ch == AV_CHAN_NONE || av_channel_name(buf, sizeof(buf), ch) < 0) return {};
    names.emplace_back(buf);
  }
  return names;
}

// The stream's name, kind, codec, time base and shape (frame size, or channels and rate).
absl::Status DescribeStream(const AVStream& st, int index, bool video, const std::string& file,
                            const std::string& name, EpisodeData::Stream* out) {
  const AVCodecParameters& par = *st.codecpar;
  out->info.name = name;
  out->info.codec = avcodec_get_name(par.codec_id);
  out->codec = CodecParamsFromAv(par, video ? StreamRotationDeg(st) : 0);
  out->time_base_num = st.time_base.num;
  out->time_base_den = st.time_base.den;
  if (video) {
    if (par.width <= 0 || par.height <= 0) {
      return absl::InvalidArgumentError(
          StrCat(file, ": video stream ", index, " has no frame size"));
    }
    out->info.kind = pb::VIDEO;
    out->info.shape = {par.height, par.width, 3};
    out->info.pix_fmt = out->codec->pix_fmt();
    AVRational rate = st.avg_frame_rate;
    if (rate.num <= 0 || rate.den <= 0) rate = st.r_frame_rate;
    out->info.rate = rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0;
  } else {
    if (par.sample_rate <= 0 || par.ch_layout.nb_channels <= 0) {
      return absl::InvalidArgumentError(
          StrCat(file, ": audio stream ", index, " has no sample rate or channel count"));
    }
    out->info.kind = pb::AUDIO;
    out->info.shape = {par.ch_layout.nb_channels};
    out->info.names = ChannelNames(par.ch_layout);
    out->info.rate = par.sample_rate;
  }
  return absl::OkStatus();
}

// Every packet of stream `index` to the end of the file, with where each lies and its checksum
// (and its bytes when `keep_bytes`). A corrupt packet or a read error stops it with an error.
absl::Status ReadPackets(AVFormatContext* ctx, int index, const std::string& file, bool keep_bytes,
                         DemuxedStream* demuxed) {
  EpisodeData::Stream& out = demuxed->stream;
  av::UniquePacket pkt = av::MakePacket();
  if (pkt == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating a packet");
  while (true) {
    const int ret = av_read_frame(ctx, pkt.get());
    if (ret == AVERROR_EOF) break;
    if (ret < 0) {
      return av::AvError(
          ret, StrCat("reading ", file, " after ", out.packets.size(),
                      " packets, near byte offset ", ctx->pb != nullptr ? avio_tell(ctx->pb) : -1));
    }
    if (pkt->stream_index != index) {
      av_packet_unref(pkt.get());
      continue;
    }
    if (pkt->flags & AV_PKT_FLAG_CORRUPT) {
      return absl::DataLossError(StrCat(file, ": packet ", out.packets.size(), " at byte offset ",
                                        pkt->pos, " is corrupt or cut short (truncated file?)"));
    }
    EpisodeData::Packet& p = out.packets.emplace_back();
    p.pts = pkt->pts;
    p.dts = pkt->dts;
    p.duration = pkt->duration;
    p.key = (pkt->flags & AV_PKT_FLAG_KEY) != 0;
    const std::string_view data(reinterpret_cast<const char*>(pkt->data),
                                static_cast<size_t>(pkt->size));
    if (pkt->pos < 0) {
      return absl::UnimplementedError(StrCat(file, ": the ", ctx->iformat->name,
                                             " demuxer does not say where packet ",
                                             out.packets.size(), " lies in the file"));
    }
    demuxed->offsets.push_back(static_cast<uint64_t>(pkt->pos));
    demuxed->sizes.push_back(static_cast<uint32_t>(pkt->size));
    demuxed->xxh3.push_back(format::Checksum(data));
    if (keep_bytes) p.bytes.assign(data);
    av_packet_unref(pkt.get());
  }
  return absl::OkStatus();
}

}  // namespace

// Every failure, a truncated or corrupt file included, is an error naming the file: a partial
// read would silently shorten an episode.
absl::StatusOr<DemuxedStream> DemuxBestStream(const RandomAccessFile& source, MediaKind kind,
                                              const std::string& name, bool keep_bytes) {
  const std::string& file = source.name();
  const AVMediaType type = kind == MediaKind::kVideo ? AVMEDIA_TYPE_VIDEO : AVMEDIA_TYPE_AUDIO;
  av::QuietLogging();
  FileReader reader{&source, 0, absl::OkStatus()};
  // 1 MiB reads: over HTTP or S3 each buffer refill is one range request.
  constexpr int kBufferBytes = 1 << 20;
  auto* buffer = static_cast<unsigned char*>(av_malloc(kBufferBytes));
  if (buffer == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating an I/O buffer");
  UniqueAvio io(avio_alloc_context(buffer, kBufferBytes, 0, &reader, &FileReader::ReadPacket,
                                   nullptr, &FileReader::Seek));
  if (io == nullptr) {
    av_free(buffer);
    return av::AvError(AVERROR(ENOMEM), "allocating an I/O context");
  }
  AVFormatContext* raw = avformat_alloc_context();
  if (raw == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating a demuxer");
  raw->pb = io.get();
  raw->flags |= AVFMT_FLAG_CUSTOM_IO;
  int ret = avformat_open_input(&raw, file.c_str(), nullptr, nullptr);
  if (ret < 0 && !reader.error.ok()) return reader.error;
  if (ret < 0) {
    return av::AvError(ret, StrCat("cannot open ", file, " as a media file",
                                   ret == AVERROR_INVALIDDATA ? " (corrupt, truncated, or not "
                                                                "the format its extension says)"
                                                              : ""));
  }
  av::UniqueInputFormat ctx(raw);
  ret = avformat_find_stream_info(ctx.get(), nullptr);
  if (ret < 0) return av::AvError(ret, StrCat("cannot read the stream parameters of ", file));

  const bool video = type == AVMEDIA_TYPE_VIDEO;
  const int index = av_find_best_stream(ctx.get(), type, -1, -1, nullptr, 0);
  if (index < 0) {
    return absl::InvalidArgumentError(
        StrCat(file, " (", ctx->iformat->name, ") has no ", video ? "video" : "audio",
               " stream; its extension makes it a", video ? " video" : "n audio", " stream"));
  }
  for (unsigned i = 0; i < ctx->nb_streams; ++i) {
    if (static_cast<int>(i) != index) ctx->streams[i]->discard = AVDISCARD_ALL;
  }
  const AVStream* st = ctx->streams[index];
  const AVCodecParameters& par = *st->codecpar;
  if (par.codec_id == AV_CODEC_ID_NONE) {
    return absl::InvalidArgumentError(
        StrCat(file, ": stream ", index, " has a codec this FFmpeg does not know"));
  }
  if (st->time_base.num <= 0 || st->time_base.den <= 0) {
    return absl::InvalidArgumentError(StrCat(file, ": stream ", index, " has no time base"));
  }

  DemuxedStream demuxed;
  EpisodeData::Stream& out = demuxed.stream;
  RETURN_IF_ERROR(DescribeStream(*st, index, video, file, name, &out));
  RETURN_IF_ERROR(ReadPackets(ctx.get(), index, file, keep_bytes, &demuxed));
  if (!reader.error.ok()) return reader.error;
  if (ctx->pb != nullptr && ctx->pb->error < 0) {
    return av::AvError(ctx->pb->error, StrCat("reading ", file));
  }
  if (out.packets.empty()) return absl::InvalidArgumentError(StrCat(file, ": no packets"));
  // MP4/MOV (and a few others) index every sample up front; fewer packets than that means the
  // data ends early even when the index (moov atom) survived.
  if (st->nb_frames > 0 && static_cast<int64_t>(out.packets.size()) < st->nb_frames) {
    return absl::DataLossError(StrCat(file, ": the container indexes ", st->nb_frames,
                                      " packets but only ", out.packets.size(),
                                      " could be read (truncated file?)"));
  }
  RETURN_IF_ERROR(FillMissingTimestamps(file, &out.packets));
  out.pts_origin = st->start_time != AV_NOPTS_VALUE ? st->start_time : out.packets.front().pts;
  return demuxed;
}

absl::StatusOr<format::v1::CodecParams> ProbeImageFile(const std::string& path) {
  av::QuietLogging();
  AVFormatContext* raw = nullptr;
  int ret = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
  if (ret < 0) return av::AvError(ret, StrCat("cannot open ", path, " as an image"));
  av::UniqueInputFormat ctx(raw);
  ret = avformat_find_stream_info(ctx.get(), nullptr);
  if (ret < 0) return av::AvError(ret, StrCat("cannot read the image parameters of ", path));
  if (ctx->nb_streams != 1 || ctx->streams[0]->codecpar->codec_type != AVMEDIA_TYPE_VIDEO ||
      ctx->streams[0]->codecpar->width <= 0 || ctx->streams[0]->codecpar->height <= 0) {
    return absl::InvalidArgumentError(StrCat(path, " is not a readable image"));
  }
  return CodecParamsFromAv(*ctx->streams[0]->codecpar, 0);
}

absl::StatusOr<format::v1::CodecParams> ProbeImageBytes(std::string_view bytes, const std::string& where) {
  AVCodecID id = AV_CODEC_ID_NONE;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    id = AV_CODEC_ID_PNG;
  } else if (bytes.size() >= 3 && std::memcmp(bytes.data(), "\xff\xd8\xff", 3) == 0) {
    id = AV_CODEC_ID_MJPEG;
  } else {
    return absl::InvalidArgumentError(StrCat(where, ": not a PNG or JPEG image"));
  }
  av::QuietLogging();
  const AVCodec* codec = avcodec_find_decoder(id);
  if (codec == nullptr) return absl::InternalError(StrCat("no decoder for ", avcodec_get_name(id)));
  av::UniqueCodecContext ctx(avcodec_alloc_context3(codec));
  if (ctx == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating a decoder");
  int ret = avcodec_open2(ctx.get(), codec, nullptr);
  if (ret < 0) return av::AvError(ret, StrCat(where, ": opening the image decoder"));
  av::UniquePacket pkt = av::MakePacket();
  av::UniqueFrame frame = av::MakeFrame();
  if (pkt == nullptr || frame == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating");
  pkt->data = reinterpret_cast<uint8_t*>(const_cast<char*>(bytes.data()));
  pkt->size = static_cast<int>(bytes.size());
  ret = avcodec_send_packet(ctx.get(), pkt.get());
  if (ret >= 0) ret = avcodec_send_packet(ctx.get(), nullptr);
  if (ret >= 0) ret = avcodec_receive_frame(ctx.get(), frame.get());
  if (ret < 0) return av::AvError(ret, StrCat(where, ": the image does not decode"));
  av::UniqueCodecParameters par(avcodec_parameters_alloc());
  if (par == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating");
  ret = avcodec_parameters_from_context(par.get(), ctx.get());
  if (ret < 0) return av::AvError(ret, "codec parameters");
  par->width = frame->width;
  par->height = frame->height;
  par->format = frame->format;
  return CodecParamsFromAv(*par, 0);
}

TimeBase FrameTimeBase(double rate) {
  const AVRational q = av_d2q(rate, 1 << 20);
  return TimeBase{q.den, q.num};
}

}  // namespace conveyor
