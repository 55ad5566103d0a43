// DeviceFrames: video decoded on the GPU's NVDEC engines in the trainer's own process, straight
// into the trainer's device batch, for the samples a served batch names (issue 32 item 4).
//
// A 720p video model's batch is almost all decoded frames: tens of MB per batch that the server's
// CPUs decode and the transport copies, then the client uploads. Here the server serves the rest
// of the sample (captions, actions, `_is_pad` masks, the order, the mixture, the resume cursor)
// and the batch's sample ids; the trainer opens the same dataset and config, and decodes the
// video streams of those samples on NVDEC, each frame converted, resized and normalised by a
// CUDA kernel that writes into device memory the trainer owns (media/nvdec_decoder.h). No frame
// passes through host memory or the transport.
//
// Exactness: the frames are picked by the CPU path's code (SampleAssembler::NeededFramesAt, the
// same PickTime over the same FrameTable) from the sample's (episode, anchor step), so frame
// selection equals the served CPU frames bit for bit; the pixels differ from libswscale's by the
// tolerance docs/nvdec.md measures. What the kernel cannot do is refused when the config is read,
// naming the stream: augmentation, layouts other than uint8 HWC and float32 CHW, a resize filter
// other than bilinear, no `size`.
//
// Ordering: Decode writes after the work already queued on the caller's CUDA stream (the stream
// the memory was allocated on, or last used on) and returns when every frame is written, so any
// stream may read it afterwards. Calls are serialised; one object serves one trainer process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor_desc.h"
#include "base/types.h"

namespace conveyor {

struct DeviceFramesOptions {
  std::string dataset;               // as `conveyor serve` takes it: a path, URL, or mixture file
  std::string config;                // the YAML config file whose video streams are decoded
  std::vector<std::string> streams;  // the video streams to decode; empty: every one of the config
  int device = 0;                    // CUDA device
  int sessions = 7;                  // NVDEC sessions (one thread each), spread over the engines
  // Device memory for decoded frames kept across batches (a ring, oldest overwritten first):
  // samples of one GOP window share most of their frames (clips overlap), so each frame is
  // decoded once while it stays. 0: no cache, every sample decodes its own frames.
  int64_t cache_bytes = int64_t{1} << 30;
};

// One decoded stream of a batch: [batch, T, H, W, 3] uint8 or [batch, T, 3, H, W] float32. The
// description's shape is one sample's: [T, H, W, 3] or [T, 3, H, W].
struct DeviceFramesTensor : TensorDesc {
  size_t sample_bytes = 0;
  size_t frames_per_sample = 0;  // T
};

struct DeviceFramesStats {
  uint64_t calls = 0;
  uint64_t samples = 0;
  uint64_t frames = 0;
  uint64_t frames_decoded = 0;  // pictures NVDEC decoded (references and skipped-over ones too)
  uint64_t seeks = 0;
  uint64_t cache_hits = 0;      // frames copied from the cache into a batch
  uint64_t frames_cached = 0;   // frames decoded into the cache
  double seconds = 0;           // inside Decode
};

class DeviceFrames {
 public:
  // Opens the dataset, reads the config against it, and creates the NVDEC sessions.
  // FAILED_PRECONDITION with NvdecUnavailable()'s reason where NVDEC cannot be used; the config's
  // problems name the file, the stream and why.
  static absl::StatusOr<std::unique_ptr<DeviceFrames>> Open(const DeviceFramesOptions& options);
  ~DeviceFrames();
  DeviceFrames(const DeviceFrames&) = delete;
  DeviceFrames& operator=(const DeviceFrames&) = delete;

  const std::vector<DeviceFramesTensor>& tensors() const;

  // Decodes tensor `tensor` of the samples `ids` (a batch's ids: episode, anchor step and mixture
  // member are used) into `dst` (device memory on the object's device, ids.size() *
  // sample_bytes), sample i at dst + i * sample_bytes; `pads` (may be null) gets ids.size() * T
  // bytes, 1 where the requested time was padding (the frame then repeats the clip's edge, as on
  // the CPU). A stream a mixture member lacks is zeros, all padding. `cuda_stream` (a
  // cudaStream_t; null: the legacy default stream) is waited for before anything is written.
  // Errors name the dataset, episode, stream and frame.
  absl::Status Decode(size_t tensor, std::span<const SampleId> ids, void* dst, uint8_t* pads,
                      void* cuda_stream);

  DeviceFramesStats stats() const;

 private:
  struct Impl;
  explicit DeviceFrames(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor
