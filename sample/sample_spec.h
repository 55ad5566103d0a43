// The sample spec: what one training sample holds, read from a YAML config and checked against a
// dataset's manifest. LeRobot-compatible `delta_timestamps` semantics; see docs/sampling.md for
// every key and examples/ for config files.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/types.h"
#include "media/decode_backend.h"
#include "media/decode_common.h"
#include "media/video_decoder.h"
#include "format/format_fwd.h"
#include "format/manifest.h"
#include "datasets/sample_index.h"
#include "sample/buckets.h"

namespace conveyor {

class TextTokenizer;  // sample/tokenizer.h

enum class ImageLayout { kHWC, kCHW };
enum class ImageDType { kUint8, kFloat32 };
// kQuantile: q01/q99 (pi0-style, LeRobot's QUANTILES); kQuantile10: q10/q90 (LeRobot's
// QUANTILE10). Both map the quantile range onto [-1, 1] as min_max maps [min, max].
enum class LowdimNorm { kNone, kMeanStd, kMinMax, kQuantile, kQuantile10 };
enum class FrameMatch { kNearest, kPrevious };
enum class OnError { kFail, kSkip };

struct RandomResizedCrop {
  double scale_min = 0.08, scale_max = 1.0;         // fraction of the frame's area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height
};

struct ColorJitter {
  double brightness = 0, contrast = 0, saturation = 0;  // factor drawn from [1 - x, 1 + x]
  bool enabled() const { return brightness > 0 || contrast > 0 || saturation > 0; }
};

struct ImageAugment {
  std::optional<RandomResizedCrop> crop;
  double hflip = 0;  // probability
  ColorJitter jitter;
  bool enabled() const { return crop.has_value() || hflip > 0 || jitter.enabled(); }
};

struct StreamSpec {
  std::string name;
  int stream = -1;  // index in the manifest
  format::v1::StreamKind kind{};  // STREAM_KIND_UNSPECIFIED (0) until resolved

  // VIDEO, IMAGE, LOWDIM: requested times relative to the anchor time, seconds.
  std::vector<double> deltas;
  // AUDIO: the window [window_start, window_end) relative to the anchor time.
  double window_start = 0, window_end = 0;
  double tolerance_s = 0;  // resolved: the config's value or half the stream's period
  FrameMatch match = FrameMatch::kNearest;

  // VIDEO, IMAGE output.
  int height = 0, width = 0;  // 0 = the frame's own size
  ImageLayout layout = ImageLayout::kHWC;
  ImageDType dtype = ImageDType::kUint8;
  ResizeFilter resize = ResizeFilter::kBilinear;
  std::array<float, 3> mean{0, 0, 0}, std{1, 1, 1};  // float32 output: (x / 255 - mean) / std
  bool autorotate = true;
  ImageAugment augment;
  // VIDEO: where its frames are decoded, as the config says it (media/decode_backend.h:
  // ChooseDecodeBackend says what it means where the stream is decoded). Parsing reads the word
  // only; whether this machine can honour `gpu` is asked where a pipeline opens
  // (CheckVideoBackends, sample/sample_assembler.h), so a config parses the same everywhere.
  DecodeBackend decode = DecodeBackend::kAuto;
  // Where the config says `decode:` ("FILE:LINE:COLUMN"), for the errors and the log line of
  // CheckVideoBackends; empty when it does not.
  std::string decode_at;

  // AUDIO output.
  int audio_rate = 0;      // 0 = the stream's rate
  int audio_channels = 0;  // 0 = the stream's channels

