// AudioDecoder: one window of an AUDIO stream as float32 samples on the episode clock.
//
// A window is `num_samples` output samples at `out_rate` Hz starting at `start_s` seconds on the
// episode clock (t = (pts - pts_origin) * time_base, see docs/format.md). Output sample j is the
// signal at t = start_s + j / out_rate. Samples the decoder produces before t = 0 (AAC/Opus/MP3
// priming, frames an edit list hides) are dropped, so at the stream's own rate and channel count
// a window whose start lies on the sample grid holds the samples `ffmpeg -i FILE -f f32le -` gives
// at that offset for the imported file: bit for bit for PCM, FLAC, MP3, Opus and AAC without
// perceptual noise substitution (PNS). AAC with PNS fills noise bands from a generator that runs
// from the decoder's open, so those bands get other noise of the same energy than the CLI's.
// Opus is exact once its decoder has converged within the 0.8 s pre-roll: tested for 96 kb/s
// CELT; a 32 kb/s stream from 16 kHz input (SILK/hybrid) differed at t = 1 s (its decode then
// starts at 0.2 s; tests/audio_decoder_test.cc AudioChunkTest).
// The stream ends where its last packet does (pts + duration): for MP3 that includes the encoder's
// end padding (up to a frame), which format v1 does not store (docs/format.md, Known limits).
//
// Two methods, chosen at construction; either way a window's bits depend on the stream and the
// window only, never on what the decoder did before (docs/sampling.md "Audio windows"):
//
// - kPerWindow (audio method 1): each window is decoded by a fresh decoder from a few packets
//   before it (pre-roll: AAC's MDCT overlap, MP3's bit reservoir, 0.8 s for Opus, whose CELT
//   energy prediction needs that long to converge bit-exactly); the pre-roll's output is
//   discarded. Only PCM reuses a flushed decoder: AAC's noise generator survives a flush, and the
//   fuzzer found Opus and MP3 streams whose output after a flush depended on the window before.
//   An AAC window costs an open (~70 us) and 2 packets of pre-roll.
// - kChunks (audio method 2): the stream's samples are cut into a fixed grid of chunks (4 s of
//   samples at the stream's rate, fewer when a chunk would exceed 4 MiB); a chunk is decoded
//   whole by a fresh decoder with the same pre-roll as above, and windows are copied out of the
//   chunks they overlap (one or two). The last few decoded chunks are kept (at most 16 MiB per
//   decoder), keyed by the checksums and timestamps of the packets they were decoded from, so
//   consecutive and nearby windows pay the open and the pre-roll once per chunk. A window far
//   from the last ones decodes its whole chunk(s) (about 2-3x the per-window work).
//
// The two give the same bits wherever the per-window method equals the CLI (PCM, FLAC, MP3,
// Opus, AAC without PNS; tested): both are then the CLI's samples. With PNS the noise differs
// (same energy, other draws), so which method a job uses is part of its pipeline version
// (docs/pipeline.md "Schedule versions").
//
// Thread safety: none. One thread uses an AudioDecoder at a time; reuse it across windows,
// streams and episodes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "media/decode_common.h"
#include "format/format_fwd.h"

namespace conveyor {

namespace audio_internal {
struct BadRange;
struct Preroll;
struct WindowPlan;
}  // namespace audio_internal

class AudioDecoder {
 public:
  explicit AudioDecoder(AudioMethod method = AudioMethod::kPerWindow);
  ~AudioDecoder();
  AudioDecoder(const AudioDecoder&) = delete;
  AudioDecoder& operator=(const AudioDecoder&) = delete;

