#include "sample/buckets.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <yaml-cpp/yaml.h>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "sample/sample_spec.h"
#include "sample/yaml_config.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

constexpr int kMaxSide = 16384;

// The size of about `area` pixels at width / height = ratio, both sides multiples of `multiple`
// (at least one multiple).
BucketSize SizeFor(double area, double ratio, int multiple) {
  auto round_to = [multiple](double v) {
    return std::max(multiple, static_cast<int>(std::llround(v / multiple)) * multiple);
  };
  return BucketSize{round_to(std::sqrt(area / ratio)), round_to(std::sqrt(area * ratio))};
}

// `buckets: {by: STREAM}`: one bucket per stored shape of a per-clip tensor of the spec.
absl::Status ParseShapeBuckets(std::string_view source, const YAML::Node& b, SampleSpec* spec) {
  using yaml::ConfigError;
  for (const char* k : {"sizes", "area", "ratios", "multiple"}) {
    if (b[k]) {
      return ConfigError(source, b[k], StrCat("buckets: by keys the buckets by a tensor's stored "
                                              "shape; ", k, " goes with camera buckets, not with by"));
    }
  }
  if (!b["by"].IsScalar()) return ConfigError(source, b["by"], "buckets.by must name a stream");
  const std::string name = b["by"].Scalar();
  for (size_t i = 0; i < spec->streams.size(); ++i) {
    StreamSpec& s = spec->streams[i];
    if (s.name != name) continue;
    if (s.kind != pb::LOWDIM || s.stored_shape.empty()) {
      return ConfigError(source, b["by"], StrCat("buckets.by: stream '", name, "' must be a per-clip "
                                                 "tensor served with shape: stored (a .npy member)"));
    }
    if (s.pad_to > 0) {
      return ConfigError(source, b["by"], StrCat("buckets.by: stream '", name, "' has pad_to; a "
                                                 "bucket per shape needs no padding: remove one"));
    }
    spec->buckets.by = static_cast<int>(i);
    return absl::OkStatus();
  }
  std::string list;
  for (const StreamSpec& s : spec->streams) StrAppend(&list, list.empty() ? "" : ", ", s.name);
  return ConfigError(source, b["by"], StrCat("buckets.by: '", name, "' is not a stream of the spec "
                                             "(it has: ", list, ")"));
}

}  // namespace

