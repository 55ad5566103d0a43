#include "pipeline/device_frames.h"

#if CONVEYOR_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <tuple>
#include <chrono>
#include <utility>

#include "base/strings.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/worker_pool.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/sample_index.h"
#include "media/nvdec_decoder.h"
#include "pipeline/source.h"
#include "sample/sample_assembler.h"
#include "sample/sample_spec.h"

namespace conveyor {



namespace {

// The kernel's output for a stream of the config, or why it cannot make it.
absl::StatusOr<GpuFrameOutput> OutputFor(const StreamSpec& s, const std::string& config) {
  const std::string where = StrCat(config, ": stream '", s.name, "': ");
  if (s.augment.enabled()) {
    return absl::UnimplementedError(
        StrCat(where, "augment is not applied on NVDEC in this release; decode this stream on "
                      "the server (CPU), or leave augment out of the trainer's config"));
  }
  if (s.width <= 0 || s.height <= 0) {
    return absl::InvalidArgumentError(
        StrCat(where, "give it a size: on the device, a batch's shape cannot depend on the clip"));
  }
  if (s.resize != ResizeFilter::kBilinear) {
    return absl::UnimplementedError(
        StrCat(where, "the NVDEC kernel resizes bilinearly (antialiased); resize: bilinear"));
  }
  GpuFrameOutput out;
  out.resize_width = s.width;
  out.resize_height = s.height;
  out.autorotate = s.autorotate;
  if (s.dtype == ImageDType::kUint8 && s.layout == ImageLayout::kHWC) {
    out.layout = GpuFrameOutput::Layout::kHwcU8;
  } else if (s.dtype == ImageDType::kFloat32 && s.layout == ImageLayout::kCHW) {
    out.layout = GpuFrameOutput::Layout::kChwF32;
    out.mean = s.mean;
    out.std = s.std;
  } else {
    return absl::UnimplementedError(
        StrCat(where, "the NVDEC kernel writes uint8 hwc or float32 chw; this stream asks for ",
               s.dtype == ImageDType::kFloat32 ? "float32 " : "uint8 ",
               s.layout == ImageLayout::kCHW ? "chw" : "hwc"));
  }
  return out;
}

}  // namespace

struct DeviceFrames::Impl {
  DeviceFramesOptions options;
  std::unique_ptr<Source> source;
  SampleSpec spec;
  std::vector<BoundMember> bound;
  std::vector<SampleIndex> indexes;  // per member (SampleAssembler keeps a reference)
  std::vector<DeviceFramesTensor> tensors;
  std::vector<size_t> tensor_stream;  // per tensor: its index in spec.streams
  std::vector<GpuFrameOutput> outputs;

  struct Session {
    std::unique_ptr<NvdecDecoder> decoder;
    std::vector<std::unique_ptr<SampleAssembler>> members;  // per mixture member
    std::vector<FrameRequest> requests;                      // reused
  };
  // Used by Decode's ParallelFor workers while Decode holds `mu` for the whole call (a worker's
  // lambda holds no lock of its own, so this cannot be annotated); each worker uses its own.
  std::vector<Session> sessions;

  // Decoded frames kept on the device, per tensor: a ring of frame slots in one allocation,
  // filled in order and overwritten oldest first. A frame is keyed by (member, episode, frame).
  using FrameKey = std::tuple<uint32_t, uint64_t, int64_t>;
  struct Cache {
    uint8_t* arena = nullptr;
    size_t slots = 0, frame_bytes = 0, next = 0;
    std::vector<std::optional<FrameKey>> owner;  // per slot
    std::map<FrameKey, size_t> where;            // cached frame -> slot
  };
  absl::Mutex mu;  // one Decode at a time
  std::vector<Cache> caches ABSL_GUARDED_BY(mu);    // per tensor; slots == 0 without a cache
  void* copy_stream ABSL_GUARDED_BY(mu) = nullptr;  // cudaStream_t of the cache-to-batch copies

  mutable absl::Mutex stats_mu;
  DeviceFramesStats stats ABSL_GUARDED_BY(stats_mu);

  ~Impl();

