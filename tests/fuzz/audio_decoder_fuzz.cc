// libFuzzer target for AudioDecoder (media/audio_decoder.h). The input is an AUDIO stream built
// in memory, then decoded through windows with small limits:
//
//   byte 0       codec (% 5: aac, opus, flac, mp3, pcm_s16le, each with fixed codec parameters);
//                bit 6: durations from the packet sizes (0 included); bit 7: pts jump back
//   byte 1       window start, (b - 64) / 32 seconds
//   byte 2       window length (bits 0-2), output rate (bits 3-5), output channels (bits 6-7)
//   byte 3       pts_origin, in frames of the codec after the first packet (priming)
//   byte 4       k, the number of packet sizes that follow
//   k x u16 LE   packet sizes; the bytes after them are cut into packets of those sizes, and what
//                is left over is one more packet
//
// One decoder per method (AudioMethod::kPerWindow and kChunks) serves all inputs, as a pipeline
// worker's does, so state a failed window leaves behind (and kChunks' kept chunks) is exercised
// too. Beyond "no crash, no sanitizer report", it checks the contract for each method: output
// sizes, pad samples are zero, and the same window decoded again after another one, and (kChunks)
// with no chunks kept, gives the same bits.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "media/audio_decoder.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

extern "C" {
#include <libavutil/log.h>
}

