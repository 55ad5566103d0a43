// FrameStore: the node-wide tier of the decoded-frame cache (docs/pipeline.md "The decoded-frame
// cache"). Decoded frames as files under one directory, shared by every Conveyor process on the
// node that is given the same directory: all the servers of a node, their restarts, several jobs
// reading the same dataset with the same decode settings, and `conveyor cache warm` run ahead of
// them. Under /dev/shm it is shared memory; on a local NVMe disk it outlives a reboot.
//
// Layout (version 2; a version-1 store's frames1/ is ignored, and removed by `conveyor cache clear`):
//   DIR/frames2/DATASET/SETTINGS/EPISODE/STREAM.FRAME   one entry (a frame)
//   DIR/tmp/                                            entries being written
//   DIR/lock                                            flock'd while the byte account changes
//   DIR/usage                                           bytes of the entries published (8 bytes)
// An entry is a 96-byte header (magic, the XXH3 of its full key, width, height, codec, sizes,
// the payload's XXH3, in a shared store the HMAC-SHA256 of all that, the key and the payload, and
// the header's own XXH3) and the payload: the RGB pixels as the decoder delivered them, raw or
// compressed (lz4, zstd).
//
// Who can use it (base/cache_dir.h, docs/serving.md "Shared nodes"): by default DIR is private to
// the uid that opens it (0700, entries 0600; a DIR owned by another user is refused). Several users
// or jobs share one DIR only through `shared_key_file`: a group directory whose entries carry a MAC
// under the node secret, so an entry forged by anyone without the secret is counted corrupt, never
// a hit. No open follows a symbolic link or blocks on a FIFO planted in DIR.
//
// Why this shape (the same as the storage cache, storage/caching_storage.cc):
// - Atomic publish: written whole under tmp/, renamed into place under the lock; a reader sees no
//   entry or a complete one. A process that dies while writing leaves a tmp/ file, never a torn
//   entry in frames1/ (`conveyor cache clear` or a later eviction removes tmp/ files).
// - Verified on every read: the header checksum, the key, the sizes and the payload checksum are
//   checked before a frame is returned. A torn, corrupted or mismatched entry is removed and
//   reported as a miss (the frame is decoded again), and counted (`corrupt`).
// - One bound for the whole node: `usage` is read and written under the flock by whichever
//   process publishes; an entry is admitted only while usage + entry <= max_bytes (pin), or
//   after evicting the least recently used entries down to 90% of the bound (lru; a hit touches
//   its entry's mtime). Every process should be given the same bound; the smallest one given is
//   the one that holds.
// - A store that cannot be written (a full disk, a read-only directory) never fails a batch: the
//   frame is decoded as without it, and one warning is logged.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "media/decode_common.h"

namespace conveyor {

struct FrameCacheKey;

struct FrameStoreOptions {
  std::string dir;         // created if missing; private to this uid unless shared_key_file is given
  // A node secret (32+ random bytes, readable by the group sharing DIR, not by every user): DIR is
  // then a group-shared store and every entry is authenticated with it. Empty: private.
  std::string shared_key_file;
  uint64_t max_bytes = 0;  // > 0: the bound for all processes together (entry files, headers included)
  enum class Policy { kPinWhatFits, kLru } policy = Policy::kPinWhatFits;
  // How the pixels are kept. kNone (default): raw, read back with one copy; kLz4 / kZstd:
  // smaller entries for a disk tier, at the cost of compressing in epoch 1 and decompressing on
  // every hit (bench/RESULTS.md "Decoded-frame cache" measures all three).
  enum class Compression { kNone, kLz4, kZstd } compression = Compression::kNone;
};

struct FrameStoreStats {
  uint64_t hits = 0, misses = 0;   // Find() calls of this process
  uint64_t hit_bytes = 0;          // pixels returned
  uint64_t published = 0;          // entries this process wrote
  uint64_t published_bytes = 0;    // their file bytes
  uint64_t already_present = 0;    // inserts another process had published first
  uint64_t rejected = 0;           // pin: not admitted, the store was full
  uint64_t evicted_bytes = 0;      // lru: removed by this process to admit others
  uint64_t corrupt = 0;            // entries that failed a check, removed and decoded again
  uint64_t write_errors = 0;       // entries that could not be written (logged once)
  uint64_t usage_bytes = 0;        // the node's account (all processes), as last read
  uint64_t max_bytes = 0;
};

// What is under a store's directory, by scanning it (conveyor cache info).
struct FrameStoreUsage {
  struct Dataset {
    std::string key;         // the dataset part of the frames' keys (fingerprint and contents)
    std::string name;        // from the dataset's `source` file, when one was written
    uint64_t entries = 0;
    uint64_t bytes = 0;      // entry files
    uint64_t pixel_bytes = 0;  // what they decode to (from the headers)
  };
  std::vector<Dataset> datasets;
  uint64_t entries = 0, bytes = 0, pixel_bytes = 0;
  uint64_t accounted_bytes = 0;  // the `usage` file
  uint64_t tmp_files = 0, tmp_bytes = 0;
};

class FrameStore {
 public:
  // Creates the directory layout when missing. INVALID_ARGUMENT for an empty dir or a zero
  // bound; the directory's own errors (permissions) name it.
  static absl::StatusOr<std::unique_ptr<FrameStore>> Open(FrameStoreOptions options);
  ~FrameStore();

  // The frame, or null when absent or when the entry fails a check (then removed and counted).
  std::shared_ptr<const RgbImage> Find(const FrameCacheKey& key) const;
  // Whether an entry exists (not checked; Find checks).
  bool Contains(const FrameCacheKey& key) const;
  // Publishes a frame unless an entry exists or the policy does not admit it.
  void Insert(const FrameCacheKey& key, const RgbImage& frame) const;
  // Names the dataset behind a dataset key in the store (shown by conveyor cache info).
  void NameDataset(const std::string& dataset_key, const std::string& name) const;

  FrameStoreStats stats() const;
  const FrameStoreOptions& options() const { return options_; }

  // Scans `dir` (read-only; no lock). NOT_FOUND when it is not a store.
  static absl::StatusOr<FrameStoreUsage> Scan(const std::string& dir);
  // Removes every entry and tmp/ file of `dir` (all datasets, or the one whose key starts with
  // `dataset_prefix`) under the lock, and sets the account to what remains.
  static absl::StatusOr<FrameStoreUsage> Clear(const std::string& dir, const std::string& dataset_prefix = "");

 private:
  explicit FrameStore(FrameStoreOptions options);
  struct Counters;
  const FrameStoreOptions options_;
  std::unique_ptr<Counters> counters_;
};

// "none", "lz4", "zstd"; false for anything else.
bool ParseFrameStoreCompression(const std::string& name, FrameStoreOptions::Compression* out);
const char* FrameStoreCompressionName(FrameStoreOptions::Compression c);

}  // namespace conveyor
