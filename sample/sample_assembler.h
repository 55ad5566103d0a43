// Sample assembly: turns sample index i of a dataset into a training sample (frames from each
// camera, low-dim windows, an audio window, the instruction) as the SampleSpec asks.
//
// Sample i is anchor step `step` of episode `e`, counting anchor steps over all episodes in order
// (SampleIndex). A sample is a pure function of (dataset, spec, seed, epoch, i): the decoders are
// exact, augmentation draws from SampleRng(seed, epoch, i, stream), and nothing depends on what
// the assembler did before, so the bits are the same at any thread count and on any server.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor_desc.h"
#include "base/types.h"
#include "media/audio_decoder.h"
#include "media/image_decoder.h"
#include "sample/sample_spec.h"
#include "media/frame_decoder.h"
#include "media/nvdec_decoder.h"
#include "media/video_decoder.h"
#include "datasets/dataset.h"
#include "datasets/sample_index.h"

namespace conveyor {

// A tensor that owns its bytes: a sample's. A batch holds TensorViews into one buffer
// (pipeline/batch.h) and the client hands out client::TensorView (client/client.h); all three
// are a TensorDesc (base/tensor_desc.h) and where the bytes are.
struct OwnedTensor : TensorDesc {
  std::vector<uint8_t> data;  // C order, little-endian
  // A video tensor whose frames are the decoded frames as they are (uint8 [T, H, W, 3], no
  // augmentation): the frames themselves, shared with the window prefetch, instead of a copy in
  // `data` (which is then empty). Frame t's bytes are frames[t]->pixels. Saves one copy of every
  // frame: from the decoder's frame straight into its slot of the batch (pipeline/packing.cc).
  std::vector<std::shared_ptr<const RgbImage>> frames;
  size_t num_elements() const;
  size_t bytes() const;               // data.size(), or the frames' bytes
  void CopyTo(uint8_t* dst) const;    // all bytes() of them, in C order
};

// What one sample holds. Tensors, in spec order, per stream: `<name>` and, except for text,
// `<name>_is_pad` (bool, one per requested time; per output sample for audio).
//   video / image: uint8 [T, H, W, 3] (or [T, 3, H, W], or float32) as the spec says
//   lowdim: float32 [T, D];  audio: float32 [samples, channels];  text: uint8 [bytes] (UTF-8),
//   or int32 [tokens] (token ids) when the stream has a tokenizer (sample/tokenizer.h)
struct Sample {
  uint64_t index = 0;
  uint64_t episode = 0;
  uint32_t step = 0;    // anchor step within the episode
  double time_s = 0;    // anchor time on the episode clock
  uint32_t member = 0;  // the mixture member (dataset) it came from; 0 for a single dataset
  std::vector<OwnedTensor> tensors;
  const OwnedTensor* Find(std::string_view name) const;
  size_t bytes() const;
};

// The frames of the GOP windows in flight, decoded ahead of assembly (the pipeline's decode-once
// scheduling keeps two windows): the assembler looks frames up here before decoding. Not the
// decoded-frame cache kept across epochs (DecodedFrameCache, pipeline/frame_cache.h), which the
// pipeline consults before it decodes a block. Implementations must be thread-safe.
class WindowPrefetch {
 public:
  virtual ~WindowPrefetch() = default;
  // The frame at the size the assembler decodes it (VideoOutput for that stream), or null.
  virtual std::shared_ptr<const RgbImage> Find(uint64_t episode, int stream, int64_t frame) const = 0;
};

// The frames of one video stream of one episode that a sample (or a group of samples) needs.
struct FrameRequest {
  uint64_t episode = 0;
  size_t spec_stream = 0;      // index into SampleSpec::streams
  int stream = 0;              // index into the manifest's streams
  std::vector<int64_t> frames; // indices into the episode's FrameTable
  std::vector<uint8_t> pads;   // per entry of `frames`: 1 where the time was padding (clamped)
};

struct AssemblerStats {
  uint64_t samples = 0;
  uint64_t bytes = 0;
  uint64_t frames_delivered = 0;  // video
  uint64_t frames_decoded = 0;    // video, references and skipped-over frames included
  // Of frames_decoded, those NVDEC decoded (`decode: gpu`): what shows a served stream's frames
  // came from the GPU and not the CPU.
  uint64_t frames_decoded_nvdec = 0;
  uint64_t video_seeks = 0;
  uint64_t images_decoded = 0;
  uint64_t audio_windows = 0;
  uint64_t lowdim_windows = 0;
  uint64_t episode_loads = 0;     // episode indexes read (the rest came from the cache)
  uint64_t prefetch_hits = 0;     // video frames found in the WindowPrefetch
  uint64_t prefetch_misses = 0;   // video frames decoded because the WindowPrefetch lacked them
};

// Whether this process can decode every video stream of `spec` (parsed against `manifest`) where
// its `decode:` puts it in host batches (ChooseDecodeBackend, media/decode_backend.h): OK, or
// FAILED_PRECONDITION naming the config's file, line and column, the stream and why, for a
// `decode: gpu` stream NVDEC cannot take here (NvdecRefusal, media/decode_placement.h). An
// explicit `decode: auto` is logged once per process with where video decodes. Probes the GPU:
// the pipeline asks it when it opens (Pipeline::Create), so parsing a config never depends on the
// machine; an assembler asks it again for a `gpu` stream before its first NVDEC session.
absl::Status CheckVideoBackends(const SampleSpec& spec, const Manifest& manifest);

// One per worker thread: holds one decoder per video stream (so each camera keeps its decode
// position), an image and an audio decoder, and a few recently used episode indexes. Each video
// stream's backend (CPU or NVDEC) is chosen once, when the assembler is made, from its spec's
// `decode:`; its FrameDecoder is opened on first use. Not thread-safe; the Dataset, spec and index
// it points to must outlive it.
class SampleAssembler {
 public:
  SampleAssembler(const Dataset& dataset, const SampleSpec& spec, const SampleIndex& index);
  ~SampleAssembler();

