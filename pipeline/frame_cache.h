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
// Optionally backed by a FrameStore (pipeline/frame_store.h): a directory shared by every process
// on the node (under /dev/shm, or on local disk), looked up when a frame is not in memory and
// given every frame decoded, so N servers decode each frame once per node.
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
#include "media/decode_common.h"
#include "pipeline/frame_store.h"

namespace conveyor {

struct Manifest;

struct FrameCacheKey {
  std::string dataset;    // FrameCacheDatasetKey of the dataset
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
  // Pre-faulted pixel buffers (Prefault): made, lent to decoders, and still in the pool (bytes).
  uint64_t prefaulted_bytes = 0;
  uint64_t buffers_lent = 0;
  uint64_t pool_bytes = 0;
  // The node-wide tier (FrameCacheOptions::store), when there is one.
  bool has_store = false;
  FrameStoreStats store;
};

class DecodedFrameCache {
 public:
  enum class Policy { kPinWhatFits, kLru };
  struct Options {
    uint64_t max_bytes = 0;  // the in-memory tier; 0: none (every lookup goes to the store)
    Policy policy = Policy::kPinWhatFits;
    std::shared_ptr<FrameStore> store;  // the node-wide tier; null: none
  };
  explicit DecodedFrameCache(Options options);

  // The frame, or null (counted as a hit or a miss): from memory, else from the store (then
  // offered to memory).
  std::shared_ptr<const RgbImage> Find(const FrameCacheKey& key) const;
  // Offers a decoded frame to memory (kept if the policy admits it; frames larger than the bound
  // never are) and to the store.
  void Insert(const FrameCacheKey& key, std::shared_ptr<const RgbImage> frame);
  // Names a dataset key in the store (conveyor cache info); nothing without a store.
  void NameDataset(const std::string& dataset_key, const std::string& name) const;
  // Whether the frame is held in memory or in the store (not counted; the store's entry is not
  // checked until Find).
  bool Contains(const FrameCacheKey& key) const;
  void Clear();
  FrameCacheStats stats() const;

  // Epoch 1 without page faults on the workers (issue 29 item 5): every frame a cache keeps is
  // memory the process touches for the first time, which the kernel charges 0.36-0.5 CPU s per GB
  // (bench/fresh_memory_bench), about a tenth of a decode-bound first epoch. Prefault makes
  // `count` pixel buffers of `frame_bytes` ahead of the job (at most what the in-memory bound
  // leaves beside the frames held), touching every page on up to `threads` threads; returns the
  // bytes made. TakeBuffer lends one to a decoder (an empty vector when none of that size is
  // left): decode into it, then Insert the frame, and the frame kept costs no fault. The pool
  // counts toward the bound until its buffers are lent.
  uint64_t Prefault(uint64_t frame_bytes, uint64_t count, int threads);
  std::vector<uint8_t> TakeBuffer(uint64_t frame_bytes);
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
  void InsertInMemory(const FrameCacheKey& key, std::shared_ptr<const RgbImage> frame) const;
  // Drops pooled buffers until `bytes` are freed or the pool is empty.
  void FreePoolBytes(uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable std::unordered_map<FrameCacheKey, Entry, KeyHash> map_ ABSL_GUARDED_BY(mu_);
  mutable Lru lru_ ABSL_GUARDED_BY(mu_);
  mutable FrameCacheStats stats_ ABSL_GUARDED_BY(mu_);
  mutable std::unordered_map<uint64_t, std::vector<std::vector<uint8_t>>> pool_ ABSL_GUARDED_BY(mu_);  // by size
};

struct SampleSpec;
struct StreamSpec;
struct StreamInfo;
class Source;

// The bytes of one decoded RGB frame of a video stream as the decoder delivers it for `s` (its
// output size, or the stream's own without one or with a crop); 0 when unknown.
uint64_t DecodedFrameBytes(const StreamSpec& s, const StreamInfo& info);

// Pre-faults `cache` for the frames one epoch of `spec` keeps from `source` (every frame of the
// spec's video streams at their output size, at most the in-memory bound): what `conveyor
// batches`, `serve` and `bench` do before their first pipeline when given --frame-cache-bytes.
// Returns the bytes pre-faulted; 0 without an in-memory tier.
uint64_t PrefaultFrameCache(const Source& source, const SampleSpec& spec, DecodedFrameCache& cache,
                            int threads);

// "pin" -> kPinWhatFits, "lru" -> kLru; false for anything else.
bool ParseFrameCachePolicy(const std::string& name, DecodedFrameCache::Policy* out);

// The dataset part of frame keys: the manifest's fingerprint (streams and episode table) and a
// hash of its contents' identity (shard paths and sizes, the episode table's checksum), so a
// node-wide store never serves frames of a dataset rewritten in place.
std::string FrameCacheDatasetKey(const Manifest& manifest);

// What the CLI's and the server's frame cache flags ask for.
struct FrameCacheConfig {
  uint64_t bytes = 0;             // --frame-cache-bytes: the in-memory tier, per process
  std::string policy = "pin";     // --frame-cache-policy: pin | lru (both tiers)
  std::string dir;                // --frame-cache-dir: the node-wide store; empty: none
  std::string shared_key;         // --frame-cache-shared-key: the store is a group-shared one (FrameStoreOptions)
  uint64_t dir_bytes = 0;         // --frame-cache-dir-bytes; 0: a quarter of dir's filesystem
  std::string compression = "none";  // --frame-cache-compression: none | lz4 | zstd (the store)
};

// The cache a FrameCacheConfig asks for: null when it has neither bytes nor a directory;
// INVALID_ARGUMENT for an unknown policy or compression; the store's errors (Open).
absl::StatusOr<std::shared_ptr<DecodedFrameCache>> MakeFrameCache(const FrameCacheConfig& config);

}  // namespace conveyor
