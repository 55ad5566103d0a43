#include "sample/sample_spec.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "sample/tokenizer.h"
#include "sample/stored_tensor.h"
#include "sample/yaml_config.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

using yaml::CheckKeys;
using yaml::ConfigError;
using yaml::Integer;
using yaml::Number;
using yaml::Numbers;
using yaml::Word;

// A list of seconds, or the short form {start, step, count} for evenly spaced times.
absl::StatusOr<std::vector<double>> Deltas(std::string_view source, const YAML::Node& n,
                                           int64_t max_count) {
  if (n.IsMap()) {
    RETURN_IF_ERROR(CheckKeys(source, n, "delta_timestamps", {"start", "step", "count"}));
    if (!n["start"] || !n["step"] || !n["count"]) {
      return ConfigError(source, n, "delta_timestamps short form needs start, step and count");
    }
    ASSIGN_OR_RETURN(double start, Number(source, n["start"], "delta_timestamps.start"));
    ASSIGN_OR_RETURN(double step, Number(source, n["step"], "delta_timestamps.step"));
    ASSIGN_OR_RETURN(int64_t count,
                     Integer(source, n["count"], "delta_timestamps.count", 1, max_count));
    std::vector<double> out;
    // start + i * step, computed per entry (no accumulated rounding).
    for (int64_t i = 0; i < count; ++i) out.push_back(start + static_cast<double>(i) * step);
    return out;
  }
  return Numbers(source, n, "delta_timestamps", 1, static_cast<size_t>(max_count));
}

double Period(const StreamInfo& info) { return info.rate > 0 ? 1.0 / info.rate : 0.0; }

absl::Status ResolveNormalization(const Manifest& manifest, StreamSpec* s, std::string_view source,
                                  const YAML::Node& node) {
  if (s->normalize == LowdimNorm::kNone) return absl::OkStatus();
  auto it = manifest.stats.find(s->name);
  if (it == manifest.stats.end()) {
    return ConfigError(source, node, StrCat("normalize needs statistics for '", s->name,
                                    "' and the manifest has none"));
  }
  const StreamStats& st = it->second;
  const size_t dim = manifest.streams[s->stream].shape.empty()
                         ? 1
                         : static_cast<size_t>(manifest.streams[s->stream].shape[0]);
  constexpr double kEps = 1e-8;
  s->norm_offset.assign(dim, 0);
  s->norm_scale.assign(dim, 1);
  for (size_t d = 0; d < dim; ++d) {
    if (s->normalize == LowdimNorm::kMeanStd) {
      if (st.mean.size() != dim || st.std.size() != dim) {
        return ConfigError(source, node, StrCat("manifest stats of '", s->name, "' lack mean/std"));
      }
      s->norm_offset[d] = static_cast<float>(st.mean[d]);
      s->norm_scale[d] = static_cast<float>(1.0 / (st.std[d] + kEps));
      s->norm_bias = 0;
    } else if (s->normalize == LowdimNorm::kMinMax) {
      if (st.min.size() != dim || st.max.size() != dim) {
        return ConfigError(source, node, StrCat("manifest stats of '", s->name, "' lack min/max"));
      }
      s->norm_offset[d] = static_cast<float>(st.min[d]);
      s->norm_scale[d] = static_cast<float>(2.0 / (st.max[d] - st.min[d] + kEps));
      s->norm_bias = -1;
    } else {
      const bool wide = s->normalize == LowdimNorm::kQuantile;
      const std::string lo_name = wide ? "q01" : "q10", hi_name = wide ? "q99" : "q90";
      auto lo = st.quantiles.find(lo_name), hi = st.quantiles.find(hi_name);
      if (lo == st.quantiles.end() || hi == st.quantiles.end() || lo->second.size() != dim ||
          hi->second.size() != dim) {
        std::string have;
        for (const auto& [q, v] : st.quantiles) StrAppend(&have, have.empty() ? "" : ", ", q);
        return ConfigError(source, node,
                           StrCat("normalize: ", wide ? "quantile" : "quantile10", " needs the ",
                                  lo_name, " and ", hi_name, " statistics of '", s->name,
                                  "' (", dim, " values each); the manifest has ",
                                  have.empty() ? std::string("no quantiles") : have,
                                  " (LeRobot v3.0's meta/stats.json has them)"));
      }
      s->norm_offset[d] = static_cast<float>(lo->second[d]);
      s->norm_scale[d] = static_cast<float>(2.0 / (hi->second[d] - lo->second[d] + kEps));
      s->norm_bias = -1;
    }
  }
  return absl::OkStatus();
}