  // LOWDIM output.
  LowdimNorm normalize = LowdimNorm::kNone;
  // Resolved from the manifest stats: y = (x - offset) * scale + bias (LeRobot's formulas, eps
  // 1e-8: mean_std (x - mean) / (std + eps); min_max 2 (x - min) / (max - min + eps) - 1;
  // quantile 2 (x - q01) / (q99 - q01 + eps) - 1; quantile10 the same with q10 and q90).
  std::vector<float> norm_offset, norm_scale;
  float norm_bias = 0;
  // `shape: stored` on a per-clip tensor (a WebDataset `.npy` member, codec "npy DTYPE SHAPE"):
  // the tensor is served in its stored shape ([L, D] embeddings, [T, C, H, W] latents; a 0-d
  // array as [1]) instead of [1, elements]. Empty: [steps, dim].
  std::vector<int64_t> stored_shape;
  // `dtype:` (docs/sampling.md "Tensor dtypes"): the element type the values are served in,
  // kFloat32 (the default: every config without the key keeps its bits), kFloat16 or kBFloat16
  // (rounded to nearest even from the float32 values, after normalization); `stored` resolves to
  // a `.npy` member's own float type here.
  DType value_dtype = DType::kFloat32;
  // `pad_to: N` with `shape: stored` (sample/stored_tensor.h): a varying first dimension L padded
  // with zero rows to N (stored_shape[0] is then N) and masked in `<name>_is_pad`; L > N is an
  // error, or cut to N with `overlong: truncate` (pad_truncate). 0: no padding.
  int64_t pad_to = 0;
  bool pad_truncate = false;

  // TEXT: the `tokenizer:` key's model (sample/tokenizer.h): the stream's tensor is then int32
  // token ids instead of UTF-8 bytes. Null: bytes. Shared by every copy of the spec and every
  // worker (encoding is thread-safe).
  std::shared_ptr<const TextTokenizer> tokenizer;
};

// Where the random resized crop of a video stream decoded on the CPU is cut (docs/sampling.md
// "Augmentation"). The numbers are stable: a job's pipeline version decides the method
// (docs/pipeline.md "Schedule versions").
enum class CropMethod : uint32_t {
  // The frame converted to RGB at full size, then cropped and resized by Conveyor's triangle
  // filter (sample/augment.h ResizeRgb): pipeline versions 1 to 3.
  kFromRgb = 1,
  // Cut in the decoder's pixel format and converted to the output size in one libswscale pass
  // with the stream's `resize` filter (VideoOutput::crop): version 4. Image streams and NVDEC
  // streams crop from RGB whatever the method.
  kInDecoder = 2,
};

struct SampleSpec {
  std::string anchor;
  int anchor_stream = -1;
  std::vector<StreamSpec> streams;  // in config order
  DecodeLimits limits;
  OnError on_error = OnError::kFail;
  // `quarantine: FILE`: episodes `conveyor check --write-quarantine` found errors in are left out
  // of the order (sample/quarantine.h). Empty: none.
  std::string quarantine;
  // `clips:`: a sample is one of each episode's clips of the epoch (K per video, or one every
  // `stride` anchor steps) at anchors drawn from (seed, epoch, episode), instead of every anchor
  // step (datasets/sample_index.h; docs/sampling.md "Clips per video").
  ClipSampling clips;
  // `buckets:`: each episode's cameras at the size of the bucket nearest its aspect, and one
  // bucket per batch (sample/buckets.h, shuffle/buckets.h; docs/sampling.md "Buckets").
  FrameBuckets buckets;
  // How audio windows are decoded. The pipeline sets it from the job's pipeline version
  // (docs/pipeline.md "Schedule versions"), so a resumed job keeps the method it started with;
  // other users (conveyor sample, benches) get the current one.
  AudioMethod audio_method = AudioMethod::kChunks;
  // Where a CPU-decoded video stream's random resized crop is cut; the pipeline sets it from the
  // job's pipeline version like audio_method (kFromRgb before version 4).
  CropMethod crop_method = CropMethod::kInDecoder;
  // The config text this spec was parsed from: a mixture binds the same text to each of its
  // datasets' streams (pipeline/source.h).
  std::string config_text;
  std::string config_source;

  // Parses `yaml` and checks every stream, option and value against `manifest`. Errors name the
  // config (`source`), the key and what to fix; unknown keys are errors (a typo is not ignored).
  static absl::StatusOr<SampleSpec> FromYaml(std::string_view yaml, const Manifest& manifest,
                                             std::string_view source);
  static absl::StatusOr<SampleSpec> FromFile(const std::string& path, const Manifest& manifest);
  // Every stream of the manifest with its defaults (cameras [0.0] at their own size, lowdim
  // [0.0], audio none): what `conveyor sample` uses without --config.
  static absl::StatusOr<SampleSpec> Default(const Manifest& manifest);
};

}  // namespace conveyor
