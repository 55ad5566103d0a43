// libFuzzer target for the video decoder's entry point: FrameTable::Build + VideoDecoder::Decode
// on packets the fuzzer controls. Input layout (run_fuzz.sh makes seeds from real encodes):
//   byte 0: codec (h264, hevc, vp9, av1, mjpeg)   byte 1: packet count (1..64)
//   byte 2: keyframe interval (0: only packet 0)  byte 3: bit 0 resize, bits 1-2 rotation
//   then count x u16 LE packet sizes, then the packet bytes (cut short if the input ends).
// Any outcome but a crash, a leak, undefined behaviour or unbounded memory is fine.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "media/video_decoder.h"
#include "format/format.h"

namespace pb = conveyor::format::v1;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  static const char* kCodecs[] = {"h264", "hevc", "vp9", "av1", "mjpeg"};
  const char* codec = kCodecs[data[0] % 5];
  const size_t count = 1 + data[1] % 64;
  const size_t gop = data[2];
  const bool resize = data[3] & 1;
  const double rotation = 90.0 * ((data[3] >> 1) & 3);
  size_t pos = 4;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < count && pos + 2 <= size; ++i, pos += 2) {
    sizes.push_back(data[pos] | (static_cast<size_t>(data[pos + 1]) << 8));
  }
  if (sizes.empty()) return 0;
  std::vector<std::string> packets;
  for (size_t s : sizes) {
    const size_t n = std::min(s, size - pos);
    packets.emplace_back(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
  }

  pb::StreamIndex stream;
  stream.set_name("cam");
  stream.set_kind(pb::VIDEO);
  stream.set_time_base_num(1);
  stream.set_time_base_den(30);
  pb::CodecParams* params = stream.mutable_codec();
  params->set_codec(codec);
  params->set_width(64);
  params->set_height(48);
  params->set_pix_fmt(std::string(codec) == "mjpeg" ? "yuvj420p" : "yuv420p");
  params->set_rotation_deg(rotation);
  pb::PacketTable* table = stream.mutable_packets();
  for (size_t i = 0; i < packets.size(); ++i) {
    table->add_pts(static_cast<int64_t>(i));
    table->add_dts(static_cast<int64_t>(i));
    table->add_duration(1);
    table->add_offset(0);
    table->add_size(static_cast<uint32_t>(packets[i].size()));
    const bool key = i == 0 || (gop > 0 && i % gop == 0);
    table->add_flags(key ? conveyor::format::kPacketKey : 0);
    table->add_xxh3(0);
  }
  stream.set_num_frames(packets.size());

  auto frames = conveyor::FrameTable::Build(stream);
  if (!frames.ok()) return 0;
  conveyor::DecodeLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_frames_per_sample = 16;
  conveyor::VideoOutput output;
  if (resize) {
    output.width = 24;
    output.height = 16;
  }
  auto read = [&](size_t p, std::string* bytes) {
    *bytes = packets[p];
    return absl::OkStatus();
  };
  conveyor::VideoDecoder decoder;
  std::vector<conveyor::RgbImage> images;
  // Forward through every frame, then a jump back (a seek) and a repeat.
  const int64_t n = static_cast<int64_t>(frames->size());
  for (int64_t k = 0; k < n; ++k) {
    const int64_t one[1] = {k};
    (void)decoder.Decode(1, stream, *frames, read, one, output, limits, &images);
  }
  const int64_t back[3] = {n / 2, 0, n / 2};
  (void)decoder.Decode(1, stream, *frames, read, back, output, limits, &images);
  return 0;
}