// A video stream's `decode: auto | cpu | gpu` (media/decode_backend.h). Only the word is read
// here, with where it was written: what it means and whether this machine can honour it are asked
// where a pipeline opens (CheckVideoBackends, sample/sample_assembler.h), so parsing a config gives
// the same spec on every machine.
absl::Status ParseDecode(std::string_view source, const YAML::Node& n, StreamSpec* s) {
  if (!n["decode"]) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string v, Word(source, n["decode"], "decode", {"auto", "cpu", "gpu"}));
  s->decode = v == "gpu" ? DecodeBackend::kGpu : v == "cpu" ? DecodeBackend::kCpu : DecodeBackend::kAuto;
  const YAML::Mark mark = n["decode"].Mark();
  s->decode_at = StrCat(source, ":", mark.line + 1, ":", mark.column + 1);
  return absl::OkStatus();
}

absl::Status ParseImageOptions(std::string_view source, const YAML::Node& n, StreamSpec* s) {
  if (n["size"]) {
    ASSIGN_OR_RETURN(std::vector<double> hw, Numbers(source, n["size"], "size", 2, 2));
    for (double v : hw) {
      if (v < 1 || v > 16384 || v != std::floor(v)) {
        return ConfigError(source, n["size"], "size must be [height, width], integers in [1, 16384]");
      }
    }
    s->height = static_cast<int>(hw[0]);
    s->width = static_cast<int>(hw[1]);
  }
  if (n["layout"]) {
    ASSIGN_OR_RETURN(std::string v, Word(source, n["layout"], "layout", {"hwc", "chw"}));
    s->layout = v == "chw" ? ImageLayout::kCHW : ImageLayout::kHWC;
  }
  if (n["dtype"]) {
    ASSIGN_OR_RETURN(std::string v, Word(source, n["dtype"], "dtype", {"uint8", "float32"}));
    s->dtype = v == "float32" ? ImageDType::kFloat32 : ImageDType::kUint8;
  }
  if (n["resize"]) {
    ASSIGN_OR_RETURN(std::string v, Word(source, n["resize"], "resize",
                                         {"bilinear", "bicubic", "area", "nearest", "lanczos"}));
    s->resize = v == "bicubic" ? ResizeFilter::kBicubic
                : v == "area"  ? ResizeFilter::kArea
                : v == "nearest" ? ResizeFilter::kNearest
                : v == "lanczos" ? ResizeFilter::kLanczos
                                 : ResizeFilter::kBilinear;
  }
  if (n["autorotate"]) {
    ASSIGN_OR_RETURN(s->autorotate, yaml::Bool(source, n["autorotate"], "autorotate"));
  }
  if (const YAML::Node norm = n["normalize"]) {
    RETURN_IF_ERROR(CheckKeys(source, norm, "normalize (images)", {"mean", "std"}));
    if (s->dtype != ImageDType::kFloat32) {
      return ConfigError(source, norm, "image normalize needs dtype: float32");
    }
    if (norm["mean"]) {
      ASSIGN_OR_RETURN(std::vector<double> m, Numbers(source, norm["mean"], "mean", 3, 3));
      for (int c = 0; c < 3; ++c) s->mean[c] = static_cast<float>(m[c]);
    }
    if (norm["std"]) {
      ASSIGN_OR_RETURN(std::vector<double> d, Numbers(source, norm["std"], "std", 3, 3));
      for (int c = 0; c < 3; ++c) {
        if (!(d[c] > 0)) return ConfigError(source, norm["std"], "std entries must be > 0");
        s->std[c] = static_cast<float>(d[c]);
      }
    }
  }
  if (const YAML::Node aug = n["augment"]) {
    RETURN_IF_ERROR(CheckKeys(source, aug, "augment", {"random_resized_crop", "hflip", "color_jitter"}));
    if (const YAML::Node c = aug["random_resized_crop"]) {
      RETURN_IF_ERROR(CheckKeys(source, c, "random_resized_crop", {"scale", "ratio"}));
      RandomResizedCrop crop;
      if (c["scale"]) {
        ASSIGN_OR_RETURN(std::vector<double> v, Numbers(source, c["scale"], "scale", 2, 2));
        if (!(v[0] > 0 && v[0] <= v[1] && v[1] <= 1)) {
          return ConfigError(source, c["scale"], "scale must be [min, max] with 0 < min <= max <= 1");
        }
        crop.scale_min = v[0];
        crop.scale_max = v[1];
      }
      if (c["ratio"]) {
        ASSIGN_OR_RETURN(std::vector<double> v, Numbers(source, c["ratio"], "ratio", 2, 2));
        if (!(v[0] > 0 && v[0] <= v[1])) {
          return ConfigError(source, c["ratio"], "ratio must be [min, max] with 0 < min <= max");
        }
        crop.ratio_min = v[0];
        crop.ratio_max = v[1];
      }
      s->augment.crop = crop;
    }
    if (aug["hflip"]) {
      ASSIGN_OR_RETURN(s->augment.hflip, Number(source, aug["hflip"], "hflip"));
      if (s->augment.hflip < 0 || s->augment.hflip > 1) {
        return ConfigError(source, aug["hflip"], "hflip is a probability in [0, 1]");
      }
    }
    if (const YAML::Node j = aug["color_jitter"]) {
      RETURN_IF_ERROR(CheckKeys(source, j, "color_jitter", {"brightness", "contrast", "saturation"}));
      for (const char* key : {"brightness", "contrast", "saturation"}) {
        if (!j[key]) continue;
        ASSIGN_OR_RETURN(double v, Number(source, j[key], key));
        if (v < 0 || v > 1) return ConfigError(source, j[key], StrCat(key, " must be in [0, 1]"));
        if (std::string(key) == "brightness") s->augment.jitter.brightness = v;
        if (std::string(key) == "contrast") s->augment.jitter.contrast = v;
        if (std::string(key) == "saturation") s->augment.jitter.saturation = v;
      }
    }
    if (s->augment.crop && s->height == 0) {
      return ConfigError(source, aug, "random_resized_crop needs an output size (size: [height, width])");
    }
  }
  return absl::OkStatus();
}

