// DecodedFrameCache: decoded video frames kept across epochs and shared by every pipeline given
// the same cache (all the streams of one `conveyor serve`, a `conveyor batches` run), so that a
// dataset's frames are decoded once per process, not once per epoch and stream (docs/pipeline.md
// "The decoded-frame cache").
//
// A frame is kept as the decoder delivers it, before any augmentation, keyed by everything that
// decides its pixels: (dataset fingerprint, episode, stream, frame number, decode settings: output
// size, resize filter, autorotation). Augmentation stays a pure function of (seed, epoch, sample)
// applied afterwards, so batches are bit-identical with or without the cache (tested).
//
// Bounded in bytes. Two policies, for epoch-shuffled access where every frame is used once per
// epoch in an order that changes every epoch:
//   kPinWhatFits (default): frames are admitted until the bound and then kept; later frames are
//     not admitted. A dataset of D bytes in a cache of C < D hits C/D of its frames every epoch.
//   kLru: the least recently used frames are evicted to admit new ones. Under a fresh shuffle
//     each epoch the frames evicted are as likely to come next as any, so once D > C an epoch
//     mostly misses (bench/RESULTS.md "Decoded-frame cache" measures both).
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "decoders/decode_common.h"

namespace conveyor {

struct FrameCacheKey {
  std::string dataset;    // the manifest's fingerprint
  uint64_t episode = 0;
  int stream = 0;         // the manifest's stream index
  int64_t frame = 0;      // index into the episode's FrameTable
  uint64_t settings = 0;  // DecodeSettingsKey of the output the frame was decoded at
  bool operator==(const FrameCacheKey&) const = default;
};

struct FrameCacheStats {
  uint64_t hits = 0, misses = 0;      // Find() calls
  uint64_t frames = 0, bytes = 0;     // held now
  uint64_t inserted_bytes = 0;        // admitted since construction
  uint64_t evicted_bytes = 0;         // kLru: dropped to admit others
  uint64_t rejected = 0;              // kPinWhatFits: frames not admitted (the cache was full)
  uint64_t max_bytes = 0;
};

class DecodedFrameCache {
 public:
  enum class Policy { kPinWhatFits, kLru };
  struct Options {
    uint64_t max_bytes = 0;  // > 0
    Policy policy = Policy::kPinWhatFits;
  };
  explicit DecodedFrameCache(Options options);

  // The frame, or null (counted as a hit or a miss).
  std::shared_ptr<const RgbImage> Find(const FrameCacheKey& key) const;
  // Offers a decoded frame; kept if the policy admits it. Frames larger than the bound never are.
  void Insert(const FrameCacheKey& key, std::shared_ptr<const RgbImage> frame);
  void Clear();
  FrameCacheStats stats() const;
  const Options& options() const { return options_; }

 private:
  struct KeyHash {
    size_t operator()(const FrameCacheKey& k) const;
  };
  using Lru = std::list<FrameCacheKey>;  // most recently used first (kLru)
  struct Entry {
    std::shared_ptr<const RgbImage> frame;
    Lru::iterator lru;
  };
  const Options options_;
  mutable absl::Mutex mu_;
  std::unordered_map<FrameCacheKey, Entry, KeyHash> map_ ABSL_GUARDED_BY(mu_);
  mutable Lru lru_ ABSL_GUARDED_BY(mu_);
  mutable FrameCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

// "pin" -> kPinWhatFits, "lru" -> kLru; false for anything else.
bool ParseFrameCachePolicy(const std::string& name, DecodedFrameCache::Policy* out);

// The cache a --frame-cache-bytes / --frame-cache-policy pair asks for: null for 0 bytes;
// INVALID_ARGUMENT for a policy other than pin or lru.
absl::StatusOr<std::shared_ptr<DecodedFrameCache>> MakeFrameCache(uint64_t max_bytes, const std::string& policy);

}  // namespace conveyor
