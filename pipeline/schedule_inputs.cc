// The figures shuffle/schedule.h resolves an order from, measured here on the dataset (episode
// 0's keyframes, the sample index without the quarantined episodes, each episode's resolution
// bucket) so that shuffle/ reads nothing; and ResolveSchedule, which resolves each member's order
// from them.
#include <algorithm>
#include <limits>
#include <set>

#include <spdlog/spdlog.h>

#include "base/status_macros.h"
#include "base/types.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/sample_index.h"
#include "pipeline/internal/spec_figures.h"
#include "pipeline/pipeline.h"
#include "sample/buckets.h"
#include "sample/quarantine.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

// The keyframes of the first episode of manifest stream `stream`; nullopt when the dataset has no
// episode or the first one cannot be read (the schedule then falls back to a second of steps).
std::optional<KeyframeSample> MeasureKeyframes(const Dataset& dataset, int stream) {
  if (dataset.num_episodes() == 0) return std::nullopt;
  auto ep = dataset.LoadEpisode(0);
  if (!ep.ok()) return std::nullopt;
  const auto& flags = (*ep)->streams(stream).packets().flags();
  KeyframeSample sample;
  sample.frames = static_cast<uint64_t>(flags.size());
  for (int i = 0; i < flags.size(); ++i) {
    if (flags[i] & 1) sample.keyframes.push_back(static_cast<uint64_t>(i));
  }
  return sample;
}

// Each episode's bucket (sample/buckets.h: its reference camera's displayed size, one index read
// per episode with samples, once per pipeline); `starts` are the index's episode starts, then the
// total. An unreadable index is an error naming the episode, unless on_error: skip, which leaves
// the episode in bucket 0 to be skipped and counted when its samples are assembled.
absl::StatusOr<std::vector<uint32_t>> MeasureEpisodeBuckets(const Dataset& dataset,
                                                            const SampleSpec& spec,
                                                            const std::vector<uint64_t>& starts) {
  std::vector<uint32_t> bucket(starts.size() - 1, 0);
  uint64_t unreadable = 0;
  for (size_t e = 0; e < bucket.size(); ++e) {
    if (starts[e + 1] == starts[e]) continue;  // quarantined or empty: never read
    absl::StatusOr<size_t> b = EpisodeBucket(spec, dataset, e);
    if (!b.ok() && spec.on_error == OnError::kSkip) {
      ++unreadable;
      continue;
    }
    if (!b.ok()) {
      return absl::Status(b.status().code(),
                          StrCat(b.status().message(), " (on_error: skip, or `conveyor check "
                                 "--write-quarantine` and `quarantine:`, leave such episodes out)"));
    }
    bucket[e] = static_cast<uint32_t>(*b);
  }
  if (unreadable > 0) {
    spdlog::warn("buckets: {} episode(s) of {} have no readable index; on_error: skip keeps them "
                 "in bucket 0, to be skipped when assembled", unreadable, dataset.uri());
  }
  return bucket;
}