// `clips:` (docs/sampling.md "Clips per video"): samples are K clips per episode, or one every
// `stride` anchor steps, instead of every anchor step. The clip's window in anchor steps is the
// spec's reach around the anchor (every stream's deltas, audio windows), at the anchor stream's
// nominal rate.
absl::Status ParseClips(std::string_view source, const YAML::Node& c, const Manifest& manifest,
                        SampleSpec* spec) {
  if (!c.IsMap()) {
    return ConfigError(source, c, "clips must be a mapping: {per_video: K} or {stride: N | clip}");
  }
  RETURN_IF_ERROR(CheckKeys(source, c, "clips", {"per_video", "stride"}));
  if (c["per_video"] && c["stride"]) {
    return ConfigError(source, c, "clips: give per_video (K clips of each video per epoch) or stride "
                                  "(a clip every N anchor steps), not both");
  }
  if (!c["per_video"] && !c["stride"]) {
    return ConfigError(source, c, "clips needs per_video: K or stride: N (or stride: clip)");
  }
  double lo = 0, hi = 0;
  for (const StreamSpec& s : spec->streams) {
    if (s.kind == pb::AUDIO) {
      lo = std::min(lo, s.window_start);
      hi = std::max(hi, s.window_end);
    }
    for (double d : s.deltas) {
      lo = std::min(lo, d);
      hi = std::max(hi, d);
    }
  }
  const double rate = manifest.streams[spec->anchor_stream].rate;
  if (!(rate > 0)) {
    return ConfigError(source, c, StrCat("clips: the anchor stream '", spec->anchor,
                                         "' has no rate, so a clip's length in steps is unknown"));
  }
  // A delta that lands within 1e-6 s of a step counts as that step (deltas are written as k/fps).
  const double back = std::ceil(-lo * rate - 1e-6), forward = std::ceil(hi * rate - 1e-6);
  if (back > (1u << 30) || forward > (1u << 30)) {
    return ConfigError(source, c, "clips: the spec's delta_timestamps reach too far from the anchor");
  }
  ClipSampling& clips = spec->clips;
  clips.back_steps = static_cast<uint32_t>(std::max(0.0, back));
  clips.forward_steps = static_cast<uint32_t>(std::max(0.0, forward));
  if (c["per_video"]) {
    ASSIGN_OR_RETURN(int64_t k, Integer(source, c["per_video"], "clips.per_video", 1, 1 << 16));
    clips.per_episode = static_cast<uint32_t>(k);
  } else if (c["stride"].IsScalar() && c["stride"].Scalar() == "clip") {
    // Back to back: each clip starts where the previous one ended.
    clips.stride = clips.back_steps + clips.forward_steps + 1;
  } else {
    ASSIGN_OR_RETURN(int64_t n, Integer(source, c["stride"], "clips.stride", 1, 1 << 30));
    clips.stride = static_cast<uint32_t>(n);
  }
  return absl::OkStatus();
}

