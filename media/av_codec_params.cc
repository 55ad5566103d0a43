#include "media/internal/av_codec_params.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

extern "C" {
#include <libavutil/channel_layout.h>
#include <libavutil/display.h>
#include <libavutil/pixdesc.h>
}

#include "base/strings.h"

namespace conveyor::av {

namespace pb = format::v1;

namespace {

// An FFmpeg enum field as the int it holds. A demuxer may leave a value outside the enum's named
// range there (from a corrupt header), and loading such a value as the enum type is undefined in
// C++ (UBSan's -fsanitize=enum; found by tests/fuzz/webdataset_fuzz.cc on a mutated mp4 member):
// its bytes are read instead, and the index keeps the number FFmpeg itself would pass on.
template <typename E>
int32_t EnumBits(const E& field) {
  static_assert(std::is_enum_v<E> && sizeof(E) == sizeof(int32_t));
  int32_t v = 0;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

}  // namespace

pb::CodecParams CodecParamsFromAv(const AVCodecParameters& par, double rotation_deg) {
  pb::CodecParams p;
  p.set_codec(avcodec_get_name(par.codec_id));
  if (par.extradata != nullptr && par.extradata_size > 0) {
    p.set_extradata(par.extradata, static_cast<size_t>(par.extradata_size));
  }
  p.set_width(par.width);
  p.set_height(par.height);
  if (par.codec_type == AVMEDIA_TYPE_VIDEO && par.format >= 0) {
    const char* name = av_get_pix_fmt_name(static_cast<AVPixelFormat>(par.format));
    if (name != nullptr) p.set_pix_fmt(name);
  }
  p.set_sample_rate(par.sample_rate);
  p.set_channels(par.ch_layout.nb_channels);
  if (par.codec_type == AVMEDIA_TYPE_AUDIO && par.format >= 0) {
    const char* name = av_get_sample_fmt_name(static_cast<AVSampleFormat>(par.format));
    if (name != nullptr) p.set_sample_fmt(name);
  }
  if (par.ch_layout.order == AV_CHANNEL_ORDER_NATIVE) p.set_channel_mask(par.ch_layout.u.mask);
  p.set_frame_size(par.frame_size);
  p.set_initial_padding(par.initial_padding);
  p.set_trailing_padding(par.trailing_padding);
  p.set_block_align(par.block_align);
  p.set_bits_per_coded_sample(par.bits_per_coded_sample);
  p.set_bits_per_raw_sample(par.bits_per_raw_sample);
  p.set_profile(par.profile);
  p.set_level(par.level);
  p.set_color_range(EnumBits(par.color_range));
  p.set_color_primaries(EnumBits(par.color_primaries));
  p.set_color_trc(EnumBits(par.color_trc));
  p.set_color_space(EnumBits(par.color_space));
  p.set_chroma_location(EnumBits(par.chroma_location));
  p.set_field_order(EnumBits(par.field_order));
  p.set_sar_num(par.sample_aspect_ratio.num);
  p.set_sar_den(par.sample_aspect_ratio.den);
  p.set_video_delay(par.video_delay);
  p.set_rotation_deg(rotation_deg);
  p.set_seek_preroll(par.seek_preroll);
  return p;
}

absl::Status CodecParamsToAv(const pb::CodecParams& params, AVCodecParameters* out) {
  const AVCodecDescriptor* desc = avcodec_descriptor_get_by_name(params.codec().c_str());
  if (desc == nullptr) {
    return absl::InvalidArgumentError(StrCat("codec '", params.codec(),
                                             "' is not known to this FFmpeg (libavcodec ",
                                             LIBAVCODEC_IDENT, ")"));
  }
  out->codec_type = desc->type;
  out->codec_id = desc->id;
  out->codec_tag = 0;

  av_freep(&out->extradata);
  out->extradata_size = 0;
  if (!params.extradata().empty()) {
    const size_t n = params.extradata().size();
    out->extradata = static_cast<uint8_t*>(av_mallocz(n + AV_INPUT_BUFFER_PADDING_SIZE));
    if (out->extradata == nullptr) return av::AvError(AVERROR(ENOMEM), "copying extradata");
    std::memcpy(out->extradata, params.extradata().data(), n);
    out->extradata_size = static_cast<int>(n);
  }

  out->width = params.width();
  out->height = params.height();
  out->format = -1;
  if (desc->type == AVMEDIA_TYPE_VIDEO && !params.pix_fmt().empty()) {
    const AVPixelFormat f = av_get_pix_fmt(params.pix_fmt().c_str());
    if (f == AV_PIX_FMT_NONE) {
      return absl::InvalidArgumentError(
          StrCat("pixel format '", params.pix_fmt(), "' is not known to this FFmpeg"));
    }
    out->format = f;
  }
  if (desc->type == AVMEDIA_TYPE_AUDIO && !params.sample_fmt().empty()) {
    const AVSampleFormat f = av_get_sample_fmt(params.sample_fmt().c_str());
    if (f == AV_SAMPLE_FMT_NONE) {
      return absl::InvalidArgumentError(
          StrCat("sample format '", params.sample_fmt(), "' is not known to this FFmpeg"));
    }
    out->format = f;
  }

  out->sample_rate = params.sample_rate();
  av_channel_layout_uninit(&out->ch_layout);
  if (params.channel_mask() != 0) {
    if (std::popcount(params.channel_mask()) != params.channels()) {
      return absl::InvalidArgumentError(StrCat("channel mask 0x", absl::Hex(params.channel_mask()),
                                               " has ", std::popcount(params.channel_mask()),
                                               " channels, codec params say ", params.channels()));
    }
    const int ret = av_channel_layout_from_mask(&out->ch_layout, params.channel_mask());
    if (ret < 0) return av::AvError(ret, "setting the channel layout");
  } else if (params.channels() > 0) {
    // The source had no native layout (e.g. a WAV without a channel mask): FFmpeg's default
    // layout for the count is what its own decoders assume for such streams.
    av_channel_layout_default(&out->ch_layout, params.channels());
  }

  out->frame_size = params.frame_size();
  out->initial_padding = params.initial_padding();
  out->trailing_padding = params.trailing_padding();
  out->block_align = params.block_align();
  out->bits_per_coded_sample = params.bits_per_coded_sample();
  out->bits_per_raw_sample = params.bits_per_raw_sample();
  out->profile = params.profile();
  out->level = params.level();
  out->color_range = static_cast<AVColorRange>(params.color_range());
  out->color_primaries = static_cast<AVColorPrimaries>(params.color_primaries());
  out->color_trc = static_cast<AVColorTransferCharacteristic>(params.color_trc());
  out->color_space = static_cast<AVColorSpace>(params.color_space());
  out->chroma_location = static_cast<AVChromaLocation>(params.chroma_location());
  out->field_order = static_cast<AVFieldOrder>(params.field_order());
  out->sample_aspect_ratio = AVRational{params.sar_num(), params.sar_den()};
  out->video_delay = params.video_delay();
  out->seek_preroll = params.seek_preroll();
  return absl::OkStatus();
}

double StreamRotationDeg(const AVStream& stream) {
  size_t size = 0;
  const uint8_t* matrix = av_stream_get_side_data(&stream, AV_PKT_DATA_DISPLAYMATRIX, &size);
  if (matrix == nullptr || size < 9 * sizeof(int32_t)) return 0;
  const double deg = av_display_rotation_get(reinterpret_cast<const int32_t*>(matrix));
  return std::isfinite(deg) && deg != 0 ? deg : 0;  // no -0.0 in the index
}

absl::Status SetStreamRotation(AVStream* stream, double rotation_deg) {
  if (rotation_deg == 0) return absl::OkStatus();
  uint8_t* matrix = av_stream_new_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, 9 * sizeof(int32_t));
  if (matrix == nullptr) return av::AvError(AVERROR(ENOMEM), "adding display matrix side data");
  // av_display_rotation_set takes a clockwise angle; av_display_rotation_get (and so
  // rotation_deg) is counter-clockwise.
  av_display_rotation_set(reinterpret_cast<int32_t*>(matrix), -rotation_deg);
  return absl::OkStatus();
}

}  // namespace conveyor::av