  // Decodes the window described above into `out`, interleaved float32 [num_samples, channels]
  // (resized to num_samples * channels), and fills `is_pad` with num_samples entries: 1 where
  // t < 0 or t >= the end of the stream's last packet (those samples are 0), else 0.
  //
  // `out_rate`: Hz, in [stream rate / 256, 768000]. `out_channels`: 0 keeps the stream's channels
  // (and layout); otherwise FFmpeg's default layout for that count (1 = mono, 2 = stereo), mixed
  // by libswresample with its default matrix, as `ffmpeg -ac N` does.
  //
  // At the stream's own rate and channel count samples are copied, not resampled, and `start_s`
  // is rounded to the nearest sample. Otherwise a fresh libswresample context resamples from an
  // input position that depends on the window only, so the same window always gives the same bits
  // whatever was decoded before; output samples are placed on the grid k / out_rate of the
  // episode clock (start_s rounded to the nearest point of that grid).
  //
  // REQUIRES: `stream` is an AUDIO stream whose packets are in pts order (as written by the
  // dataset writer). `read` fetches packet bytes by packet number (Dataset::ReadPacket).
  //
  // Errors: INVALID_ARGUMENT for a bad request (out_rate, out_channels, non-finite start_s,
  // num_samples < 0) or unusable codec parameters; RESOURCE_EXHAUSTED when num_samples, the
  // input samples needed for it, or its bytes exceed `limits` (max_audio_samples,
  // max_sample_bytes); DATA_LOSS when the decoder rejects a packet of the window or produces
  // samples that contradict the codec parameters; errors from `read` as they are. Messages name
  // the codec, the packet and its time; the caller adds dataset, shard, episode and stream.
  // Limits and arguments are checked before anything is allocated; after any other error `out`
  // and `is_pad` hold unspecified values (of the right sizes). Errors on pre-roll packets are
  // ignored (their output is not used), so a damaged packet fails the windows that need its
  // samples, not every window after it.
  absl::Status DecodeWindow(const format::v1::StreamIndex& stream, PacketReader read,
                            double start_s, int64_t num_samples, int out_rate, int out_channels,
                            const DecodeLimits& limits, std::vector<float>* out,
                            std::vector<uint8_t>* is_pad);

  // Packets sent to the decoder (pre-roll included), windows decoded without error, and chunks
  // decoded (kChunks), since construction.
  uint64_t packets_decoded() const { return packets_decoded_; }
  uint64_t windows() const { return windows_; }
  uint64_t chunks_decoded() const { return chunks_decoded_; }
  // Bytes held by kept chunks (kChunks): at most 16 MiB after every call.
  size_t chunk_cache_bytes() const { return chunk_bytes_; }
  AudioMethod method() const { return method_; }

  // kChunks: forgets the kept chunks (the next windows decode theirs again, to the same bits);
  // their memory is kept for those.
  void ClearChunkCache();

 private:
  struct Codec;  // the open FFmpeg decoder and the parameters it was opened with
  struct Chunk;  // one decoded chunk of the grid (kChunks)

  // Makes codec_ a decoder for `stream`, ready for a window's first packet.
  absl::Status UseDecoderFor(const format::v1::StreamIndex& stream, const DecodeLimits& limits);
  absl::Status DecodeOne(const format::v1::StreamIndex& stream, PacketReader read,
                         const DecodeLimits& limits, const audio_internal::WindowPlan& w,
                         const audio_internal::Preroll& preroll, float* dst,
                         std::vector<audio_internal::BadRange>* bad);
  absl::Status CopyFromChunks(const format::v1::StreamIndex& stream, PacketReader read,
                              const DecodeLimits& limits, const audio_internal::WindowPlan& w,
                              const audio_internal::Preroll& preroll, float* dst);

  const AudioMethod method_;
  std::unique_ptr<Codec> codec_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // most recently used last
  size_t chunk_bytes_ = 0;                      // held by chunks_
  std::string chunk_key_;                       // scratch for a chunk's identity
  uint64_t chunks_decoded_ = 0;
  std::vector<float> staging_;    // decoded input samples of the current window (resampling)
  std::vector<float> resampled_;  // resampler output of the current window
  std::string packet_bytes_;
  uint64_t packets_decoded_ = 0;
  uint64_t windows_ = 0;
};

}  // namespace conveyor