// `anchor:` and the stream it names: explicit, else "action", else the first lowdim stream, else
// the first video or image stream.
absl::Status ParseAnchor(std::string_view source, const YAML::Node& root, const Manifest& manifest,
                         SampleSpec* spec) {
  if (root["anchor"]) {
    if (!root["anchor"].IsScalar()) return ConfigError(source, root["anchor"], "anchor must be a stream name");
    spec->anchor = root["anchor"].Scalar();
  } else if (manifest.StreamIndex("action") >= 0) {
    spec->anchor = "action";
  } else {
    for (const auto& s : manifest.streams) {
      if (s.kind == pb::LOWDIM) { spec->anchor = s.name; break; }
    }
    if (spec->anchor.empty()) {
      for (const auto& s : manifest.streams) {
        if (s.kind == pb::VIDEO || s.kind == pb::IMAGE) { spec->anchor = s.name; break; }
      }
    }
  }
  spec->anchor_stream = manifest.StreamIndex(spec->anchor);
  if (spec->anchor_stream < 0) {
    return ConfigError(source, root["anchor"] ? root["anchor"] : root,
               StrCat("anchor stream '", spec->anchor, "' is not in the dataset"));
  }
  const pb::StreamKind anchor_kind = manifest.streams[spec->anchor_stream].kind;
  if (anchor_kind != pb::LOWDIM && anchor_kind != pb::VIDEO && anchor_kind != pb::IMAGE) {
    return ConfigError(source, root["anchor"], "the anchor must be a lowdim, video or image stream");
  }
  return absl::OkStatus();
}