namespace {

namespace pb = conveyor::format::v1;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

struct CodecSetup {
  const char* name;
  int rate;
  int frame;  // nominal samples per packet (PCM: from the packet size)
  std::string extradata;
  const char* sample_fmt;
  int seek_preroll;
};

const CodecSetup& Setup(int which) {
  static const CodecSetup kSetups[5] = {
      // AudioSpecificConfig: AAC LC, 44.1 kHz, 2 channels.
      {"aac", 44100, 1024, std::string("\x12\x10", 2), "fltp", 0},
      // OpusHead: version 1, 2 channels, pre-skip 312, 48 kHz, gain 0, mapping family 0.
      {"opus", 48000, 960, std::string("OpusHead\x01\x02\x38\x01\x80\xbb\x00\x00\x00\x00\x00", 19),
       "fltp", 3840},
      // STREAMINFO: blocks of 4096, 44.1 kHz, 2 channels, 16 bits, unknown length and MD5.
      {"flac", 44100, 4096,
       std::string("\x10\x00\x10\x00\x00\x00\x00\x00\x00\x00\x0a\xc4\x42\xf0\x00\x00\x00\x00"
                   "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
                   34),
       "s16", 0},
      {"mp3", 44100, 1152, "", "fltp", 0},
      {"pcm_s16le", 44100, 0, "", "s16", 0},
  };
  return kSetups[which];
}

uint16_t U16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Decodes the window and checks it; then decodes another window and the first one again (and,
// for kChunks, once more with no chunks kept): the same bits.
void CheckWindow(conveyor::AudioDecoder* decoder, const pb::StreamIndex& stream,
                 conveyor::PacketReader read, double start_s, int64_t n, int rate, int channels,
                 int stream_rate, const conveyor::DecodeLimits& limits) {
  std::vector<float> out, again;
  std::vector<uint8_t> pad, pad_again;
  const absl::Status first =
      decoder->DecodeWindow(stream, read, start_s, n, rate, channels, limits, &out, &pad);
  if (!first.ok()) return;
  const size_t out_ch = channels == 0 ? 2 : static_cast<size_t>(channels);
  Check(out.size() == static_cast<size_t>(n) * out_ch);
  Check(pad.size() == static_cast<size_t>(n));
  for (size_t j = 0; j < pad.size(); ++j) {
    Check(pad[j] <= 1);
    for (size_t c = 0; pad[j] && c < out_ch; ++c) Check(out[j * out_ch + c] == 0.0f);
  }

  std::vector<float> other;
  std::vector<uint8_t> other_pad;
  (void)decoder->DecodeWindow(stream, read, 0.01, 1000, stream_rate, 0, limits, &other,
                              &other_pad);
  const int rounds = decoder->method() == conveyor::AudioMethod::kChunks ? 2 : 1;
  for (int round = 0; round < rounds; ++round) {
    if (round == 1) decoder->ClearChunkCache();  // decoded again from scratch
    const absl::Status second =
        decoder->DecodeWindow(stream, read, start_s, n, rate, channels, limits, &again, &pad_again);
    Check(second.ok());
    Check(again.size() == out.size() && pad_again == pad);
    Check(out.empty() || std::memcmp(again.data(), out.data(), out.size() * sizeof(float)) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  av_log_set_level(AV_LOG_QUIET);  // corrupt input is the norm here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  static conveyor::AudioDecoder* decoder = new conveyor::AudioDecoder;
  static conveyor::AudioDecoder* chunked =
      new conveyor::AudioDecoder(conveyor::AudioMethod::kChunks);
  const CodecSetup& setup = Setup(data[0] % 5);
  const bool sized_durations = (data[0] & 0x40) != 0;
  const bool jump_back = (data[0] & 0x80) != 0;

  pb::StreamIndex stream;
  stream.set_name("audio");
  stream.set_kind(pb::AUDIO);
  pb::CodecParams& par = *stream.mutable_codec();
  par.set_codec(setup.name);
  par.set_extradata(setup.extradata);
  par.set_sample_rate(setup.rate);
  par.set_channels(2);
  par.set_channel_mask(3);  // FL | FR
  par.set_sample_fmt(setup.sample_fmt);
  par.set_frame_size(setup.frame);
  par.set_seek_preroll(setup.seek_preroll);
  stream.set_time_base_num(1);
  stream.set_time_base_den(setup.rate);

  // Packets: sizes from the table, bytes from what follows it.
  const size_t k = data[4];
  size_t pos = 5;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < k && pos + 2 <= size; ++i, pos += 2) sizes.push_back(U16(data + pos));
  std::vector<std::string> packets;
  for (size_t s : sizes) {
    if (pos >= size) break;
    const size_t n = std::min(s, size - pos);
    packets.emplace_back(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
  }
  if (pos < size) packets.emplace_back(reinterpret_cast<const char*>(data + pos), size - pos);

  pb::PacketTable& table = *stream.mutable_packets();
  int64_t pts = 0;
  uint64_t offset = 0;
  for (size_t i = 0; i < packets.size(); ++i) {
    const int64_t nominal =
        setup.frame > 0 ? setup.frame : static_cast<int64_t>(packets[i].size() / 4);
    const int64_t duration =
        sized_durations ? static_cast<int64_t>(packets[i].size() * 37 % (2 * 4096)) : nominal;
    if (jump_back && i % 7 == 6) pts -= 3 * nominal;
    table.add_pts(pts);
    table.add_dts(pts);
    table.add_duration(duration);
    table.add_offset(offset);
    table.add_size(static_cast<uint32_t>(packets[i].size()));
    table.add_flags(1);
    table.add_xxh3(XXH3_64bits(packets[i].data(), packets[i].size()));  // kChunks keys on it
    offset += packets[i].size();
    pts += duration;
  }
  stream.set_num_frames(packets.size());
  stream.set_pts_origin(static_cast<int64_t>(data[3] % 8) * (setup.frame > 0 ? setup.frame : 1024));

  auto read = [&](size_t packet, std::string* bytes) -> absl::Status {
    Check(packet < packets.size());
    *bytes = packets[packet];
    return absl::OkStatus();
  };

  conveyor::DecodeLimits limits;
  limits.max_audio_samples = 48000;
  limits.max_sample_bytes = 8 << 20;
  const double start_s = (static_cast<int>(data[1]) - 64) / 32.0;
  static const int64_t kLengths[8] = {0, 1, 100, 1000, 4800, 16000, 48000, 48001};
  static const int kRates[8] = {0, 16000, 8000, 44100, 48000, 22050, 11025, 192000};
  const int64_t n = kLengths[data[2] & 7];
  const int rate = kRates[(data[2] >> 3) & 7] == 0 ? setup.rate : kRates[(data[2] >> 3) & 7];
  const int channels = (data[2] >> 6) % 3;

  CheckWindow(decoder, stream, read, start_s, n, rate, channels, setup.rate, limits);
  CheckWindow(chunked, stream, read, start_s, n, rate, channels, setup.rate, limits);
  return 0;
}
