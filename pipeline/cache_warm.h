// WarmFrameCache: fills a decoded-frame cache with every frame a config's samples need, ahead of
// the jobs that will read them (`conveyor cache warm`, docs/pipeline.md "The decoded-frame
// cache"). Episodes are decoded front to back, each frame once (the cheapest order for a
// decoder), on `threads` workers; frames already in the cache are not decoded again. The frames
// and their keys are exactly those the pipeline's GOP schedule looks up for the same dataset and
// config, so a job started afterwards on the same cache decodes nothing that was warmed.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "sample/sample_spec.h"
#include "pipeline/frame_cache.h"
#include "pipeline/source.h"

namespace conveyor {

struct WarmProgress {
  uint64_t episodes = 0, episodes_done = 0;  // (dataset, episode) pairs with video to warm
  uint64_t frames_needed = 0;     // distinct frames the config's samples use, in the episodes done
  uint64_t frames_present = 0;    // of them, already in the cache (not decoded)
  uint64_t frames_decoded = 0;    // decoded and offered to the cache
  uint64_t bytes_decoded = 0;     // their pixels
  uint64_t episodes_failed = 0;   // episodes that could not be read or decoded (logged; skipped)
  double seconds = 0;
};

struct WarmOptions {
  int threads = 1;
  // Called from the workers, one call at a time, after each episode.
  std::function<void(const WarmProgress&)> progress;
  // Frames decoded per call to the decoder (bounds the memory of one worker to this many frames).
  size_t frames_per_pass = 64;
};

// `spec` is parsed against source.manifest(). INVALID_ARGUMENT when the spec has no video stream.
absl::StatusOr<WarmProgress> WarmFrameCache(const Source& source, const SampleSpec& spec, DecodedFrameCache* cache,
                                            const WarmOptions& options);

}  // namespace conveyor