// With `buckets: {by: STREAM}`: each episode's bucket is its tensor's stored shape, the buckets
// the distinct shapes of the episodes with samples in lexicographic order (so the same dataset
// and spec give the same numbering everywhere); read from the dataset's member index
// (Dataset::StoredShape), no tensor read. An unreadable episode is handled as
// MeasureEpisodeBuckets does.
absl::Status MeasureShapeBuckets(const Dataset& dataset, const SampleSpec& spec,
                                 const std::vector<uint64_t>& starts, ScheduleInputs* in) {
  const int stream = spec.streams[static_cast<size_t>(spec.buckets.by)].stream;
  std::vector<std::vector<int64_t>> shapes(starts.size() - 1);
  std::vector<bool> known(shapes.size(), false);
  uint64_t unreadable = 0;
  for (size_t e = 0; e < shapes.size(); ++e) {
    if (starts[e + 1] == starts[e]) continue;  // quarantined or empty: never read
    absl::StatusOr<std::vector<int64_t>> shape = dataset.StoredShape(e, stream);
    if (!shape.ok() && spec.on_error == OnError::kSkip) {
      ++unreadable;
      continue;
    }
    if (!shape.ok()) {
      return absl::Status(shape.status().code(),
                          StrCat(shape.status().message(), ": its bucket (buckets.by) (on_error: "
                                 "skip, or `conveyor check --write-quarantine` and `quarantine:`, "
                                 "leave such episodes out)"));
    }
    shapes[e] = *std::move(shape);
    known[e] = true;
  }
  std::vector<std::vector<int64_t>> distinct;
  for (size_t e = 0; e < shapes.size(); ++e) {
    if (known[e]) distinct.push_back(shapes[e]);
  }
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  in->num_buckets = std::max<size_t>(1, distinct.size());
  in->largest_bucket_elements = 0;
  for (const std::vector<int64_t>& shape : distinct) {
    uint64_t n = 1;
    for (const int64_t d : shape) {
      if (d < 0 || !CheckedMul(n, static_cast<uint64_t>(d), &n)) n = std::numeric_limits<uint64_t>::max();
    }
    in->largest_bucket_elements = std::max(in->largest_bucket_elements, n);
  }
  in->episode_buckets.assign(shapes.size(), 0);
  for (size_t e = 0; e < shapes.size(); ++e) {
    if (!known[e]) continue;
    in->episode_buckets[e] = static_cast<uint32_t>(
        std::lower_bound(distinct.begin(), distinct.end(), shapes[e]) - distinct.begin());
  }
  if (unreadable > 0) {
    spdlog::warn("buckets: {} episode(s) of {} have no readable shape; on_error: skip keeps them "
                 "in bucket 0, to be skipped when assembled", unreadable, dataset.uri());
  }
  spdlog::info("buckets: {}: {} stored shapes of '{}', one bucket each", dataset.uri(),
               distinct.size(), spec.streams[static_cast<size_t>(spec.buckets.by)].name);
  return absl::OkStatus();
}

// One member's order, resolved with its share of the budget; a dataset that reads whole episodes
// then keeps the episodes of two windows parsed. `largest_bucket_elements` (may be null): set
// when the buckets by a stored shape were measured (ScheduleInputs' figure of the same name).
absl::Status ResolveMemberOrder(const Dataset& dataset, const SampleSpec& spec, uint64_t queue_bytes,
                                OrderOptions* order, uint64_t* largest_bucket_elements = nullptr) {
  ASSIGN_OR_RETURN(const ScheduleInputs in, MeasureSchedule(dataset, spec, *order));
  RETURN_IF_ERROR(ResolveOrder(in, queue_bytes, order));
  if (largest_bucket_elements != nullptr && in.largest_bucket_elements > 0) {
    *largest_bucket_elements = in.largest_bucket_elements;
  }
  if (const uint64_t bytes = EpisodeCacheBytes(in, *order); bytes > 0) {
    dataset.ReserveEpisodeCache(bytes);
  }
  return absl::OkStatus();
}

// Buckets (shuffle/buckets.h): the group is the spec's, else the global batch size; a batch must
// lie inside a group. A mixture lays every batch out across its members by weight, which would
// mix buckets in a batch.
absl::Status ResolveBucketGroup(const Source& source, const SampleSpec& spec, PipelineOptions* o) {
  if (source.is_mixture()) {
    return absl::InvalidArgumentError(
        "buckets: a mixture puts every dataset's share in each global batch, so its batches cannot "
        "hold one bucket; bucket one dataset (a WebDataset folder of mixed resolutions), or mix "
        "datasets without buckets");
  }
  const uint64_t group = spec.buckets.group > 0 ? spec.buckets.group : o->global_batch_size;
  if (o->global_batch_size == 0 || group % o->global_batch_size != 0) {
    return absl::InvalidArgumentError(StrCat(
        "buckets.group ", group, " is not a multiple of global_batch_size ", o->global_batch_size,
        ": a global batch must lie inside one group of one bucket"));
  }
  if (o->order.bucket_group != 0 && o->order.bucket_group != group) {
    o->order.buckets.reset();  // resolved for another group size
  }
  o->order.bucket_group = group;
  return absl::OkStatus();
}

}  // namespace

bool HasVideo(const SampleSpec& spec) {
  for (const StreamSpec& s : spec.streams) {
    if (s.kind == pb::VIDEO) return true;
  }
  return false;
}