  // Errors name dataset, shard, episode, stream and frame or time, for example
  //   dataset /d, shard /d/shards/shard-000000.cvs, episode 3, stream 'cam0', t=1.250 s: ...
  // OUT_OF_RANGE for a sample index past the end.
  absl::StatusOr<Sample> Assemble(uint64_t sample, uint64_t seed, uint64_t epoch);

  // Counters since construction (video counters include DecodeFrames).
  AssemblerStats stats() const;

  // Frames are looked up in `prefetch` (may be null) before decoding. Not owned.
  void set_window_prefetch(const WindowPrefetch* prefetch) { prefetch_ = prefetch; }

  // The video frames sample `sample` needs, one request per video stream of the spec whose
  // frames a prefetch or frame cache can hold: not the streams cropped in the decoder
  // (CropsInDecoder), whose decoded frames are each sample's own.
  absl::Status NeededFrames(uint64_t sample, uint64_t epoch, std::vector<FrameRequest>* out);
  // The same for the sample at anchor step `step` of `episode` (a SampleId's episode and step).
  absl::Status NeededFramesAt(uint64_t episode, uint32_t step, std::vector<FrameRequest>* out);

  // Decodes the frames of `request` on NVDEC with `decoder`, as `output` says, into device memory:
  // frame i at dst + i * stride (pipeline/device_frames.h, decoding in the trainer's process). The
  // frames are the ones DecodeFrames picks; the pixels are NVDEC's (docs/nvdec.md's tolerance).
  // What NVDEC refuses (a display rotation to apply, ...) is the decoder's FAILED_PRECONDITION.
  absl::Status DecodeFramesOnDevice(const FrameRequest& request, NvdecDecoder& decoder,
                                    const GpuFrameOutput& output, void* dst, size_t stride);

  // The frame table of spec stream `spec_stream` in `episode` (valid until the episode leaves
  // this assembler's small cache: the next call that loads another episode).
  absl::StatusOr<const FrameTable*> FrameTableOf(uint64_t episode, size_t spec_stream);

  // Decodes the frames of `request` (any order) in one forward pass, at the size Assemble
  // decodes them, into `out` (one image per frame).
  absl::Status DecodeFrames(const FrameRequest& request, std::vector<RgbImage>* out);

  // A key of everything besides the frame itself that decides the pixels DecodeFrames delivers
  // for spec stream `spec_stream` (output size, resize filter, autorotation): two streams with
  // equal keys decode a frame to the same bytes. For caches of decoded frames.
  uint64_t DecodeSettingsKey(size_t spec_stream) const;