// `limits:` (media/decode_common.h DecodeLimits).
absl::Status ParseLimits(std::string_view source, const YAML::Node& l, DecodeLimits* limits) {
  RETURN_IF_ERROR(CheckKeys(source, l, "limits",
                            {"max_pixels", "max_frames_per_sample", "max_audio_samples",
                             "max_sample_bytes"}));
  constexpr int64_t kBig = int64_t{1} << 40;
  if (l["max_pixels"]) {
    ASSIGN_OR_RETURN(limits->max_pixels, Integer(source, l["max_pixels"], "max_pixels", 1, kBig));
  }
  if (l["max_frames_per_sample"]) {
    ASSIGN_OR_RETURN(limits->max_frames_per_sample,
                     Integer(source, l["max_frames_per_sample"], "max_frames_per_sample", 1, 1 << 20));
  }
  if (l["max_audio_samples"]) {
    ASSIGN_OR_RETURN(limits->max_audio_samples,
                     Integer(source, l["max_audio_samples"], "max_audio_samples", 1, kBig));
  }
  if (l["max_sample_bytes"]) {
    ASSIGN_OR_RETURN(limits->max_sample_bytes,
                     Integer(source, l["max_sample_bytes"], "max_sample_bytes", 1, kBig));
  }
  return absl::OkStatus();
}

// The top-level keys besides anchor, streams and clips: on_error, quarantine, limits, and
// tolerance_s, which is returned (every stream's default when given).
absl::StatusOr<std::optional<double>> ParseOptions(std::string_view source, const YAML::Node& root,
                                                   SampleSpec* spec) {
  std::optional<double> tolerance;
  if (root["tolerance_s"]) {
    ASSIGN_OR_RETURN(double t, Number(source, root["tolerance_s"], "tolerance_s"));
    if (t < 0) return ConfigError(source, root["tolerance_s"], "tolerance_s must be >= 0");
    tolerance = t;
  }
  if (root["on_error"]) {
    ASSIGN_OR_RETURN(std::string v, Word(source, root["on_error"], "on_error", {"fail", "skip"}));
    spec->on_error = v == "skip" ? OnError::kSkip : OnError::kFail;
  }
  if (root["quarantine"]) {
    if (!root["quarantine"].IsScalar() || root["quarantine"].Scalar().empty()) {
      return ConfigError(source, root["quarantine"], "quarantine must be a file path");
    }
    spec->quarantine = root["quarantine"].Scalar();
  }
  if (const YAML::Node l = root["limits"]) RETURN_IF_ERROR(ParseLimits(source, l, &spec->limits));
  return tolerance;
}

// A lowdim stream's `normalize:`, resolved from the manifest's statistics.
absl::Status ParseLowdimNormalize(std::string_view source, const YAML::Node& n,
                                  const Manifest& manifest, StreamSpec* s) {
  if (!n["normalize"]) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string v, Word(source, n["normalize"], "normalize",
                                       {"none", "mean_std", "min_max", "quantile", "quantile10"}));
  s->normalize = v == "mean_std"     ? LowdimNorm::kMeanStd
                 : v == "min_max"    ? LowdimNorm::kMinMax
                 : v == "quantile"   ? LowdimNorm::kQuantile
                 : v == "quantile10" ? LowdimNorm::kQuantile10
                                     : LowdimNorm::kNone;
  return ResolveNormalization(manifest, s, source, n["normalize"]);
}

// The keys of stream `s` that its kind allows (each kind's list; any other is an error), except
// the times ParseTimes reads. `key` is the stream's name in the config.
absl::Status ParseKindOptions(std::string_view source, const YAML::Node& key, const YAML::Node& n,
                              const Manifest& manifest, const std::string& what, StreamSpec* s) {
  switch (s->kind) {
    case pb::VIDEO:
      RETURN_IF_ERROR(CheckKeys(source, n, what,
                                {"delta_timestamps", "tolerance_s", "match", "size", "layout",
                                 "dtype", "resize", "normalize", "augment", "autorotate",
                                 "decode"}));
      RETURN_IF_ERROR(ParseImageOptions(source, n, s));
      return ParseDecode(source, n, s);
    case pb::IMAGE:
      RETURN_IF_ERROR(CheckKeys(source, n, what,
                                {"delta_timestamps", "tolerance_s", "match", "size", "layout",
                                 "dtype", "resize", "normalize", "augment", "autorotate"}));
      return ParseImageOptions(source, n, s);
    case pb::LOWDIM:
      RETURN_IF_ERROR(CheckKeys(source, n, what,
                                {"delta_timestamps", "tolerance_s", "match", "normalize", "shape",
                                 "dtype", "pad_to", "overlong"}));
      return ParseLowdimNormalize(source, n, manifest, s);
    case pb::AUDIO:
      RETURN_IF_ERROR(CheckKeys(source, n, what, {"delta_timestamps", "rate", "channels"}));
      if (n["rate"]) {
        ASSIGN_OR_RETURN(int64_t r, Integer(source, n["rate"], "rate", 1000, 384000));
        s->audio_rate = static_cast<int>(r);
      }
      if (n["channels"]) {
        ASSIGN_OR_RETURN(int64_t c, Integer(source, n["channels"], "channels", 1, 16));
        s->audio_channels = static_cast<int>(c);
      }
      return absl::OkStatus();
    case pb::TEXT:
      RETURN_IF_ERROR(CheckKeys(source, n, what, {"tokenizer"}));
      return ParseTokenizer(source, n, what, s);
    default:
      return ConfigError(source, key, StrCat(what, " has an unknown kind"));
  }
}

