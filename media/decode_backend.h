// Where a video stream is decoded: the per-stream `decode` key of a sample spec
// (sample/sample_spec.h, docs/sampling.md "Where video is decoded"), and what it means where the
// stream is decoded. ChooseDecodeBackend is the one place the setting is read: the sample
// assembler and DeviceFrames (pipeline/device_frames.h) each ask it once per stream and open that
// backend's FrameDecoder (media/frame_decoder.h).
//
// Batches assembled on the host (a server's, `conveyor batches`') decode a stream on NVDEC
// (media/nvdec_decoder.h: H.264 and HEVC through NVCUVID, copied back to the batch) only when its
// spec says `gpu`; `auto` and `cpu` decode on the CPU with libavcodec, so the batches are the same
// bits on every server whatever GPUs it has. DeviceFrames, which decodes in the trainer's process
// straight into its device batch, takes `auto` and `gpu` as NVDEC.
#pragma once

#include <string>
#include <string_view>

namespace conveyor {

enum class DecodeBackend {
  // Host batches: the CPU, the same bits on every server. DeviceFrames: NVDEC. The default.
  kAuto,
  // libavcodec on the CPU: the frames every release so far produced, bit for bit.
  kCpu,
  // NVDEC, or nothing: a stream that asks for it where it cannot be decoded on this host's GPU
  // (no GPU or NVDEC, a codec, pixel format or size its decoder lacks, a resize other than
  // bilinear) fails where its pipeline opens, naming the stream and why (NvdecRefusal,
  // media/decode_placement.h). Its pixels are NVDEC's and the kernel's (docs/nvdec.md "Pixel
  // tolerance"), not libswscale's.
  kGpu,
};

std::string_view DecodeBackendName(DecodeBackend backend);  // "auto", "cpu", "gpu"

// Where a stream's frames are decoded.
enum class DecodeSite {
  // Assembled into batches in host memory (SampleAssembler): served, `conveyor batches`,
  // `conveyor sample`, the frame cache's warming.
  kHostBatches,
  // In the trainer's process, straight into its device batch (DeviceFrames).
  kTrainerDevice,
};

// The backend a stream whose spec says `asked` decodes on at `site`: kCpu or kGpu, never kAuto.
//   host batches:   auto, cpu -> kCpu;  gpu -> kGpu
//   trainer device: auto, gpu -> kGpu;  cpu -> kCpu (which DeviceFrames, NVDEC only, refuses)
// A pure function: it reads the setting, never the machine.
DecodeBackend ChooseDecodeBackend(DecodeBackend asked, DecodeSite site);

// Why video cannot be decoded on the GPU in this process; empty when it can (a GPU, its driver
// and libnvcuvid: device/gpu.h, NvdecUnavailable()). Asked once and remembered; thread-safe.
const std::string& GpuDecodeUnavailable();

// Logs, once per process, where host batches decode video under `decode: auto` and why, naming
// the first stream that said it (`stream`, at `where` in its config). Probes the GPU.
void LogAutoDecodeOnce(std::string_view stream, std::string_view where);

}  // namespace conveyor
