// Types shared by Conveyor's decoders (video, image, audio). Decoders are synchronous, own no
// threads, and are reused across samples by one thread at a time: a worker thread holds one of
// each and feeds it the streams of many episodes.
//
// Errors from a decoder say what is wrong with the data ("truncated JPEG: ...", "h264 decoder
// rejected packet 12 ..."); the caller (sample assembly) annotates them with dataset, shard,
// episode, stream and frame.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace conveyor {

// How AudioDecoder decodes a window (media/audio_decoder.h). The numbers are stable: a job's
// pipeline version decides its method (docs/pipeline.md "Schedule versions").
enum class AudioMethod : uint32_t {
  kPerWindow = 1,  // a fresh decoder per window (pipeline versions 1 and 2)
  kChunks = 2,     // windows cut from a fixed grid of chunks, each from a fresh decoder (3)
};

// Caps that keep a hostile or broken file from costing unbounded memory or time. Checked before
// anything of that size is allocated (FFmpeg's max_pixels, the JPEG header, the codec
// parameters).
struct DecodeLimits {
  int64_t max_pixels = 7680 * 4320;         // per decoded frame or image (8K UHD)
  int64_t max_frames_per_sample = 256;      // per stream and sample
  int64_t max_audio_samples = 48000 * 60;   // per audio window, per channel
  int64_t max_sample_bytes = 1ll << 30;     // all tensors of one sample together
};

// Reads packet `packet` (an index in decode order into the stream's packet table) into `bytes`.
// In Conveyor this is Dataset::ReadPacket, which verifies the packet's checksum.
using PacketReader = absl::FunctionRef<absl::Status(size_t packet, std::string* bytes)>;

// An 8-bit RGB image, rows top to bottom, tightly packed (stride = 3 * width).
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

}  // namespace conveyor