// When stream `s` is sampled relative to the anchor: audio's window; for video, image and lowdim,
// delta_timestamps, match and tolerance_s (`tolerance`: the config's default, if any). Text has
// no times.
absl::Status ParseTimes(std::string_view source, const YAML::Node& n, const StreamInfo& info,
                        std::optional<double> tolerance, const DecodeLimits& limits,
                        const std::string& what, StreamSpec* s) {
  if (s->kind == pb::TEXT) return absl::OkStatus();
  if (s->kind == pb::AUDIO) {
    if (!n["delta_timestamps"]) {
      return ConfigError(source, n, StrCat(what, ": audio needs delta_timestamps: [start, end], a window "
                                         "in seconds such as [-1.0, 0.0]"));
    }
    ASSIGN_OR_RETURN(std::vector<double> w, Numbers(source, n["delta_timestamps"],
                                                     "audio delta_timestamps", 2, 2));
    if (!(w[1] > w[0])) {
      return ConfigError(source, n["delta_timestamps"], "the audio window [start, end] needs end > start");
    }
    s->window_start = w[0];
    s->window_end = w[1];
    return absl::OkStatus();
  }
  if (n["delta_timestamps"]) {
    ASSIGN_OR_RETURN(s->deltas, Deltas(source, n["delta_timestamps"], 1 << 20));
  } else {
    s->deltas = {0.0};
  }
  if (n["match"]) {
    ASSIGN_OR_RETURN(std::string v, Word(source, n["match"], "match", {"nearest", "previous"}));
    s->match = v == "previous" ? FrameMatch::kPrevious : FrameMatch::kNearest;
  }
  if (n["tolerance_s"]) {
    ASSIGN_OR_RETURN(s->tolerance_s, Number(source, n["tolerance_s"], "tolerance_s"));
    if (s->tolerance_s < 0) return ConfigError(source, n["tolerance_s"], "tolerance_s must be >= 0");
  } else if (tolerance) {
    s->tolerance_s = *tolerance;
  } else {
    // Default: anything up to half a period (plus rounding slack) from a frame or step.
    const double period = Period(info);
    s->tolerance_s = period > 0 ? 0.5 * period + 1e-6 : 1e-4;
  }
  if ((s->kind == pb::VIDEO || s->kind == pb::IMAGE) &&
      static_cast<int64_t>(s->deltas.size()) > limits.max_frames_per_sample) {
    return ConfigError(source, n["delta_timestamps"],
               StrCat(what, " asks for ", s->deltas.size(), " frames per sample, over "
                            "limits.max_frames_per_sample (", limits.max_frames_per_sample, ")"));
  }
  return absl::OkStatus();
}