absl::Status ParseBuckets(std::string_view source, const YAML::Node& b, SampleSpec* spec) {
  using yaml::ConfigError;
  if (!b.IsMap()) {
    return ConfigError(source, b, "buckets must be a mapping: {sizes: [[H, W], ...]} or {area: A, "
                                  "ratios: [W/H, ...]}");
  }
  RETURN_IF_ERROR(yaml::CheckKeys(source, b, "buckets", {"sizes", "area", "ratios", "multiple", "group", "by"}));
  FrameBuckets& out = spec->buckets;
  if (b["group"]) {
    ASSIGN_OR_RETURN(int64_t g, yaml::Integer(source, b["group"], "buckets.group", 1, 1 << 20));
    out.group = static_cast<uint64_t>(g);
  }
  if (b["by"]) return ParseShapeBuckets(source, b, spec);
  if (b["sizes"] && (b["area"] || b["ratios"])) {
    return ConfigError(source, b, "buckets: give sizes, or area and ratios, not both");
  }
  if (b["sizes"]) {
    if (!b["sizes"].IsSequence() || b["sizes"].size() == 0) {
      return ConfigError(source, b["sizes"], "buckets.sizes must be a list of [height, width]");
    }
    for (const YAML::Node& n : b["sizes"]) {
      ASSIGN_OR_RETURN(std::vector<double> hw, yaml::Numbers(source, n, "buckets.sizes entry", 2, 2));
      for (double v : hw) {
        if (v < 1 || v > kMaxSide || v != std::floor(v)) {
          return ConfigError(source, n, "a bucket size must be [height, width], integers in [1, 16384]");
        }
      }
      out.sizes.push_back(BucketSize{static_cast<int>(hw[0]), static_cast<int>(hw[1])});
    }
    if (b["multiple"]) return ConfigError(source, b["multiple"], "buckets.multiple goes with area and ratios");
  } else {
    if (!b["area"] || !b["ratios"]) {
      return ConfigError(source, b, "buckets needs sizes: [[H, W], ...], or area: PIXELS with ratios: "
                                    "[W/H, ...]");
    }
    ASSIGN_OR_RETURN(double area, yaml::Number(source, b["area"], "buckets.area"));
    if (!(area >= 1 && area <= double{kMaxSide} * kMaxSide)) {
      return ConfigError(source, b["area"], "buckets.area must be a pixel count in [1, 16384^2]");
    }
    int64_t multiple = 16;
    if (b["multiple"]) {
      ASSIGN_OR_RETURN(multiple, yaml::Integer(source, b["multiple"], "buckets.multiple", 1, 1024));
    }
    ASSIGN_OR_RETURN(std::vector<double> ratios,
                     yaml::Numbers(source, b["ratios"], "buckets.ratios", 1, 256));
    for (double r : ratios) {
      const BucketSize s = SizeFor(area, r, static_cast<int>(multiple));
      if (!(r > 0) || s.height > kMaxSide || s.width > kMaxSide) {
        return ConfigError(source, b["ratios"],
                           StrCat("buckets.ratios: ", r, " (width / height) must be > 0 and give "
                                  "sides of at most 16384 at area ", area));
      }
      out.sizes.push_back(s);
    }
  }
  for (size_t i = 0; i < out.sizes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (out.sizes[i] == out.sizes[j]) {
        return ConfigError(source, b, StrCat("buckets: ", out.sizes[i].height, "x", out.sizes[i].width,
                                             " (height x width) is listed twice; each bucket is one size"));
      }
    }
  }
  for (size_t i = 0; i < spec->streams.size(); ++i) {
    StreamSpec& s = spec->streams[i];
    if (s.kind != pb::VIDEO && s.kind != pb::IMAGE) continue;
    if (out.reference < 0) out.reference = static_cast<int>(i);
    if (s.height != 0 || s.width != 0) {
      return ConfigError(source, b, StrCat("buckets set the size of every camera per clip; stream '",
                                           s.name, "' gives size: remove it"));
    }
    if (s.augment.crop.has_value()) {
      // A bucket's crop is the clip's centre at the bucket's aspect; a random resized crop would
      // draw another rectangle at another aspect.
      return ConfigError(source, b, StrCat("buckets cut each clip to its bucket's aspect around the "
                                           "centre; stream '", s.name, "' has random_resized_crop, "
                                           "which buckets do not combine with: remove one"));
    }
    if (s.decode == DecodeBackend::kGpu) {
      return ConfigError(source, b, StrCat("buckets crop in the CPU decoder; stream '", s.name,
                                           "' asks for decode: gpu"));
    }
  }
  if (out.reference < 0) {
    return ConfigError(source, b, "buckets need a video or image stream in the spec (the clip's "
                                  "aspect picks its bucket)");
  }
  return absl::OkStatus();
}

size_t NearestBucket(const FrameBuckets& buckets, int width, int height) {
  const double aspect = std::log(static_cast<double>(width) / static_cast<double>(height));
  size_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < buckets.sizes.size(); ++i) {
    const BucketSize& b = buckets.sizes[i];
    const double d = std::fabs(aspect - std::log(static_cast<double>(b.width) / b.height));
    if (d < best_d) best = i, best_d = d;
  }
  return best;
}

size_t EpisodeBucket(const SampleSpec& spec, const pb::EpisodeIndex& index) {
  const StreamSpec& s = spec.streams[static_cast<size_t>(spec.buckets.reference)];
  const DisplayedSize shown = DisplayedSizeOf(index.streams(s.stream), s.autorotate);
  return NearestBucket(spec.buckets, std::max(shown.width, 1), std::max(shown.height, 1));
}

absl::StatusOr<size_t> EpisodeBucket(const SampleSpec& spec, const Dataset& dataset, uint64_t episode) {
  auto index = dataset.LoadEpisode(episode);
  if (!index.ok()) {
    return Annotate(index.status(), StrCat("dataset ", dataset.uri(), ", episode ", episode,
                                           ": its bucket (the reference camera's size)"));
  }
  return EpisodeBucket(spec, **index);
}

VideoCrop BucketCrop(const BucketSize& bucket, DisplayedSize shown) {
  VideoCrop c;
  // Compare w / h with the bucket's W / H in integers: w * H against W * h.
  const int64_t lhs = int64_t{shown.width} * bucket.height, rhs = int64_t{bucket.width} * shown.height;
  if (lhs > rhs) {  // wider than the bucket: full height, the middle columns
    c.height = shown.height;
    c.width = std::max<int>(1, static_cast<int>(rhs / bucket.height));
  } else {  // taller (or equal): full width, the middle rows
    c.width = shown.width;
    c.height = std::max<int>(1, static_cast<int>(int64_t{bucket.height} * shown.width / bucket.width));
  }
  c.x = (shown.width - c.width) / 2;
  c.y = (shown.height - c.height) / 2;
  return c;
}

}  // namespace conveyor