std::vector<ScheduleCamera> ScheduleCameras(const SampleSpec& spec, const Manifest& manifest) {
  std::vector<ScheduleCamera> cameras;
  for (const StreamSpec& s : spec.streams) {
    if (s.kind != pb::VIDEO) continue;
    const StreamInfo& info = manifest.streams[s.stream];
    ScheduleCamera c;
    c.name = s.name;
    c.rate = info.rate;
    if (!s.deltas.empty()) {
      const auto [lo, hi] = std::minmax_element(s.deltas.begin(), s.deltas.end());
      c.min_delta = *lo;
      c.max_delta = *hi;
    }
    // Frames are kept at the spec's size, or at the stream's own (either side: rotation may swap
    // them) when it crops or gives none.
    int64_t h = s.height, w = s.width;
    if (h == 0 || s.augment.crop.has_value()) {
      h = info.shape.size() >= 2 ? std::max(info.shape[0], info.shape[1]) : 1;
      w = h;
    }
    c.frame_bytes = static_cast<uint64_t>(h * w * 3);
    cameras.push_back(std::move(c));
  }
  return cameras;
}

absl::StatusOr<ScheduleInputs> MeasureSchedule(const Dataset& dataset, const SampleSpec& spec,
                                               const OrderOptions& order) {
  const Manifest& manifest = dataset.manifest();
  ScheduleInputs in;
  in.dataset_name = manifest.name;
  in.anchor_rate = manifest.streams[spec.anchor_stream].rate;
  in.clips = spec.clips.enabled();
  in.whole_episodes = dataset.reads_whole_episodes();
  if (in.whole_episodes) in.mean_episode_bytes = dataset.mean_episode_bytes();
  in.cameras = ScheduleCameras(spec, manifest);
  in.buckets = spec.buckets.enabled();
  in.num_buckets = spec.buckets.sizes.size();
  const ScheduleNeeds needs = ScheduleNeedsOf(order, in.clips, in.buckets);
  if (needs.episode_starts) {
    ASSIGN_OR_RETURN(std::set<uint64_t> quarantined, QuarantinedEpisodes(spec, dataset));
    // Samples per episode with clips are its clips; their count does not depend on the clips'
    // key, only their anchors do.
    ASSIGN_OR_RETURN(SampleIndex index,
                     SampleIndex::Build(dataset, spec.anchor_stream, quarantined, spec.clips));
    in.episode_starts.reserve(index.num_episodes() + 1);
    for (uint64_t e = 0; e < index.num_episodes(); ++e) in.episode_starts.push_back(index.EpisodeStart(e));
    in.episode_starts.push_back(index.size());
  }
  if (needs.episode_buckets && spec.buckets.by >= 0) {
    RETURN_IF_ERROR(MeasureShapeBuckets(dataset, spec, in.episode_starts, &in));
  } else if (needs.episode_buckets) {
    ASSIGN_OR_RETURN(in.episode_buckets, MeasureEpisodeBuckets(dataset, spec, in.episode_starts));
  }
  if (needs.keyframes) {
    for (const StreamSpec& s : spec.streams) {
      if (s.kind != pb::VIDEO) continue;
      in.keyframes = MeasureKeyframes(dataset, s.stream);  // the first camera's
      break;
    }
  }
  return in;
}

absl::Status ResolveSchedule(const Source& source, const SampleSpec& spec, PipelineOptions* options) {
  PipelineOptions& o = *options;
  if (spec.buckets.enabled()) RETURN_IF_ERROR(ResolveBucketGroup(source, spec, &o));
  if (!source.is_mixture()) {
    return ResolveMemberOrder(source.dataset(0), spec, o.queue_bytes, &o.order, &o.largest_bucket_elements);
  }
  if (o.member_orders.size() == source.size()) return absl::OkStatus();  // resolved before
  ASSIGN_OR_RETURN(std::vector<BoundMember> bound, source.Bind(spec));
  o.member_orders.assign(source.size(), o.order);
  for (size_t k = 0; k < source.size(); ++k) {
    // The members share the budget: each gets an equal part for its windows.
    RETURN_IF_ERROR(ResolveMemberOrder(source.dataset(k), bound[k].spec, o.queue_bytes / source.size(),
                                       &o.member_orders[k]));
  }
  return absl::OkStatus();
}

absl::Status ResolveSchedule(const Dataset& dataset, const SampleSpec& spec, PipelineOptions* options) {
  return ResolveSchedule(*Source::Of(dataset), spec, options);
}

}  // namespace conveyor