 private:
  struct Episode;
  absl::StatusOr<Episode*> GetEpisode(uint64_t episode);
  absl::StatusOr<const FrameTable*> Table(Episode& ep, int stream);
  // Anchor time of (episode, step).
  absl::StatusOr<double> AnchorTime(Episode& ep, uint32_t step);
  VideoOutput OutputFor(const StreamSpec& s) const;
  // Whether spec stream `si`'s random resized crop is cut by its CPU decoder
  // (CropMethod::kInDecoder): drawn before decoding, from the stream's displayed size.
  bool CropsInDecoder(size_t si) const;

  // Assemble's steps. Each adds to `out` the tensors of one stream of the spec (`si` indexes
  // spec_.streams; `s` is that stream's spec) or gets them ready; errors carry `ctx` (dataset,
  // shard, episode, stream) and the frame or time that failed.
  absl::Status AddStream(size_t si, Episode& ep, uint64_t seed, uint64_t epoch,
                         const std::string& ctx, Sample* out);
  absl::Status AddLowdim(size_t si, const format::v1::EpisodeIndex& index,
                         const std::string& ctx, Sample* out);
  // A `shape: stored` stream's one tensor (sample/stored_tensor.h): `rows` the sample's `dim`
  // values, `pads` its one time's flag.
  absl::Status AddStoredTensor(size_t si, const format::v1::EpisodeIndex& index,
                               const std::vector<float>& rows, int64_t dim,
                               const std::vector<uint8_t>& pads, const std::string& ctx,
                               Sample* out);
  absl::Status AddFrames(size_t si, Episode& ep, uint64_t seed, uint64_t epoch,
                         const std::string& ctx, Sample* out);
  absl::Status AddAudio(const StreamSpec& s, const format::v1::EpisodeIndex& index,
                        const std::string& ctx, Sample* out);
  // The frames of a video stream for `sample`: from the WindowPrefetch when it has them all (in
  // `held`, or copied into `images` for augmentation), else decoded into `images`.
  // `crop`: the sample's crop, cut by the decoder (CropsInDecoder, or the bucket's centre crop);
  // the frames are then decoded here, scaled to `crop_size` (the spec's size, or the bucket's).
  absl::Status VideoFrames(size_t si, const Episode& ep, const FrameTable& table,
                           const std::vector<int64_t>& frames,
                           const std::optional<VideoCrop>& crop, BucketSize crop_size,
                           const Sample& sample,
                           const std::string& ctx, std::vector<RgbImage>* images,
                           std::vector<std::shared_ptr<const RgbImage>>* held);
  // False (and `held` empty) unless the WindowPrefetch holds every one of `frames`.
  bool TakePrefetchedFrames(uint64_t episode, const StreamSpec& s, const std::vector<int64_t>& frames,
                        std::vector<RgbImage>* images,
                        std::vector<std::shared_ptr<const RgbImage>>* held);
  // The frames of an image stream, each decoded once and resized to the spec's size.
  absl::Status DecodeImages(const StreamSpec& s, const format::v1::EpisodeIndex& index,
                            const FrameTable& table, const std::vector<int64_t>& frames,
                            const std::string& ctx, std::vector<RgbImage>* images);

  const Dataset& dataset_;
  const SampleSpec& spec_;
  const SampleIndex& index_;
  // Per spec stream: where its video decodes (ChooseDecodeBackend for host batches; kCpu for
  // streams that are not video), chosen once, here.
  std::vector<DecodeBackend> backends_;
  // Per spec stream: its decoder on backends_[si], opened on first use (null until then and for
  // streams that are not video).
  std::vector<std::unique_ptr<FrameDecoder>> video_;
  // Decodes `frames` of spec stream `si` with its FrameDecoder, as `vo` says.
  absl::Status DecodeVideo(size_t si, uint64_t key, const format::v1::StreamIndex& stream,
                           const FrameTable& table, PacketReader read,
                           const std::vector<int64_t>& frames, const VideoOutput& vo,
                           const DecodeLimits& limits, std::vector<RgbImage>* out);
  ImageDecoder image_;
  AudioDecoder audio_;
  std::vector<std::unique_ptr<Episode>> episodes_;  // small LRU
  uint64_t tick_ = 0;
  AssemblerStats stats_;
  const WindowPrefetch* prefetch_ = nullptr;
};

}  // namespace conveyor