  // Open's steps. The tensors: one per video stream of the spec (of options.streams, when given),
  // each checked to be one the NVDEC kernel can make.
  absl::Status AddTensors();
  // The frame cache of each tensor (options.cache_bytes shared evenly; none for a tensor whose
  // share holds fewer than two samples' frames) and the stream its copies run on.
  absl::Status AllocateCaches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // What sample `id` needs of tensor `tensor`, from `session`'s assembler: *request (valid until
  // the session's next request) with the padding flags copied to `pads`, or null when its member
  // lacks the stream (then `dst` is zeroed on `cuda_stream` and the flags are all 1). Errors name
  // the dataset, episode, step and stream.
  absl::Status Prepare(Session& session, size_t tensor, const SampleId& id, uint8_t* dst,
                       uint8_t* pads, void* cuda_stream, std::atomic<bool>* zeroed,
                       const FrameRequest** request);
  // "dataset D, episode E, step S, stream 'N'": where a sample's error happened.
  std::string Where(const SampleId& id, size_t tensor) const {
    return StrCat("dataset ", source->dataset(id.dataset).uri(), ", episode ", id.episode,
                  ", step ", id.step, ", stream '", tensors[tensor].name, "'");
  }
  // Decodes one sample into its slot with `session`.
  absl::Status DecodeOne(Session& session, size_t tensor, const SampleId& id, uint8_t* dst,
                         uint8_t* pads, void* cuda_stream, std::atomic<bool>* zeroed);
  // Through the cache: the batch's frames found there are copied, the rest decoded once into it
  // (every frame of their span, cut at keyframes into units spread over the sessions) and
  // copied. *done is false when the batch's new frames would not fit (the caller decodes it
  // directly).
  absl::Status DecodeCached(size_t tensor, std::span<const SampleId> ids, uint8_t* base,
                            uint8_t* pads, void* cuda_stream, void* queued,
                            std::atomic<bool>* zeroed, bool* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // DecodeCached's steps, in order (CUDA builds only). A frame of the batch: its place
  // (sample * T + entry) and its key.
  struct Want {
    size_t slot_in_batch;
    FrameKey key;
  };
  // Frames decoded into the cache by one session in one call: frames of one (member, episode)
  // that start from one keyframe, in the consecutive slots from first_slot.
  struct Unit {
    uint32_t member = 0;
    FrameRequest request;
    size_t first_slot = 0;
  };
  using Places = std::map<FrameKey, std::vector<size_t>>;  // a frame -> its places in the batch
  // The frames `ids` want of `tensor` (Prepare; padding written as in DecodeOne), and per member
  // the spec stream of the tensor (-1 where none is wanted).
  absl::Status CollectWants(size_t tensor, std::span<const SampleId> ids, uint8_t* base,
                            uint8_t* pads, void* cuda_stream, std::atomic<bool>* zeroed,
                            std::vector<Want>* wants, std::vector<int>* member_stream_of);
  // Copies the wanted frames the cache holds into the batch, after the caller's queued work
  // (`queued`, a cudaEvent_t) and before new frames may overwrite their slots; the others go to
  // *missing. Returns how many were copied.
  absl::StatusOr<uint64_t> CopyCachedFrames(size_t tensor, const std::vector<Want>& wants,
                                            uint8_t* base, void* queued, Places* missing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The missing frames as units, and how many frames they decode: per (member, episode) every
  // frame of their span (later samples of the same clips want the frames between) unless the
  // span is sparse, cut where the keyframe changes, so each unit decodes from its own keyframe
  // on any session.
  absl::Status PlanUnits(size_t tensor, const Places& missing,
                         const std::vector<int>& member_stream_of, std::vector<Unit>* units,
                         size_t* total) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Gives each unit's frames consecutive slots of the ring of `c`, overwriting the oldest.
  static void AssignSlots(Cache& c, std::vector<Unit>* units);
  // Decodes the units into their slots, spread over the sessions; on an error the slots of this
  // call are emptied (they hold nothing usable).
  absl::Status DecodeUnits(size_t tensor, const std::vector<Unit>& units)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Copies the newly cached frames to their places in the batch and waits for the copies.
  absl::Status CopyMissingFrames(size_t tensor, const Places& missing, uint8_t* base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

DeviceFrames::Impl::~Impl() {
#if CONVEYOR_HAVE_CUDA
  for (Cache& c : caches) {
    if (c.arena != nullptr) (void)cudaFree(c.arena);
  }
  if (copy_stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream));
#endif
}

DeviceFrames::DeviceFrames(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceFrames::~DeviceFrames() = default;

const std::vector<DeviceFramesTensor>& DeviceFrames::tensors() const { return impl_->tensors; }

DeviceFramesStats DeviceFrames::stats() const {
  absl::MutexLock lock(&impl_->stats_mu);
  return impl_->stats;
}

absl::Status DeviceFrames::Impl::AddTensors() {
  for (const std::string& name : options.streams) {
    auto it = std::find_if(spec.streams.begin(), spec.streams.end(),
                           [&](const StreamSpec& s) { return s.name == name; });
    if (it == spec.streams.end()) {
      return absl::InvalidArgumentError(
          StrCat("DeviceFrames: stream '", name, "' is not in ", options.config));
    }
    if (it->kind != format::v1::VIDEO) {
      return absl::InvalidArgumentError(
          StrCat("DeviceFrames: stream '", name, "' of ", options.config, " is not video"));
    }
  }
  for (size_t si = 0; si < spec.streams.size(); ++si) {
    const StreamSpec& s = spec.streams[si];
    if (s.kind != format::v1::VIDEO) continue;
    const std::vector<std::string>& only = options.streams;
    if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) {
      continue;
    }
    if (ChooseDecodeBackend(s.decode, DecodeSite::kTrainerDevice) != DecodeBackend::kGpu) {
      return absl::InvalidArgumentError(StrCat(options.config, ": stream '", s.name,
                                               "' says decode: cpu; DeviceFrames decodes on NVDEC"));
    }
    ASSIGN_OR_RETURN(GpuFrameOutput out, OutputFor(s, options.config));
    DeviceFramesTensor t;
    t.name = s.name;
    t.frames_per_sample = s.deltas.size();
    const int64_t T = static_cast<int64_t>(s.deltas.size());
    if (out.layout == GpuFrameOutput::Layout::kHwcU8) {
      t.dtype = DType::kUint8;
      t.shape = {T, s.height, s.width, 3};
    } else {
      t.dtype = DType::kFloat32;
      t.shape = {T, 3, s.height, s.width};
    }
    t.sample_bytes = static_cast<size_t>(T) * NvdecDecoder::FrameBytes(out, s.width, s.height);
    tensors.push_back(std::move(t));
    tensor_stream.push_back(si);
    outputs.push_back(out);
  }
  return absl::OkStatus();
}

absl::Status DeviceFrames::Impl::AllocateCaches() {
  caches.resize(tensors.size());
#if CONVEYOR_HAVE_CUDA
  if (options.cache_bytes > 0) {
    int previous = -1;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(options.device);
    absl::Status st;
    cudaStream_t copy = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking); e != cudaSuccess) {
      st = absl::ResourceExhaustedError(StrCat("DeviceFrames: cudaStreamCreate: ", cudaGetErrorString(e)));
    }
    copy_stream = copy;
    for (size_t i = 0; i < tensors.size() && st.ok(); ++i) {
      Cache& c = caches[i];
      c.frame_bytes = tensors[i].sample_bytes / tensors[i].frames_per_sample;
      c.slots = static_cast<size_t>(options.cache_bytes) / tensors.size() / c.frame_bytes;
      if (c.slots < 2 * tensors[i].frames_per_sample) {
        c.slots = 0;  // too small to hold a sample's frames twice: no cache for this stream
        continue;
      }
      void* arena = nullptr;
      if (cudaError_t e = cudaMalloc(&arena, c.slots * c.frame_bytes); e != cudaSuccess) {
        st = absl::ResourceExhaustedError(StrCat("DeviceFrames: the frame cache of ",
                                                 options.cache_bytes,
                                                 " bytes (cache_bytes): cudaMalloc: ",
                                                 cudaGetErrorString(e)));
        c.slots = 0;
        break;
      }
      c.arena = static_cast<uint8_t*>(arena);
      c.owner.assign(c.slots, std::nullopt);
    }
    if (previous >= 0) (void)cudaSetDevice(previous);
    if (!st.ok()) return st;
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceFrames>> DeviceFrames::Open(const DeviceFramesOptions& o) {
  if (o.dataset.empty()) return absl::InvalidArgumentError("DeviceFrames: no dataset given");
  if (o.config.empty()) return absl::InvalidArgumentError("DeviceFrames: no config given");
  if (o.sessions < 1 || o.sessions > 64) {
    return absl::InvalidArgumentError(
        StrCat("DeviceFrames: sessions is ", o.sessions, "; expected 1 to 64"));
  }
  if (o.cache_bytes < 0) {
    return absl::InvalidArgumentError(StrCat("DeviceFrames: cache_bytes is ", o.cache_bytes));
  }
  if (o.device < 0) {
    return absl::InvalidArgumentError(StrCat("DeviceFrames: device is ", o.device));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  ASSIGN_OR_RETURN(impl->source, Source::Open(o.dataset));
  ASSIGN_OR_RETURN(impl->spec, SampleSpec::FromFile(o.config, impl->source->manifest()));
  if (impl->spec.buckets.enabled()) {
    // Its device tensors have one shape per stream; a bucketed batch's shape is its bucket's.
    if (impl->spec.buckets.cuts_frames()) {
      return absl::InvalidArgumentError(StrCat(
          "DeviceFrames: ", o.config, " has buckets, whose frames are cut on the server's CPU "
          "decoder (docs/sampling.md \"Buckets\"); serve them in the batches instead"));
    }
    return absl::InvalidArgumentError(StrCat(
        "DeviceFrames: ", o.config, " has buckets by the stored shape of '",
        impl->spec.streams[static_cast<size_t>(impl->spec.buckets.by)].name,
        "', a batch of one shape each; DeviceFrames gives a stream one shape for the whole run: "
        "serve the bucketed tensors in the batches instead (docs/sampling.md \"Buckets\")"));
  }
  ASSIGN_OR_RETURN(impl->bound, impl->source->Bind(impl->spec));
  for (size_t k = 0; k < impl->source->size(); ++k) {
    ASSIGN_OR_RETURN(SampleIndex index, SampleIndex::Build(impl->source->dataset(k),
                                                           impl->bound[k].spec.anchor_stream));
    impl->indexes.push_back(std::move(index));
  }

  RETURN_IF_ERROR(impl->AddTensors());
  if (impl->tensors.empty()) {
    return absl::InvalidArgumentError(
        StrCat("DeviceFrames: ", o.config, " has no video stream to decode"));
  }

  // The config is checked first, so its mistakes are reported on any machine.
  if (const std::string& why = NvdecUnavailable(o.device); !why.empty()) {
    return absl::FailedPreconditionError(
        StrCat("DeviceFrames: NVDEC cannot be used on device ", o.device, ": ", why));
  }
  impl->sessions.resize(static_cast<size_t>(o.sessions));
  for (Impl::Session& session : impl->sessions) {
    ASSIGN_OR_RETURN(session.decoder, NvdecDecoder::Create(o.device));
    for (size_t k = 0; k < impl->source->size(); ++k) {
      session.members.push_back(std::make_unique<SampleAssembler>(
          impl->source->dataset(k), impl->bound[k].spec, impl->indexes[k]));
    }
  }
  // Not yet shared: held so that the analysis sees the guarded fields written under their lock.
  absl::MutexLock lock(&impl->mu);
  RETURN_IF_ERROR(impl->AllocateCaches());
  return std::unique_ptr<DeviceFrames>(new DeviceFrames(std::move(impl)));
}

absl::Status DeviceFrames::Impl::Prepare(Session& session, size_t tensor, const SampleId& id,
                                         uint8_t* dst, uint8_t* pads, void* cuda_stream,
                                         std::atomic<bool>* zeroed, const FrameRequest** request) {
  *request = nullptr;
  const DeviceFramesTensor& t = tensors[tensor];
  if (id.dataset >= session.members.size()) {
    return absl::InvalidArgumentError(StrCat("sample ", id.index, " comes from mixture member ",
                                             id.dataset, "; ", source->uri(), " has ",
                                             session.members.size()));
  }
  const int member_stream = bound[id.dataset].stream_of[tensor_stream[tensor]];
  const std::string ctx = Where(id, tensor);
  if (member_stream < 0) {  // the member lacks the stream: padding, as the CPU path delivers it
#if CONVEYOR_HAVE_CUDA
    const cudaError_t e = cudaMemsetAsync(dst, 0, t.sample_bytes, static_cast<cudaStream_t>(cuda_stream));
    if (e != cudaSuccess) {
      return absl::InternalError(StrCat(ctx, ": cudaMemsetAsync: ", cudaGetErrorString(e)));
    }
#endif
    zeroed->store(true);
    if (pads != nullptr) std::fill(pads, pads + t.frames_per_sample, uint8_t{1});
    return absl::OkStatus();
  }
  absl::Status st =
      session.members[id.dataset]->NeededFramesAt(id.episode, id.step, &session.requests);
  if (!st.ok()) return Annotate(st, ctx);
  for (const FrameRequest& r : session.requests) {
    if (r.spec_stream == static_cast<size_t>(member_stream)) *request = &r;
  }
  if (*request == nullptr) return absl::InternalError(StrCat(ctx, ": no frame request for the stream"));
  if (pads != nullptr) std::copy((*request)->pads.begin(), (*request)->pads.end(), pads);
  return absl::OkStatus();
}

absl::Status DeviceFrames::Impl::DecodeOne(Session& session, size_t tensor, const SampleId& id,
                                           uint8_t* dst, uint8_t* pads, void* cuda_stream,
                                           std::atomic<bool>* zeroed) {
  const FrameRequest* request = nullptr;
  RETURN_IF_ERROR(Prepare(session, tensor, id, dst, pads, cuda_stream, zeroed, &request));
  if (request == nullptr) return absl::OkStatus();  // padding, already written
  const DeviceFramesTensor& t = tensors[tensor];
  absl::Status st = session.members[id.dataset]->DecodeFramesOnDevice(
      *request, *session.decoder, outputs[tensor], dst, t.sample_bytes / t.frames_per_sample);
  if (!st.ok()) {
    return Annotate(st, Where(id, tensor));
  }
  return absl::OkStatus();
}

#if CONVEYOR_HAVE_CUDA
namespace {

absl::Status CudaFailure(cudaError_t e, const char* what) {
  return absl::InternalError(StrCat("DeviceFrames: ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::Status DeviceFrames::Impl::CollectWants(size_t tensor, std::span<const SampleId> ids,
                                              uint8_t* base, uint8_t* pads, void* cuda_stream,
                                              std::atomic<bool>* zeroed, std::vector<Want>* wants,
                                              std::vector<int>* member_stream_of) {
  const DeviceFramesTensor& t = tensors[tensor];
  Session& s0 = sessions[0];
  for (size_t i = 0; i < ids.size(); ++i) {
    const SampleId& id = ids[i];
    const FrameRequest* request = nullptr;
    RETURN_IF_ERROR(Prepare(s0, tensor, id, base + i * t.sample_bytes,
                            pads != nullptr ? pads + i * t.frames_per_sample : nullptr,
                            cuda_stream, zeroed, &request));
    if (request == nullptr) continue;  // padding, already written
    (*member_stream_of)[id.dataset] = static_cast<int>(request->spec_stream);
    for (size_t k = 0; k < request->frames.size(); ++k) {
      wants->push_back(Want{i * t.frames_per_sample + k,
                            FrameKey{id.dataset, id.episode, request->frames[k]}});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DeviceFrames::Impl::CopyCachedFrames(size_t tensor,
                                                              const std::vector<Want>& wants,
                                                              uint8_t* base, void* queued,
                                                              Places* missing) {
  const Cache& c = caches[tensor];
  const size_t fb = c.frame_bytes;
  const cudaStream_t copy = static_cast<cudaStream_t>(copy_stream);
  if (cudaError_t e = cudaStreamWaitEvent(copy, static_cast<cudaEvent_t>(queued), 0); e != cudaSuccess) {
    return CudaFailure(e, "cudaStreamWaitEvent");
  }
  uint64_t hits = 0;
  for (const Want& w : wants) {
    auto it = c.where.find(w.key);
    if (it == c.where.end()) {
      (*missing)[w.key].push_back(w.slot_in_batch);
      continue;
    }
    ++hits;
    if (cudaError_t e = cudaMemcpyAsync(base + w.slot_in_batch * fb, c.arena + it->second * fb, fb,
                                        cudaMemcpyDeviceToDevice, copy);
        e != cudaSuccess) {
      return CudaFailure(e, "cudaMemcpyAsync");
    }
  }
  if (cudaError_t e = cudaStreamSynchronize(copy); e != cudaSuccess) {
    return CudaFailure(e, "cudaStreamSynchronize");
  }
  return hits;
}

absl::Status DeviceFrames::Impl::PlanUnits(size_t tensor, const Places& missing,
                                           const std::vector<int>& member_stream_of,
                                           std::vector<Unit>* units, size_t* total) {
  const Cache& c = caches[tensor];
  Session& s0 = sessions[0];
  *total = 0;
  for (auto it = missing.begin(); it != missing.end();) {
    const auto [member, episode, first] = it->first;
    std::vector<int64_t> frames;
    auto end = it;
    for (; end != missing.end() && std::get<0>(end->first) == member &&
           std::get<1>(end->first) == episode;
         ++end) {
      frames.push_back(std::get<2>(end->first));
    }
    it = end;
    const int member_stream = member_stream_of[member];
    auto table = s0.members[member]->FrameTableOf(episode, static_cast<size_t>(member_stream));
    if (!table.ok()) return table.status();
    const int64_t lo = frames.front(), hi = frames.back();
    if (hi - lo + 1 <= 4 * static_cast<int64_t>(frames.size()) + 48) {
      frames.clear();
      for (int64_t f = lo; f <= hi; ++f) {
        if (!c.where.contains(FrameKey{member, episode, f})) frames.push_back(f);
      }
    }
    for (size_t j = 0; j < frames.size(); ++j) {
      const uint32_t keyframe = (*table)->start_packet[static_cast<size_t>(frames[j])];
      if (j == 0 || keyframe != (*table)->start_packet[static_cast<size_t>(frames[j - 1])]) {
        Unit u;
        u.member = member;
        u.request.episode = episode;
        u.request.spec_stream = static_cast<size_t>(member_stream);
        u.request.stream = bound[member].spec.streams[static_cast<size_t>(member_stream)].stream;
        units->push_back(std::move(u));
      }
      units->back().request.frames.push_back(frames[j]);
    }
    *total += frames.size();
  }
  return absl::OkStatus();
}

void DeviceFrames::Impl::AssignSlots(Cache& c, std::vector<Unit>* units) {
  for (Unit& u : *units) {
    const size_t n = u.request.frames.size();
    if (c.next + n > c.slots) c.next = 0;
    for (size_t j = 0; j < n; ++j) {
      const size_t slot = c.next + j;
      if (c.owner[slot].has_value()) c.where.erase(*c.owner[slot]);
      const FrameKey key{u.member, u.request.episode, u.request.frames[j]};
      if (auto old = c.where.find(key); old != c.where.end()) c.owner[old->second].reset();
      c.owner[slot] = key;
      c.where[key] = slot;
    }
    u.first_slot = c.next;
    c.next += n;
  }
}

absl::Status DeviceFrames::Impl::DecodeUnits(size_t tensor, const std::vector<Unit>& units) {
  const DeviceFramesTensor& t = tensors[tensor];
  Cache& c = caches[tensor];
  const size_t fb = c.frame_bytes;
  const size_t k_sessions = std::min(sessions.size(), units.size());
  absl::Status st = ParallelFor("nvdec-frames", static_cast<int>(k_sessions), k_sessions,
                                [&](size_t k) -> absl::Status {
    Session& session = sessions[k];
    const size_t from = k * units.size() / k_sessions, to = (k + 1) * units.size() / k_sessions;
    for (size_t u = from; u < to; ++u) {
      const Unit& unit = units[u];
      absl::Status s = session.members[unit.member]->DecodeFramesOnDevice(
          unit.request, *session.decoder, outputs[tensor], c.arena + unit.first_slot * fb, fb);
      if (!s.ok()) {
        return Annotate(s, StrCat("dataset ", source->dataset(unit.member).uri(), ", episode ",
                                  unit.request.episode, ", stream '", t.name, "', frames ",
                                  unit.request.frames.front(), "..", unit.request.frames.back()));
      }
    }
    return absl::OkStatus();
  });
  if (!st.ok()) {  // the slots of this call hold nothing usable
    for (const Unit& u : units) {
      for (size_t j = 0; j < u.request.frames.size(); ++j) {
        c.owner[u.first_slot + j].reset();
        c.where.erase(FrameKey{u.member, u.request.episode, u.request.frames[j]});
      }
    }
  }
  return st;
}

absl::Status DeviceFrames::Impl::CopyMissingFrames(size_t tensor, const Places& missing,
                                                   uint8_t* base) {
  const Cache& c = caches[tensor];
  const size_t fb = c.frame_bytes;
  const cudaStream_t copy = static_cast<cudaStream_t>(copy_stream);
  for (const auto& [key, places] : missing) {
    const size_t slot = c.where.at(key);
    for (size_t place : places) {
      if (cudaError_t e = cudaMemcpyAsync(base + place * fb, c.arena + slot * fb, fb,
                                          cudaMemcpyDeviceToDevice, copy);
          e != cudaSuccess) {
        return CudaFailure(e, "cudaMemcpyAsync");
      }
    }
  }
  if (cudaError_t e = cudaStreamSynchronize(copy); e != cudaSuccess) {
    return CudaFailure(e, "cudaStreamSynchronize");
  }
  return absl::OkStatus();
}
#endif  // CONVEYOR_HAVE_CUDA

absl::Status DeviceFrames::Impl::DecodeCached(size_t tensor, std::span<const SampleId> ids,
                                              uint8_t* base, uint8_t* pads, void* cuda_stream,
                                              void* queued, std::atomic<bool>* zeroed,
                                              bool* done) {
#if CONVEYOR_HAVE_CUDA
  *done = false;
  std::vector<Want> wants;
  std::vector<int> member_stream_of(source->size(), -1);
  RETURN_IF_ERROR(CollectWants(tensor, ids, base, pads, cuda_stream, zeroed, &wants,
                               &member_stream_of));
  Places missing;
  ASSIGN_OR_RETURN(const uint64_t hits, CopyCachedFrames(tensor, wants, base, queued, &missing));
  std::vector<Unit> units;
  size_t total = 0;
  RETURN_IF_ERROR(PlanUnits(tensor, missing, member_stream_of, &units, &total));
  Cache& c = caches[tensor];
  if (total > c.slots / 2) return absl::OkStatus();  // does not fit: the caller decodes directly
  AssignSlots(c, &units);
  RETURN_IF_ERROR(DecodeUnits(tensor, units));
  RETURN_IF_ERROR(CopyMissingFrames(tensor, missing, base));
  {
    absl::MutexLock lock(&stats_mu);
    stats.cache_hits += hits;
    stats.frames_cached += total;
  }
  *done = true;
  return absl::OkStatus();
#else
  (void)tensor, (void)ids, (void)base, (void)pads, (void)cuda_stream, (void)queued, (void)zeroed;
  *done = false;
  return absl::FailedPreconditionError("DeviceFrames: built without CUDA");
#endif
}

absl::Status DeviceFrames::Decode(size_t tensor, std::span<const SampleId> ids, void* dst,
                                  uint8_t* pads, void* cuda_stream) {
  Impl& m = *impl_;
  if (tensor >= m.tensors.size()) {
    return absl::InvalidArgumentError(
        StrCat("DeviceFrames: tensor ", tensor, "; there are ", m.tensors.size()));
  }
  if (ids.empty()) return absl::OkStatus();
  if (dst == nullptr) return absl::InvalidArgumentError("DeviceFrames: no destination");
  absl::MutexLock lock(&m.mu);
  const auto start = std::chrono::steady_clock::now();
  const DeviceFramesTensor& t = m.tensors[tensor];
#if CONVEYOR_HAVE_CUDA
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (previous != m.options.device) {
    if (cudaError_t e = cudaSetDevice(m.options.device); e != cudaSuccess) {
      return absl::FailedPreconditionError(StrCat("DeviceFrames: cudaSetDevice(",
                                                  m.options.device, "): ", cudaGetErrorString(e)));
    }
  }
  struct Restore {
    int device;
    ~Restore() {
      if (device >= 0) (void)cudaSetDevice(device);
    }
  } restore{previous != m.options.device ? previous : -1};
  // The sessions' kernels write only after what the caller queued on its stream before this call.
  cudaEvent_t queued = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&queued, cudaEventDisableTiming); e != cudaSuccess) {
    return absl::ResourceExhaustedError(StrCat("DeviceFrames: cudaEventCreate: ", cudaGetErrorString(e)));
  }
  struct EventOwner {
    cudaEvent_t e;
    ~EventOwner() { (void)cudaEventDestroy(e); }
  } owner{queued};
  cudaError_t e = cudaEventRecord(queued, static_cast<cudaStream_t>(cuda_stream));
  for (Impl::Session& session : m.sessions) {
    if (e != cudaSuccess) break;
    e = cudaStreamWaitEvent(static_cast<cudaStream_t>(session.decoder->stream()), queued, 0);
  }
  if (e != cudaSuccess) {
    return absl::InternalError(StrCat("DeviceFrames: ordering after the caller's stream: ",
                                      cudaGetErrorString(e)));
  }
#else
  (void)cuda_stream;
  void* queued = nullptr;
  return absl::FailedPreconditionError("DeviceFrames: built without CUDA");
#endif
  const size_t k_sessions = std::min(m.sessions.size(), ids.size());
  std::atomic<bool> zeroed{false};
  uint8_t* base = static_cast<uint8_t*>(dst);
  absl::Status st;
  bool done = false;
  if (m.caches[tensor].slots > 0) {
    st = m.DecodeCached(tensor, ids, base, pads, cuda_stream, queued, &zeroed, &done);
  }
  if (st.ok() && !done) {
    st = ParallelFor("nvdec-frames", static_cast<int>(k_sessions), k_sessions,
                     [&](size_t k) -> absl::Status {
      Impl::Session& session = m.sessions[k];
      for (size_t i = k; i < ids.size(); i += k_sessions) {
        RETURN_IF_ERROR(m.DecodeOne(session, tensor, ids[i], base + i * t.sample_bytes,
                                    pads != nullptr ? pads + i * t.frames_per_sample : nullptr,
                                    cuda_stream, &zeroed));
      }
      return absl::OkStatus();
    });
  }
#if CONVEYOR_HAVE_CUDA
  // Zero-filled slots (members without the stream) were queued on the caller's stream.
  if (st.ok() && zeroed.load()) {
    if (cudaError_t se = cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream)); se != cudaSuccess) {
      st = absl::InternalError(StrCat("DeviceFrames: cudaStreamSynchronize: ", cudaGetErrorString(se)));
    }
  }
#endif
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  absl::MutexLock stats_lock(&m.stats_mu);
  m.stats.calls += 1;
  m.stats.samples += ids.size();
  m.stats.frames += ids.size() * t.frames_per_sample;
  m.stats.seconds += seconds;
  m.stats.frames_decoded = 0;
  m.stats.seeks = 0;
  for (const Impl::Session& session : m.sessions) {
    m.stats.frames_decoded += session.decoder->stats().frames_decoded;
    m.stats.seeks += session.decoder->stats().seeks;
  }
  return st;
}

}  // namespace conveyor