// `shape: stored` (docs/sampling.md "Low-dim"): a per-clip tensor in the shape
// its `.npy` stored, read from the stream's codec ("npy <f2 77x4096"), asked for once.
absl::Status ParseStoredShape(std::string_view source, const YAML::Node& n, const StreamInfo& info,
                              StreamSpec* s) {
  ASSIGN_OR_RETURN(std::string v, Word(source, n["shape"], "shape", {"stored", "flat"}));
  if (v == "flat") return absl::OkStatus();
  // "npy DTYPE SHAPE", SHAPE "77x4096" or "scalar" (datasets/webdataset/wds_dataset.cc).
  std::istringstream words(info.codec);
  std::string format, dtype, dims, extra;
  words >> format >> dtype >> dims;
  if (format != "npy" || dims.empty() || (words >> extra)) {
    return ConfigError(source, n["shape"],
                       StrCat("shape: stored needs a per-clip tensor (a WebDataset .npy member); "
                              "stream '", s->name, "' is ", info.codec.empty() ? "lowdim" : info.codec,
                              ", served [steps, dim]"));
  }
  if (s->deltas.size() != 1) {
    return ConfigError(source, n["shape"],
                       StrCat("shape: stored serves one tensor per clip; stream '", s->name,
                              "' asks for ", s->deltas.size(), " times: give delta_timestamps: [0.0]"));
  }
  s->stored_shape.clear();
  if (dims != "scalar") {
    std::istringstream parts(dims);
    std::string d;
    while (std::getline(parts, d, 'x')) {
      int64_t value = 0;
      const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), value);
      if (ec != std::errc() || end != d.data() + d.size() || value <= 0) {
        return ConfigError(source, n["shape"], StrCat("stream '", s->name, "': its codec '",
                                                      info.codec, "' names no shape"));
      }
      s->stored_shape.push_back(value);
    }
  }
  if (s->stored_shape.empty()) s->stored_shape.push_back(1);
  return absl::OkStatus();
}

// A lowdim stream's `dtype:` (docs/sampling.md "Tensor dtypes"). `stored` reads a `.npy`
// member's type from the stream's codec ("npy <f2 77x4096"): its values reach the assembler as
// float32 (Dataset::ReadLowdim), which holds every float16 exactly, so float16 is served with
// the member's own bits; float32 and float64 are served as float32 (the wire has no float64, and
// the reader has already rounded it). An integer or bool member is refused rather than served
// as a float that `stored` would not be.
absl::Status ParseValueDType(std::string_view source, const YAML::Node& n, const StreamInfo& info,
                             StreamSpec* s) {
  ASSIGN_OR_RETURN(std::string v, Word(source, n["dtype"], "dtype",
                                       {"float32", "float16", "bfloat16", "stored"}));
  if (v != "stored") {
    s->value_dtype = v == "float16"    ? DType::kFloat16
                     : v == "bfloat16" ? DType::kBFloat16
                                       : DType::kFloat32;
    return absl::OkStatus();
  }
  std::istringstream words(info.codec);
  std::string format, descr;
  words >> format >> descr;
  if (format != "npy") {
    return ConfigError(source, n["dtype"],
                       StrCat("dtype: stored keeps a .npy member's own float type; stream '",
                              s->name, "' is ", info.codec.empty() ? "lowdim" : info.codec,
                              ", read as float32: give dtype: float32, float16 or bfloat16"));
  }
  if (descr == "<f2") {
    s->value_dtype = DType::kFloat16;
  } else if (descr == "<f4" || descr == "<f8") {
    s->value_dtype = DType::kFloat32;
  } else {
    return ConfigError(source, n["dtype"],
                       StrCat("dtype: stored keeps a float member's type; stream '", s->name,
                              "' stores '", descr, "' (not a float): give dtype: float32 to serve "
                              "its values as float32"));
  }
  return absl::OkStatus();
}

