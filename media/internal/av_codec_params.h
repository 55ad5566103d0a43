// Conversions between FFmpeg's AVCodecParameters and the shard format's CodecParams, shared by
// `conveyor import` (AV -> proto), `conveyor extract` (proto -> AV) and `conveyor synth`.
//
// INTERNAL header: it includes FFmpeg (through media/internal/av_util.h). Only media/'s .cc files
// may include it.
#pragma once

#include "absl/status/status.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/internal/av_util.h"

namespace conveyor::av {

// Copies every field CodecParams has from `par`. Names are FFmpeg's: codec from
// avcodec_get_name, pix_fmt / sample_fmt from av_get_pix_fmt_name / av_get_sample_fmt_name
// (empty when unset). channel_mask is the native-order mask, 0 for any other channel order.
// `rotation_deg` is stored as is (see StreamRotationDeg).
format::v1::CodecParams CodecParamsFromAv(const AVCodecParameters& par, double rotation_deg);

// Fills `out` (which must be freshly allocated or reset; fields CodecParams lacks are left as
// they are) from `params`: codec_type and codec_id from the codec name, extradata copied with
// AV_INPUT_BUFFER_PADDING_SIZE zeroed padding, the channel layout from channel_mask or, when the
// mask is 0, FFmpeg's default layout for the channel count. codec_tag is left 0 so a muxer picks
// its own. INVALID_ARGUMENT when the codec, pixel or sample format name is unknown to this
// FFmpeg. The rotation is not part of AVCodecParameters: see SetStreamRotation.
absl::Status CodecParamsToAv(const format::v1::CodecParams& params, AVCodecParameters* out);

// The counter-clockwise rotation in degrees ([-180, 180]) of `stream`'s display matrix side
// data (av_display_rotation_get), 0 when there is none or it is not a plain rotation.
double StreamRotationDeg(const AVStream& stream);

// Attaches a display matrix rotating by `rotation_deg` counter-clockwise to `stream` (an output
// stream, before avformat_write_header). Does nothing for 0. Muxers that have no place for it
// (FFmpeg 5.1: Matroska/WebM) ignore it; MP4 and MOV write it into the track header.
absl::Status SetStreamRotation(AVStream* stream, double rotation_deg);

}  // namespace conveyor::av
