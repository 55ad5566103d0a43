// The memory estimate (pipeline/pipeline.h EstimateMemory): the most one consumer's pipeline
// holds, priced from the spec and the manifest before anything is decoded, so that a server can
// refuse a stream it cannot afford.
#include <algorithm>
#include <limits>
#include <thread>

#include "base/types.h"
#include "conveyor/format/v1/shard.pb.h"
#include "pipeline/internal/spec_figures.h"
#include "pipeline/pipeline.h"
#include "sample/tokenizer.h"

namespace conveyor {

namespace pb = format::v1;

uint64_t EstimateSampleBytes(const SampleSpec& spec, const Manifest& m, uint64_t largest_bucket_elements) {
  uint64_t total = 0;
  for (size_t k = 0; k < spec.streams.size(); ++k) {
    const StreamSpec& s = spec.streams[k];
    const StreamInfo& info = m.streams[s.stream];
    switch (s.kind) {
      case pb::VIDEO:
      case pb::IMAGE: {
        int64_t h = s.height, w = s.width;
        if (h == 0 && info.shape.size() >= 2 && !spec.buckets.enabled()) {  // buckets: their sizes
          h = std::max(info.shape[0], info.shape[1]);  // rotation may swap them
          w = h;
        }
        for (const BucketSize& b : spec.buckets.sizes) {  // the largest bucket
          if (int64_t{b.height} * b.width > h * w) h = b.height, w = b.width;
        }
        total += s.deltas.size() * static_cast<uint64_t>(h * w * 3) *
                 (s.dtype == ImageDType::kFloat32 ? 4 : 1);
        total += s.deltas.size();
        break;
      }
      case pb::LOWDIM:
        if (!s.stored_shape.empty()) {  // one tensor in its served shape (pad_to's N rows), a flag a row
          uint64_t n = 1;
          for (int64_t d : s.stored_shape) n *= static_cast<uint64_t>(d);
          if (spec.buckets.by == static_cast<int>(k)) {  // any stored shape: the largest one
            n = std::max(n, largest_bucket_elements);
          }
          uint64_t bytes = 0;
          if (!CheckedMul(n, DTypeSize(s.value_dtype), &bytes)) bytes = std::numeric_limits<uint64_t>::max();
          total = CheckedAdd(total, bytes, &total) ? total : std::numeric_limits<uint64_t>::max();
          total += static_cast<uint64_t>(s.stored_shape[0]);
          break;
        }
        total += s.deltas.size() * (info.shape.empty() ? 1 : info.shape[0]) * DTypeSize(s.value_dtype) +
                 s.deltas.size();
        break;
      case pb::AUDIO: {
        const double rate = s.audio_rate > 0 ? s.audio_rate : info.rate;
        const uint64_t n = static_cast<uint64_t>(std::llround((s.window_end - s.window_start) * rate));
        const int64_t ch = s.audio_channels > 0 ? s.audio_channels : (info.shape.empty() ? 1 : info.shape[0]);
        total += n * ch * 4 + n;
        break;
      }
      default:  // text: 256 bytes, or its token ids (4 bytes each) up to the tokenizer's cap
        if (s.tokenizer != nullptr) {
          const int64_t cap = s.tokenizer->options().max_tokens;
          total += 4 * static_cast<uint64_t>(cap > 0 ? cap : 256);
        } else {
          total += 256;
        }
    }
  }
  return std::max<uint64_t>(total, 1);
}

MemoryEstimate EstimateMemory(const Source& source, const SampleSpec& spec,
                              const PipelineOptions& o) {
  auto mul = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return CheckedMul(a, b, &r) ? r : std::numeric_limits<uint64_t>::max();
  };
  auto add = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return CheckedAdd(a, b, &r) ? r : std::numeric_limits<uint64_t>::max();
  };
  MemoryEstimate e;
  e.sample_bytes = EstimateSampleBytes(spec, source.manifest(), o.largest_bucket_elements);
  const uint64_t local = o.consumers > 0 ? o.global_batch_size / o.consumers : o.global_batch_size;
  e.batch_bytes = mul(local, e.sample_bytes);
  bool scheduled = HasVideo(spec) && !o.order.naive();
  if (source.is_mixture()) {
    scheduled = false;
    for (const OrderOptions& mo : o.member_orders) scheduled = scheduled || (HasVideo(spec) && !mo.naive());
  }
  if (scheduled) {
    const std::vector<ScheduleCamera> cameras = ScheduleCameras(spec, source.manifest());
    const double anchor_rate = source.manifest().streams[spec.anchor_stream].rate;
    auto window_bytes = [&](const OrderOptions& order) {
      return mul(order.window_blocks, EstimateBlockFrameBytes(cameras, anchor_rate, order.block_steps));
    };
    if (!source.is_mixture()) {
      e.window_prefetch_bytes = mul(2, window_bytes(o.order));
    } else {
      for (size_t k = 0; k < source.size() && k < o.member_orders.size(); ++k) {
        // Each member holds at most two windows; its blocks are sized by its own rates.
        e.window_prefetch_bytes = add(e.window_prefetch_bytes, mul(2, window_bytes(o.member_orders[k])));
      }
    }
  }
  const uint64_t threads = o.threads > 0 ? static_cast<uint64_t>(o.threads)
                                         : std::max(1u, std::thread::hardware_concurrency());
  const uint64_t budget = scheduled ? o.queue_bytes / 2 : o.queue_bytes;
  const uint64_t ahead = source.is_mixture() ? add(mul(2, local), 2 * threads) : add(local, 2 * threads);
  e.in_flight_bytes = std::max(mul(ahead, e.sample_bytes), budget);
  e.total = add(add(e.window_prefetch_bytes, e.in_flight_bytes), mul(2, e.batch_bytes));
  return e;
}

MemoryEstimate EstimateMemory(const Dataset& dataset, const SampleSpec& spec,
                              const PipelineOptions& o) {
  return EstimateMemory(*Source::Of(dataset), spec, o);
}

}  // namespace conveyor
