#include "sample/sample_assembler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>

#include "base/float16.h"
#include "base/mix.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/npy.h"
#include "media/decode_placement.h"
#include "sample/augment.h"
#include "sample/stored_tensor.h"
#include "sample/tokenizer.h"

namespace conveyor {

namespace pb = format::v1;

size_t OwnedTensor::num_elements() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

const OwnedTensor* Sample::Find(std::string_view name) const {
  for (const OwnedTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t OwnedTensor::bytes() const {
  if (frames.empty()) return data.size();
  size_t n = 0;
  for (const auto& f : frames) n += f->pixels.size();
  return n;
}

void OwnedTensor::CopyTo(uint8_t* dst) const {
  if (frames.empty()) {
    if (!data.empty()) std::memcpy(dst, data.data(), data.size());
    return;
  }
  for (const auto& f : frames) {
    std::memcpy(dst, f->pixels.data(), f->pixels.size());
    dst += f->pixels.size();
  }
}

size_t Sample::bytes() const {
  size_t n = 0;
  for (const OwnedTensor& t : tensors) n += t.bytes();
  return n;
}

// ---------------------------------------------------------------------------------------------

namespace {

// Whether video stream `s` (of manifest stream `info`) can be decoded where its `decode:` puts it
// in host batches, in this process. Only NVDEC can be refused; the CPU decodes any stream.
absl::Status CheckVideoBackend(const StreamSpec& s, const StreamInfo& info) {
  if (ChooseDecodeBackend(s.decode, DecodeSite::kHostBatches) != DecodeBackend::kGpu) {
    return absl::OkStatus();
  }
  VideoStreamInfo vs;
  vs.codec = info.codec;
  vs.pix_fmt = info.pix_fmt;
  if (info.shape.size() >= 2) {
    vs.height = static_cast<int>(info.shape[0]);
    vs.width = static_cast<int>(info.shape[1]);
  }
  const absl::Status st = NvdecRefusal(vs, s.width > 0, s.resize);
  if (st.ok()) return st;
  return absl::FailedPreconditionError(StrCat(s.decode_at.empty() ? "" : StrCat(s.decode_at, ": "),
                                              "stream '", s.name, "': decode: gpu, but ",
                                              st.message()));
}

}  // namespace

absl::Status CheckVideoBackends(const SampleSpec& spec, const Manifest& manifest) {
  for (const StreamSpec& s : spec.streams) {
    if (s.kind != pb::VIDEO) continue;
    RETURN_IF_ERROR(CheckVideoBackend(s, manifest.streams[static_cast<size_t>(s.stream)]));
    if (s.decode == DecodeBackend::kAuto && !s.decode_at.empty()) {
      LogAutoDecodeOnce(StrCat("stream '", s.name, "'"), s.decode_at);
    }
  }
  return absl::OkStatus();
}

struct SampleAssembler::Episode {
  uint64_t episode = 0;
  uint64_t last_use = 0;
  std::shared_ptr<const pb::EpisodeIndex> index;
  std::vector<std::optional<FrameTable>> tables;  // per manifest stream, built on first use
};

SampleAssembler::SampleAssembler(const Dataset& dataset, const SampleSpec& spec,
                                 const SampleIndex& index)
    : dataset_(dataset), spec_(spec), index_(index), audio_(spec.audio_method) {
  for (const StreamSpec& s : spec_.streams) {
    backends_.push_back(s.kind == pb::VIDEO
                            ? ChooseDecodeBackend(s.decode, DecodeSite::kHostBatches)
                            : DecodeBackend::kCpu);
  }
  video_.resize(spec_.streams.size());
}

SampleAssembler::~SampleAssembler() = default;

absl::StatusOr<SampleAssembler::Episode*> SampleAssembler::GetEpisode(uint64_t episode) {
  ++tick_;
  for (auto& e : episodes_) {
    if (e->episode == episode) {
      e->last_use = tick_;
      return e.get();
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const pb::EpisodeIndex> index, dataset_.LoadEpisode(episode));
  ++stats_.episode_loads;
  constexpr size_t kCachedEpisodes = 4;
  std::unique_ptr<Episode>* slot = nullptr;
  if (episodes_.size() < kCachedEpisodes) {
    slot = &episodes_.emplace_back(std::make_unique<Episode>());
  } else {
    slot = &*std::min_element(episodes_.begin(), episodes_.end(), [](const auto& a, const auto& b) {
      return a->last_use < b->last_use;
    });
    *slot = std::make_unique<Episode>();
  }
  Episode* e = slot->get();
  e->episode = episode;
  e->last_use = tick_;
  e->index = std::move(index);
  e->tables.resize(static_cast<size_t>(e->index->streams_size()));
  return e;
}

absl::StatusOr<const FrameTable*> SampleAssembler::Table(Episode& ep, int stream) {
  auto& slot = ep.tables[static_cast<size_t>(stream)];
  if (!slot) {
    ASSIGN_OR_RETURN(FrameTable t, FrameTable::Build(ep.index->streams(stream)));
    slot = std::move(t);
  }
  return &*slot;
}

absl::StatusOr<double> SampleAssembler::AnchorTime(Episode& ep, uint32_t step) {
  const pb::StreamIndex& a = ep.index->streams(spec_.anchor_stream);
  if (a.kind() == pb::LOWDIM) {
    if (step >= static_cast<uint32_t>(a.timestamps_s_size())) {
      return absl::DataLossError(StrCat("stream '", a.name(), "': step ", step, " is past its ",
                                        a.timestamps_s_size(), " steps"));
    }
    return a.timestamps_s(static_cast<int>(step));
  }
  auto t = Table(ep, spec_.anchor_stream);
  if (!t.ok()) return Annotate(t.status(), StrCat("stream '", a.name(), "'"));
  if (step >= (*t)->size()) {
    return absl::DataLossError(StrCat("stream '", a.name(), "': frame ", step, " is past its ",
                                      (*t)->size(), " shown frames"));
  }
  return (*t)->time_s[step];
}

uint64_t SampleAssembler::DecodeSettingsKey(size_t spec_stream) const {
  const VideoOutput vo = OutputFor(spec_.streams[spec_stream]);
  uint64_t h = Mix64(0x6465636f6465ull ^ static_cast<uint64_t>(static_cast<uint32_t>(vo.width)));
  h = Mix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(vo.height)));
  h = Mix64(h ^ static_cast<uint64_t>(vo.filter));
  h = Mix64(h ^ (vo.autorotate ? 1u : 0u));
  // NVDEC's pixels are not the CPU's: a cache never hands one's frames to the other.
  if (backends_[spec_stream] == DecodeBackend::kGpu) h = Mix64(h ^ 0x6e76646563ull);
  return h;
}

bool SampleAssembler::CropsInDecoder(size_t si) const {
  const StreamSpec& s = spec_.streams[si];
  return spec_.crop_method == CropMethod::kInDecoder && s.kind == pb::VIDEO &&
         s.augment.crop.has_value() && backends_[si] == DecodeBackend::kCpu;
}

VideoOutput SampleAssembler::OutputFor(const StreamSpec& s) const {
  VideoOutput vo;
  vo.autorotate = s.autorotate;
  vo.filter = s.resize;
  if (!s.augment.crop.has_value()) {
    vo.width = s.width;
    vo.height = s.height;
  }
  return vo;
}

namespace {

// Which decode position a decoder keeps for (episode, manifest stream): a request with the same
// key may continue where the last one stopped.
uint64_t DecoderKey(uint64_t episode, int stream) {
  return (episode << 16) ^ static_cast<uint64_t>(stream);
}

// The spec's decode limits, with room for a request of `frames` frames (a FrameRequest may span
// several samples).
DecodeLimits LimitsFor(DecodeLimits limits, size_t frames) {
  limits.max_frames_per_sample =
      std::max<int64_t>(limits.max_frames_per_sample, static_cast<int64_t>(frames));
  return limits;
}

constexpr double kEdgeEps = 1e-9;  // float slack when comparing requested times to the edges

struct Pick {
  int64_t k = 0;
  bool pad = false;
};

// LeRobot's rule, widened by the tolerance: a time more than tolerance_s before the first or
// after the last frame (step) is padding and clamps to that edge; otherwise the nearest (or
// previous) frame must be within tolerance_s. With LeRobot's own tolerance (1e-4 s) this is
// LeRobot's behaviour; with the default (half a period) a time just after the last frame is
// that frame, not padding.
absl::StatusOr<Pick> PickTime(std::span<const double> times, double q, const StreamSpec& s) {
  Pick p;
  const double first = times.front(), last = times.back();
  const double slack = s.tolerance_s + kEdgeEps;
  if (q < first - slack || q > last + slack) p.pad = true;
  const double c = std::clamp(q, first, last);
  auto it = std::lower_bound(times.begin(), times.end(), c);
  int64_t hi = it - times.begin();
  if (hi >= static_cast<int64_t>(times.size())) hi = static_cast<int64_t>(times.size()) - 1;
  int64_t k = hi;
  if (s.match == FrameMatch::kPrevious) {
    if (times[hi] > c + kEdgeEps && hi > 0) k = hi - 1;
  } else if (hi > 0 && c - times[hi - 1] <= times[hi] - c) {
    k = hi - 1;
  }
  const double dist = std::fabs(times[k] - c);
  if (dist > s.tolerance_s + kEdgeEps) {
    return absl::InvalidArgumentError(
        StrCat("t=", c, " s is ", dist, " s from the nearest ",
               s.kind == pb::LOWDIM ? "step" : "frame", " (t=", times[k],
               " s), over tolerance_s=", s.tolerance_s));
  }
  p.k = k;
  return p;
}

OwnedTensor MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  OwnedTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(t.num_elements() * DTypeSize(dtype));
  return t;
}

OwnedTensor PadTensor(const std::string& name, const std::vector<uint8_t>& pads) {
  OwnedTensor t = MakeTensor(name + "_is_pad", DType::kBool, {static_cast<int64_t>(pads.size())});
  t.role = TensorRole::kPaddingMask;
  std::memcpy(t.data.data(), pads.data(), pads.size());
  return t;
}

// An error of one stream of a sample: `ctx` (dataset, shard, episode, stream), then `more`.
absl::Status StreamError(const std::string& ctx, const absl::Status& st,
                         std::string_view more = {}) {
  return Annotate(st, more.empty() ? ctx : StrCat(ctx, ", ", more));
}

// The step or frame (PickTime) for each of the spec's times around the anchor time `t`, and
// whether it is padding.
absl::Status PickTimes(std::span<const double> times, double t, const StreamSpec& s,
                       const std::string& ctx, std::vector<int64_t>* picks,
                       std::vector<uint8_t>* pads) {
  for (double d : s.deltas) {
    auto p = PickTime(times, t + d, s);
    if (!p.ok()) return StreamError(ctx, p.status());
    picks->push_back(p->k);
    pads->push_back(p->pad ? 1 : 0);
  }
  return absl::OkStatus();
}

// Applies `draw` (one camera's draw for one sample) to all its frames; `cropped`: the decoder has
// cut and resized them already (CropMethod::kInDecoder).
void ApplyDraw(const ImageDraw& draw, const StreamSpec& s, bool cropped,
               std::vector<RgbImage>* images) {
  for (RgbImage& im : *images) {
    if (draw.crop && !cropped) {
      RgbImage r;
      ResizeRgb(im, draw.x, draw.y, draw.w, draw.h, draw.flip, s.width, s.height, &r);
      im = std::move(r);
    } else if (draw.flip) {
      FlipRgb(&im);
    }
    ApplyColorJitter(draw, &im);
  }
}

// The draw of one camera for one sample, from the size its frames are delivered at.
ImageDraw DrawFor(const StreamSpec& s, uint64_t seed, uint64_t epoch, uint64_t sample, int width,
                  int height) {
  SampleRng rng(seed, epoch, sample, static_cast<uint64_t>(s.stream));
  return DrawImageAugment(s.augment, width, height, &rng);
}

// The frames of a video or image stream as its tensor: the prefetched frames in `held` as they are
// when the spec asks for nothing else, else `images` (or `held`) written as the spec says.
absl::Status FrameTensor(const StreamSpec& s, const std::vector<RgbImage>& images,
                         const std::vector<std::shared_ptr<const RgbImage>>& held,
                         const DecodeLimits& limits, const std::string& ctx, OwnedTensor* t) {
  std::vector<const RgbImage*> views;
  if (!held.empty()) {
    for (const auto& f : held) views.push_back(f.get());
  } else {
    for (const RgbImage& im : images) views.push_back(&im);
  }
  const int h = views[0]->height, w = views[0]->width;
  for (const RgbImage* im_ptr : views) {
    const RgbImage& im = *im_ptr;
    if (im.width != w || im.height != h) {
      return StreamError(
          ctx, absl::DataLossError(StrCat("frames of one sample differ in size (", w, "x", h,
                                          " and ", im.width, "x", im.height, ")")));
    }
  }
  const DType dt = s.dtype == ImageDType::kFloat32 ? DType::kFloat32 : DType::kUint8;
  std::vector<int64_t> shape = {static_cast<int64_t>(views.size()), h, w, 3};
  if (s.layout == ImageLayout::kCHW) shape = {static_cast<int64_t>(views.size()), 3, h, w};
  const size_t elem_bytes = static_cast<size_t>(h) * w * 3 * DTypeSize(dt);
  if (static_cast<int64_t>(elem_bytes * views.size()) > limits.max_sample_bytes) {
    return StreamError(
        ctx, absl::ResourceExhaustedError(StrCat("the frames need ", elem_bytes * views.size(),
                                                 " bytes, over limits.max_sample_bytes (",
                                                 limits.max_sample_bytes, ")")));
  }
  if (!held.empty() && dt == DType::kUint8 && s.layout == ImageLayout::kHWC) {
    // The pre-decoded frames are the output as they are: share them, copy nothing here.
    t->name = s.name;
    t->dtype = dt;
    t->shape = std::move(shape);
    t->frames = held;
  } else {
    *t = MakeTensor(s.name, dt, std::move(shape));
    for (size_t i = 0; i < views.size(); ++i) {
      WriteImage(*views[i], s, t->data.data() + i * elem_bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Sample> SampleAssembler::Assemble(uint64_t sample, uint64_t seed, uint64_t epoch) {
  if (sample >= index_.size()) {
    return absl::OutOfRangeError(StrCat("sample ", sample, " is past the end of dataset ",
                                        dataset_.uri(), " (", index_.size(), " samples)"));
  }
  const SampleIndex::Location loc = index_.Locate(sample, epoch);
  const std::string ep_ctx =
      StrCat("dataset ", dataset_.uri(), ", shard ",
             dataset_.ShardName(dataset_.episodes().shard(loc.episode)), ", episode ", loc.episode);
  auto ep_or = GetEpisode(loc.episode);
  if (!ep_or.ok()) return Annotate(ep_or.status(), ep_ctx);
  Episode& ep = **ep_or;

  Sample out;
  out.index = sample;
  out.episode = loc.episode;
  out.step = loc.step;
  {
    auto t = AnchorTime(ep, loc.step);
    if (!t.ok()) return Annotate(t.status(), ep_ctx);
    out.time_s = *t;
  }

  for (size_t si = 0; si < spec_.streams.size(); ++si) {
    const std::string ctx = StrCat(ep_ctx, ", stream '", spec_.streams[si].name, "'");
    RETURN_IF_ERROR(AddStream(si, ep, seed, epoch, ctx, &out));
  }
  const size_t bytes = out.bytes();
  if (static_cast<int64_t>(bytes) > spec_.limits.max_sample_bytes) {
    return absl::ResourceExhaustedError(StrCat(ep_ctx, ": the sample is ", bytes,
                                               " bytes, over limits.max_sample_bytes (",
                                               spec_.limits.max_sample_bytes, ")"));
  }
  ++stats_.samples;
  stats_.bytes += bytes;

  return out;
}

absl::Status SampleAssembler::AddStream(size_t si, Episode& ep, uint64_t seed, uint64_t epoch,
                                        const std::string& ctx, Sample* out) {
  const StreamSpec& s = spec_.streams[si];
  const pb::StreamIndex& stream = ep.index->streams(s.stream);
  switch (s.kind) {
    case pb::LOWDIM:
      return AddLowdim(si, *ep.index, ctx, out);
    case pb::VIDEO:
    case pb::IMAGE:
      return AddFrames(si, ep, seed, epoch, ctx, out);
    case pb::AUDIO:
      return AddAudio(s, *ep.index, ctx, out);
    case pb::TEXT: {
      const std::string& text = stream.text();
      if (s.tokenizer != nullptr) {
        // Tokenized here, in the worker that assembles the sample, by the spec's one model.
        absl::StatusOr<std::vector<int32_t>> ids = s.tokenizer->Encode(text);
        if (!ids.ok()) return StreamError(ctx, ids.status());
        OwnedTensor t = MakeTensor(s.name, DType::kInt32, {static_cast<int64_t>(ids->size())});
        if (!ids->empty()) std::memcpy(t.data.data(), ids->data(), ids->size() * sizeof(int32_t));
        out->tensors.push_back(std::move(t));
        return absl::OkStatus();
      }
      OwnedTensor t = MakeTensor(s.name, DType::kUint8, {static_cast<int64_t>(text.size())});
      if (!text.empty()) std::memcpy(t.data.data(), text.data(), text.size());
      out->tensors.push_back(std::move(t));
      return absl::OkStatus();
    }
    default:
      return StreamError(ctx, absl::InternalError("unknown stream kind"));
  }
}

absl::Status SampleAssembler::AddLowdim(size_t si, const pb::EpisodeIndex& index,
                                        const std::string& ctx, Sample* out) {
  const StreamSpec& s = spec_.streams[si];
  const pb::StreamIndex& stream = index.streams(s.stream);
  // The index's own timestamps, not a copy (a 2-minute episode has 6,000 of them).
  const std::span<const double> times(stream.timestamps_s().data(),
                                      static_cast<size_t>(stream.timestamps_s_size()));
  if (times.empty()) return StreamError(ctx, absl::DataLossError("the stream has no steps"));
  std::vector<int64_t> steps;
  std::vector<uint8_t> pads;
  RETURN_IF_ERROR(PickTimes(times, out->time_s, s, ctx, &steps, &pads));
  const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
  std::vector<float> rows;
  absl::Status st = dataset_.ReadLowdim(index, s.stream, static_cast<size_t>(*lo),
                                        static_cast<size_t>(*hi - *lo + 1), &rows);
  if (!st.ok()) return StreamError(ctx, st);
  const int64_t dim = stream.blocks().dim();
  if (!s.stored_shape.empty()) return AddStoredTensor(si, index, rows, dim, pads, ctx, out);
  const StreamInfo& info = dataset_.manifest().streams[static_cast<size_t>(s.stream)];
  if (NpyCodecShape(info.codec).has_value() && info.shape.size() == 1 && dim != info.shape[0]) {
    // A per-clip tensor of another size than the stream's (its first sample's): served flat,
    // samples of different sizes would not stack into one batch.
    return StreamError(ctx, absl::DataLossError(StrCat(
        index.source(), ": its ", stream.codec().codec(), " holds ", dim, " values, the stream ",
        info.shape[0], " (its first sample's); shape: stored with pad_to, or buckets: {by: ",
        s.name, "}, take tensors of varying shape (docs/sampling.md \"Tensors of varying shape\")")));
  }
  OwnedTensor t = MakeTensor(s.name, s.value_dtype, {static_cast<int64_t>(steps.size()), dim});
  uint8_t* dst = t.data.data();
  for (size_t i = 0; i < steps.size(); ++i) {
    const float* src = &rows[static_cast<size_t>(steps[i] - *lo) * dim];
    for (int64_t d = 0; d < dim; ++d) {
      float v = src[d];
      if (s.normalize != LowdimNorm::kNone) {
        v = (v - s.norm_offset[d]) * s.norm_scale[d] + s.norm_bias;
      }
      StoreFloat(s.value_dtype, v, dst, i * dim + d);
    }
  }
  out->tensors.push_back(std::move(t));
  out->tensors.push_back(PadTensor(s.name, pads));
  ++stats_.lowdim_windows;
  return absl::OkStatus();
}

absl::Status SampleAssembler::AddStoredTensor(size_t si, const pb::EpisodeIndex& index,
                                              const std::vector<float>& rows, int64_t dim,
                                              const std::vector<uint8_t>& pads,
                                              const std::string& ctx, Sample* out) {
  const StreamSpec& s = spec_.streams[si];
  // One step (the spec asks for one time) of the sample's own stored shape, which its codec names.
  const pb::StreamIndex& stream = index.streams(s.stream);
  const std::optional<std::vector<int64_t>> stored = NpyCodecShape(stream.codec().codec());
  int64_t elements = 1;
  for (int64_t d : stored.value_or(std::vector<int64_t>{})) elements *= d;
  if (!stored.has_value() || elements != dim || rows.size() != static_cast<size_t>(dim) ||
      pads.size() != 1) {
    return StreamError(ctx, absl::DataLossError(StrCat("its codec '", stream.codec().codec(),
                                                       "' does not name the shape of its ", dim,
                                                       " values")));
  }
  absl::StatusOr<ServedTensor> served =
      ServeStoredTensor(spec_, si, *stored, StrCat(index.source(), ", member '.", s.name, "'"));
  if (!served.ok()) return StreamError(ctx, served.status());
  OwnedTensor t = MakeTensor(s.name, s.value_dtype, served->shape);
  // The stored rows first (C order: row r is elements [r * row, (r + 1) * row)), in the served
  // dtype; zeros after (all-zero bits in float32, float16 and bfloat16 alike).
  const int64_t row = stored->empty() ? 1 : dim / std::max<int64_t>(1, (*stored)[0]);
  StoreFloats(s.value_dtype, rows.data(), static_cast<size_t>(served->rows * row), t.data.data());
  out->tensors.push_back(std::move(t));
  if (!served->padded) {
    out->tensors.push_back(PadTensor(s.name, pads));
  } else {
    // One flag per row: the padding rows, and every row when the clip's time itself is padding.
    std::vector<uint8_t> mask(static_cast<size_t>(served->shape[0]), 1);
    for (int64_t r = 0; r < served->rows; ++r) mask[static_cast<size_t>(r)] = pads[0];
    out->tensors.push_back(PadTensor(s.name, mask));
  }
  ++stats_.lowdim_windows;
  return absl::OkStatus();
}

absl::Status SampleAssembler::AddFrames(size_t si, Episode& ep, uint64_t seed, uint64_t epoch,
                                        const std::string& ctx, Sample* out) {
  const StreamSpec& s = spec_.streams[si];
  auto table_or = Table(ep, s.stream);
  if (!table_or.ok()) return StreamError(ctx, table_or.status());
  const FrameTable& table = **table_or;
  std::vector<int64_t> frames;
  std::vector<uint8_t> pads;
  RETURN_IF_ERROR(PickTimes(table.time_s, out->time_s, s, ctx, &frames, &pads));
  std::vector<RgbImage> images;
  std::vector<std::shared_ptr<const RgbImage>> held;  // prefetched frames used as they are
  // Cropped in the decoder: drawn before decoding, from the size the frames are shown at (the
  // size the crop from RGB draws from).
  std::optional<ImageDraw> drawn;
  if (CropsInDecoder(si)) {
    const DisplayedSize shown = DisplayedSizeOf(ep.index->streams(s.stream), s.autorotate);
    drawn = DrawFor(s, seed, epoch, out->index, shown.width, shown.height);
  }
  std::optional<VideoCrop> crop =
      drawn ? std::optional<VideoCrop>(VideoCrop{drawn->x, drawn->y, drawn->w, drawn->h})
            : std::nullopt;
  BucketSize crop_size{s.height, s.width};
  if (spec_.buckets.cuts_frames()) {
    // The episode's bucket (its reference camera's aspect): every camera is cut to the bucket's
    // aspect around its centre and scaled to its size (the spec refuses random crops with it).
    crop_size = spec_.buckets.sizes[EpisodeBucket(spec_, *ep.index)];
    crop = BucketCrop(crop_size, DisplayedSizeOf(ep.index->streams(s.stream), s.autorotate));
  }
  if (s.kind == pb::VIDEO) {
    RETURN_IF_ERROR(VideoFrames(si, ep, table, frames, crop, crop_size, *out, ctx, &images, &held));
  } else {
    RETURN_IF_ERROR(DecodeImages(s, *ep.index, table, frames, ctx, &images));
    if (spec_.buckets.cuts_frames()) {
      for (RgbImage& im : images) {
        RgbImage r;
        ResizeRgb(im, crop->x, crop->y, crop->width, crop->height, false, crop_size.width,
                  crop_size.height, &r);
        im = std::move(r);
      }
    }
  }
  if (s.augment.enabled() && !images.empty()) {
    const ImageDraw draw = drawn ? *drawn
                                 : DrawFor(s, seed, epoch, out->index, images[0].width,
                                           images[0].height);
    ApplyDraw(draw, s, drawn.has_value(), &images);
  }
  OwnedTensor t;
  RETURN_IF_ERROR(FrameTensor(s, images, held, spec_.limits, ctx, &t));
  out->tensors.push_back(std::move(t));
  out->tensors.push_back(PadTensor(s.name, pads));
  return absl::OkStatus();
}

absl::Status SampleAssembler::VideoFrames(size_t si, const Episode& ep, const FrameTable& table,
                                          const std::vector<int64_t>& frames,
                                          const std::optional<VideoCrop>& crop,
                                          BucketSize crop_size, const Sample& sample, const std::string& ctx,
                                          std::vector<RgbImage>* images,
                                          std::vector<std::shared_ptr<const RgbImage>>* held) {
  const StreamSpec& s = spec_.streams[si];
  stats_.frames_delivered += frames.size();
  // A sample's own crop is never in the prefetch (NeededFrames leaves such streams out).
  if (!crop && TakePrefetchedFrames(sample.episode, s, frames, images, held)) {
    return absl::OkStatus();
  }
  const pb::EpisodeIndex& index = *ep.index;
  auto read = [&](size_t packet, std::string* bytes) {
    return dataset_.ReadPacket(index, s.stream, packet, bytes);
  };
  const uint64_t key = DecoderKey(sample.episode, s.stream);
  VideoOutput vo = OutputFor(s);
  // Consecutive samples ask for frames the decoder has just passed when a sample takes several
  // frames, or when samples come faster than frames (anchored at 50 Hz actions over 30 fps
  // cameras, a frame serves two samples in a row): keep the last few, or each would seek back to
  // its keyframe. The frames are the same bytes either way.
  const auto& streams = dataset_.manifest().streams;
  const double anchor_rate =
      spec_.anchor_stream >= 0 && static_cast<size_t>(spec_.anchor_stream) < streams.size()
          ? streams[spec_.anchor_stream].rate
          : 0;
  vo.keep_recent = s.deltas.size() > 1 || anchor_rate > streams[s.stream].rate;
  if (crop) {
    // One pass from the crop to the output size. Keeping frames would not pay: a kept frame is
    // found again only under the same crop, i.e. by the same sample.
    vo.crop = crop;
    vo.width = crop_size.width;
    vo.height = crop_size.height;
    vo.keep_recent = false;
  }
  absl::Status st = DecodeVideo(si, key, index.streams(s.stream), table, read, frames, vo,
                                spec_.limits, images);
  if (!st.ok()) {
    return StreamError(ctx, st,
                       StrCat("frames at t=", sample.time_s, " s + ", s.deltas.front(), "..",
                              s.deltas.back(), " s"));
  }
  return absl::OkStatus();
}

bool SampleAssembler::TakePrefetchedFrames(uint64_t episode, const StreamSpec& s,
                                       const std::vector<int64_t>& frames,
                                       std::vector<RgbImage>* images,
                                       std::vector<std::shared_ptr<const RgbImage>>* held) {
  if (prefetch_ == nullptr) return false;
  bool all_prefetched = true;
  for (size_t i = 0; i < frames.size() && all_prefetched; ++i) {
    auto f = prefetch_->Find(episode, s.stream, frames[i]);
    if (f == nullptr) {
      all_prefetched = false;
    } else {
      held->push_back(std::move(f));
    }
  }
  if (!all_prefetched) {
    held->clear();
    stats_.prefetch_misses += frames.size();
    return false;
  }
  stats_.prefetch_hits += frames.size();
  // Augmentation changes pixels: it works on copies. Otherwise the prefetched frames are written
  // into the tensor as they are.
  if (s.augment.enabled()) {
    images->resize(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) (*images)[i] = *(*held)[i];
    held->clear();
  }
  return true;
}

absl::Status SampleAssembler::DecodeImages(const StreamSpec& s, const pb::EpisodeIndex& index,
                                           const FrameTable& table,
                                           const std::vector<int64_t>& frames,
                                           const std::string& ctx, std::vector<RgbImage>* images) {
  const pb::StreamIndex& stream = index.streams(s.stream);
  const bool crop = s.augment.crop.has_value();
  images->resize(frames.size());
  std::string bytes;
  for (size_t i = 0; i < frames.size(); ++i) {
    // Repeats (clamped windows) decode once.
    size_t prev = i;
    for (size_t j = 0; j < i; ++j) {
      if (frames[j] == frames[i]) {
        prev = j;
        break;
      }
    }
    if (prev != i) {
      (*images)[i] = (*images)[prev];
      continue;
    }
    const int64_t k = frames[i];
    const std::string frame_ctx = StrCat("frame ", k, " (t=", table.time_s[k], " s)");
    absl::Status st = dataset_.ReadPacket(index, s.stream, table.packet[k], &bytes);
    if (!st.ok()) return StreamError(ctx, st, frame_ctx);
    st = image_.Decode(stream.codec().codec(), bytes, crop ? 0 : s.width, crop ? 0 : s.height,
                       spec_.limits, &(*images)[i]);
    if (!st.ok()) return StreamError(ctx, st, frame_ctx);
    ++stats_.images_decoded;
  }
  // Decoded at full or DCT-scaled size: resize to the output size.
  if (!crop && s.width > 0) {
    for (RgbImage& im : *images) {
      if (im.width != s.width || im.height != s.height) {
        RgbImage r;
        ResizeRgb(im, 0, 0, im.width, im.height, false, s.width, s.height, &r);
        im = std::move(r);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SampleAssembler::AddAudio(const StreamSpec& s, const pb::EpisodeIndex& index,
                                       const std::string& ctx, Sample* out) {
  const StreamInfo& info = dataset_.manifest().streams[s.stream];
  const int rate = s.audio_rate > 0 ? s.audio_rate : static_cast<int>(std::lround(info.rate));
  const int64_t n = std::llround((s.window_end - s.window_start) * static_cast<double>(rate));
  std::vector<float> pcm;
  std::vector<uint8_t> pads;
  const double start = out->time_s + s.window_start;
  auto read = [&](size_t packet, std::string* bytes) {
    return dataset_.ReadPacket(index, s.stream, packet, bytes);
  };
  absl::Status st = audio_.DecodeWindow(index.streams(s.stream), read, start, n, rate,
                                        s.audio_channels, spec_.limits, &pcm, &pads);
  if (!st.ok()) {
    return StreamError(
        ctx, st,
        StrCat("audio window t=", start, "..", start + (s.window_end - s.window_start), " s"));
  }
  const int64_t channels = n > 0 ? static_cast<int64_t>(pcm.size()) / n : 0;
  OwnedTensor t = MakeTensor(s.name, DType::kFloat32, {n, channels});
  if (!pcm.empty()) std::memcpy(t.data.data(), pcm.data(), pcm.size() * sizeof(float));
  out->tensors.push_back(std::move(t));
  out->tensors.push_back(PadTensor(s.name, pads));
  ++stats_.audio_windows;
  return absl::OkStatus();
}

AssemblerStats SampleAssembler::stats() const {
  AssemblerStats s = stats_;
  for (size_t si = 0; si < video_.size(); ++si) {
    const auto& v = video_[si];
    if (v == nullptr) continue;
    s.frames_decoded += v->stats().frames_decoded;
    if (backends_[si] == DecodeBackend::kGpu) s.frames_decoded_nvdec += v->stats().frames_decoded;
    s.video_seeks += v->stats().seeks;
  }
  // Delivered = frames that went into samples, decoded for them or found in the window prefetch.
  s.frames_delivered = stats_.frames_delivered;
  return s;
}

absl::Status SampleAssembler::NeededFrames(uint64_t sample, uint64_t epoch,
                                           std::vector<FrameRequest>* out) {
  out->clear();
  if (sample >= index_.size()) {
    return absl::OutOfRangeError(StrCat("sample ", sample, " is past the end (", index_.size(), ")"));
  }
  const SampleIndex::Location loc = index_.Locate(sample, epoch);
  return NeededFramesAt(loc.episode, loc.step, out);
}

absl::Status SampleAssembler::NeededFramesAt(uint64_t episode, uint32_t step,
                                             std::vector<FrameRequest>* out) {
  out->clear();
  ASSIGN_OR_RETURN(Episode * ep, GetEpisode(episode));
  ASSIGN_OR_RETURN(double t, AnchorTime(*ep, step));
  for (size_t si = 0; si < spec_.streams.size(); ++si) {
    const StreamSpec& s = spec_.streams[si];
    if (s.kind != pb::VIDEO || CropsInDecoder(si)) continue;
    ASSIGN_OR_RETURN(const FrameTable* table, Table(*ep, s.stream));
    FrameRequest r;
    r.episode = episode;
    r.spec_stream = si;
    r.stream = s.stream;
    for (double d : s.deltas) {
      auto p = PickTime(table->time_s, t + d, s);
      if (!p.ok()) return p.status();  // Assemble reports it with full context
      r.frames.push_back(p->k);
      r.pads.push_back(p->pad ? 1 : 0);
    }
    out->push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status SampleAssembler::DecodeFrames(const FrameRequest& request, std::vector<RgbImage>* out) {
  ASSIGN_OR_RETURN(Episode * ep, GetEpisode(request.episode));
  const StreamSpec& s = spec_.streams[request.spec_stream];
  ASSIGN_OR_RETURN(const FrameTable* table, Table(*ep, s.stream));
  const pb::StreamIndex& stream = ep->index->streams(s.stream);
  auto read = [&](size_t packet, std::string* bytes) {
    return dataset_.ReadPacket(*ep->index, s.stream, packet, bytes);
  };
  const uint64_t key = DecoderKey(request.episode, s.stream);
  const DecodeLimits limits = LimitsFor(spec_.limits, request.frames.size());
  return DecodeVideo(request.spec_stream, key, stream, *table, read, request.frames, OutputFor(s),
                     limits, out);
}

absl::Status SampleAssembler::DecodeVideo(size_t si, uint64_t key, const pb::StreamIndex& stream,
                                          const FrameTable& table, PacketReader read,
                                          const std::vector<int64_t>& frames, const VideoOutput& vo,
                                          const DecodeLimits& limits, std::vector<RgbImage>* out) {
  std::unique_ptr<FrameDecoder>& decoder = video_[si];
  if (decoder == nullptr) {
    // Before the first NVDEC session, the check (and error) a pipeline makes when it opens, for
    // the assembler's users without one (`conveyor sample`, cache warming).
    if (backends_[si] == DecodeBackend::kGpu) {
      const StreamSpec& s = spec_.streams[si];
      RETURN_IF_ERROR(CheckVideoBackend(s, dataset_.manifest().streams[s.stream]));
    }
    ASSIGN_OR_RETURN(decoder, OpenFrameDecoder(backends_[si]));
  }
  return decoder->Decode(key, stream, table, read, frames, vo, limits, out);
}

absl::Status SampleAssembler::DecodeFramesOnDevice(const FrameRequest& request,
                                                   NvdecDecoder& decoder,
                                                   const GpuFrameOutput& output, void* dst,
                                                   size_t stride) {
  ASSIGN_OR_RETURN(Episode * ep, GetEpisode(request.episode));
  const StreamSpec& s = spec_.streams[request.spec_stream];
  ASSIGN_OR_RETURN(const FrameTable* table, Table(*ep, s.stream));
  const pb::StreamIndex& stream = ep->index->streams(s.stream);
  auto read = [&](size_t packet, std::string* bytes) {
    return dataset_.ReadPacket(*ep->index, s.stream, packet, bytes);
  };
  const uint64_t key = DecoderKey(request.episode, s.stream);
  const DecodeLimits limits = LimitsFor(spec_.limits, request.frames.size());
  stats_.frames_delivered += request.frames.size();
  return decoder.DecodeToDevice(key, stream, *table, read, request.frames, output, limits, dst,
                                stride);
}

absl::StatusOr<const FrameTable*> SampleAssembler::FrameTableOf(uint64_t episode,
                                                                size_t spec_stream) {
  if (spec_stream >= spec_.streams.size()) {
    return absl::InvalidArgumentError(StrCat("spec stream ", spec_stream, " of ", spec_.streams.size()));
  }
  ASSIGN_OR_RETURN(Episode * ep, GetEpisode(episode));
  return Table(*ep, spec_.streams[spec_stream].stream);
}

}  // namespace conveyor