// One entry of `streams:` (`key`: the stream's name, `value`: its options, null for none).
absl::StatusOr<StreamSpec> ParseStream(std::string_view source, const YAML::Node& key,
                                       const YAML::Node& value, const Manifest& manifest,
                                       std::optional<double> tolerance,
                                       const DecodeLimits& limits) {
  const std::string name = key.as<std::string>();
  const YAML::Node n = value.IsNull() ? YAML::Node(YAML::NodeType::Map) : value;
  StreamSpec s;
  s.name = name;
  s.stream = manifest.StreamIndex(name);
  if (s.stream < 0) {
    std::string list;
    for (const auto& st : manifest.streams) StrAppend(&list, list.empty() ? "" : ", ", st.name);
    return ConfigError(source, key, StrCat("stream '", name, "' is not in the dataset (it has: ",
                                           list, ")"));
  }
  const StreamInfo& info = manifest.streams[s.stream];
  s.kind = info.kind;
  const std::string what = StrCat("stream '", name, "'");
  RETURN_IF_ERROR(ParseKindOptions(source, key, n, manifest, what, &s));
  RETURN_IF_ERROR(ParseTimes(source, n, info, tolerance, limits, what, &s));
  if (s.kind == pb::LOWDIM && n["shape"]) RETURN_IF_ERROR(ParseStoredShape(source, n, info, &s));
  if (s.kind == pb::LOWDIM && n["dtype"]) RETURN_IF_ERROR(ParseValueDType(source, n, info, &s));
  if (s.kind == pb::LOWDIM) RETURN_IF_ERROR(ParseTensorPadding(source, n, &s));
  return s;
}

absl::StatusOr<SampleSpec> Parse(const YAML::Node& root, const Manifest& manifest,
                                 std::string_view source) {
  SampleSpec spec;
  if (!root.IsMap()) return ConfigError(source, root, "the config must be a mapping with a 'streams' key");
  RETURN_IF_ERROR(CheckKeys(source, root, "the config",
                            {"anchor", "tolerance_s", "on_error", "quarantine", "limits", "streams", "pipeline", "packing",
                             "clips", "buckets"}));
  RETURN_IF_ERROR(ParseAnchor(source, root, manifest, &spec));
  ASSIGN_OR_RETURN(const std::optional<double> tolerance, ParseOptions(source, root, &spec));
  const YAML::Node streams = root["streams"];
  if (!streams || !streams.IsMap() || streams.size() == 0) {
    return ConfigError(source, streams ? streams : root,
               "'streams' must map stream names to their options (at least one)");
  }
  for (const auto& kv : streams) {
    ASSIGN_OR_RETURN(StreamSpec s, ParseStream(source, kv.first, kv.second, manifest, tolerance,
                                               spec.limits));
    spec.streams.push_back(std::move(s));
  }
  if (root["clips"]) RETURN_IF_ERROR(ParseClips(source, root["clips"], manifest, &spec));
  if (root["buckets"]) RETURN_IF_ERROR(ParseBuckets(source, root["buckets"], &spec));
  return spec;
}

}  // namespace

absl::StatusOr<SampleSpec> SampleSpec::FromYaml(std::string_view yaml, const Manifest& manifest,
                                                std::string_view source) {
  constexpr size_t kMaxConfigBytes = 1 << 20;
  if (yaml.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(StrCat(source, ": the config is ", yaml.size(),
                                             " bytes; configs over 1 MiB are refused"));
  }
  ASSIGN_OR_RETURN(YAML::Node root, yaml::Load(yaml, source));
  try {
    absl::StatusOr<SampleSpec> spec = Parse(root, manifest, source);
    if (spec.ok()) {
      spec->config_text = std::string(yaml);
      spec->config_source = std::string(source);
    }
    return spec;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": ", e.msg));
  }
}

absl::StatusOr<SampleSpec> SampleSpec::FromFile(const std::string& path, const Manifest& manifest) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open config ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return FromYaml(ss.str(), manifest, path);
}

absl::StatusOr<SampleSpec> SampleSpec::Default(const Manifest& manifest) {
  std::string yaml = "streams:\n";
  for (const auto& s : manifest.streams) {
    if (s.kind == pb::AUDIO) continue;
    StrAppend(&yaml, "  \"", s.name, "\": {}\n");
  }
  return FromYaml(yaml, manifest, "(default spec)");
}

}  // namespace conveyor
