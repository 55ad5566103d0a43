// Resolution and aspect-ratio buckets (`buckets:` in the spec, docs/sampling.md "Buckets"): a
// list of output sizes; each episode (a clip's video) goes to the bucket nearest its source aspect
// ratio, and its frames are cut to the bucket's aspect around their centre and scaled to its size,
// so clips of mixed shapes train at their own aspect without padding or distortion. The order
// (shuffle/buckets.h) puts only one bucket's samples in a batch.
//
// Everything here is a pure function of the spec and the episode's index: the order, the
// assembler and `conveyor check` compute the same bucket for an episode.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "format/format_fwd.h"
#include "media/video_decoder.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace conveyor {

struct SampleSpec;

struct BucketSize {
  int height = 0, width = 0;
  bool operator==(const BucketSize&) const = default;
};

struct FrameBuckets {
  std::vector<BucketSize> sizes;  // empty: no buckets (every camera at its stream's `size`)
  // Samples per group: a group is `group` samples of one bucket, and a global batch lies inside
  // one group (global_batch_size must divide it). 0: the global batch size, so a job resumes at
  // another batch size only when the config names the group (docs/sampling.md "Buckets").
  uint64_t group = 0;
  // The spec stream whose displayed size (first frame's codec size, turned upright when the
  // stream autorotates) picks an episode's bucket: the first video or image stream of the spec.
  int reference = -1;
  // `by: STREAM`: buckets keyed by a per-clip tensor's stored shape instead of a camera's aspect
  // (latents or embeddings without video): each distinct shape of that spec stream (this index;
  // -1: none) is a bucket, and `sizes` is empty. The buckets are the dataset's distinct shapes in
  // lexicographic order, measured when the pipeline opens (pipeline/schedule_inputs.cc, through
  // Dataset::StoredShape: the member index, no tensor read).
  int by = -1;
  bool enabled() const { return !sizes.empty() || by >= 0; }
  // Whether the buckets cut the cameras (sizes); `by` buckets leave them to each stream's `size`.
  bool cuts_frames() const { return !sizes.empty(); }
};

// Parses the `buckets:` section against the spec's streams (already parsed; sets every video and
// image stream's output size per sample, so none may give `size:`):
//   buckets: {sizes: [[256, 448], [448, 256], [320, 320]], group: 32}
//   buckets: {area: 102400, ratios: [0.5625, 1.0, 1.7778], multiple: 16, group: 32}
//   buckets: {by: latents.npy, group: 32}   (a `shape: stored` stream: one bucket per shape)
// `ratios` are width / height; each bucket is the size of about `area` pixels at that ratio, both
// sides rounded to a multiple of `multiple` (default 16). Errors name source:line:col.
absl::Status ParseBuckets(std::string_view source, const YAML::Node& node, SampleSpec* spec);

// The bucket nearest an aspect ratio (width / height): the smallest |log(aspect) - log(w / h)|,
// ties to the lower index. REQUIRES: buckets.cuts_frames(), width and height > 0.
size_t NearestBucket(const FrameBuckets& buckets, int width, int height);

// The camera bucket of episode `episode` (REQUIRES: spec.buckets.cuts_frames(); `by:` buckets are
// numbered from the dataset's shapes, pipeline/schedule_inputs.cc): from its index's reference
// stream (loaded through the dataset, so an unreadable index is an error naming the episode).
absl::StatusOr<size_t> EpisodeBucket(const SampleSpec& spec, const Dataset& dataset,
                                     uint64_t episode);
// The same from an index already loaded.
size_t EpisodeBucket(const SampleSpec& spec, const format::v1::EpisodeIndex& index);

// The largest rectangle of the bucket's aspect centred in a frame of `shown` size: what is
// scaled to the bucket's size (a resize to cover the bucket, then a centre crop, in one pass).
VideoCrop BucketCrop(const BucketSize& bucket, DisplayedSize shown);

}  // namespace conveyor
