#include "pipeline/frame_cache.h"

#include <sys/statvfs.h>

#include <filesystem>
#include <algorithm>
#include <functional>
#include <map>

#include "base/mix.h"
#include "base/worker_pool.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "format/manifest.h"
#include "pipeline/source.h"
#include "sample/sample_spec.h"
#include "xxhash.h"

namespace conveyor {

size_t DecodedFrameCache::KeyHash::operator()(const FrameCacheKey& k) const {
  uint64_t h = std::hash<std::string>{}(k.dataset);
  h = Mix64(h ^ k.episode);
  h = Mix64(h ^ static_cast<uint64_t>(k.stream));
  h = Mix64(h ^ static_cast<uint64_t>(k.frame));
  return static_cast<size_t>(Mix64(h ^ k.settings));
}

DecodedFrameCache::DecodedFrameCache(Options options) : options_(options) {
  stats_.max_bytes = options_.max_bytes;
}

std::shared_ptr<const RgbImage> DecodedFrameCache::Find(const FrameCacheKey& key) const {
  {
    absl::MutexLock l(&mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      ++stats_.hits;
      if (options_.policy == Policy::kLru) lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.frame;
    }
    if (!options_.store) {
      ++stats_.misses;
      return nullptr;
    }
  }
  std::shared_ptr<const RgbImage> frame = options_.store->Find(key);
  {
    absl::MutexLock l(&mu_);
    ++(frame ? stats_.hits : stats_.misses);
  }
  if (frame && options_.max_bytes > 0) InsertInMemory(key, frame);
  return frame;
}

void DecodedFrameCache::Insert(const FrameCacheKey& key, std::shared_ptr<const RgbImage> frame) {
  if (!frame) return;
  if (options_.store) options_.store->Insert(key, *frame);
  if (options_.max_bytes > 0) InsertInMemory(key, std::move(frame));
}

bool DecodedFrameCache::Contains(const FrameCacheKey& key) const {
  {
    absl::MutexLock l(&mu_);
    if (map_.count(key) > 0) return true;
  }
  return options_.store && options_.store->Contains(key);
}

void DecodedFrameCache::NameDataset(const std::string& dataset_key, const std::string& name) const {
  if (options_.store) options_.store->NameDataset(dataset_key, name);
}

void DecodedFrameCache::InsertInMemory(const FrameCacheKey& key, std::shared_ptr<const RgbImage> frame) const {
  const uint64_t bytes = frame->pixels.size();
  absl::MutexLock l(&mu_);
  if (map_.count(key) > 0) return;
  if (bytes > options_.max_bytes) {
    ++stats_.rejected;
    return;
  }
  if (stats_.bytes + stats_.pool_bytes + bytes > options_.max_bytes && stats_.pool_bytes > 0) {
    // The pool's room goes to frames decoded into its buffers: give some back for this one.
    FreePoolBytes(stats_.bytes + stats_.pool_bytes + bytes - options_.max_bytes);
  }
  if (stats_.bytes + bytes > options_.max_bytes) {
    if (options_.policy == Policy::kPinWhatFits) {
      ++stats_.rejected;
      return;
    }
    while (stats_.bytes + bytes > options_.max_bytes && !lru_.empty()) {
      auto victim = map_.find(lru_.back());
      const uint64_t b = victim->second.frame->pixels.size();
      stats_.bytes -= b;
      stats_.evicted_bytes += b;
      --stats_.frames;
      map_.erase(victim);
      lru_.pop_back();
    }
  }
  lru_.push_front(key);
  map_.emplace(key, Entry{std::move(frame), lru_.begin()});
  stats_.bytes += bytes;
  stats_.inserted_bytes += bytes;
  ++stats_.frames;
}

uint64_t DecodedFrameCache::Prefault(uint64_t frame_bytes, uint64_t count, int threads) {
  if (frame_bytes == 0 || count == 0 || options_.max_bytes == 0) return 0;
  {
    absl::MutexLock l(&mu_);
    const uint64_t used = stats_.bytes + stats_.pool_bytes;
    const uint64_t room = used < options_.max_bytes ? options_.max_bytes - used : 0;
    count = std::min(count, room / frame_bytes);
    stats_.pool_bytes += count * frame_bytes;  // reserved now, so that two callers share the room
  }
  if (count == 0) return 0;
  // Each buffer is value-initialized: every page written once, so the kernel maps it here.
  std::vector<std::vector<uint8_t>> made(count);
  const int n = std::max(1, threads);
  (void)ParallelFor("conveyor-prefault", n, static_cast<size_t>(n), [&](size_t t) {
    for (uint64_t i = t; i < count; i += static_cast<uint64_t>(n)) made[i].assign(frame_bytes, 0);
    return absl::OkStatus();
  });
  absl::MutexLock l(&mu_);
  auto& list = pool_[frame_bytes];
  for (auto& b : made) list.push_back(std::move(b));
  stats_.prefaulted_bytes += count * frame_bytes;
  return count * frame_bytes;
}

void DecodedFrameCache::FreePoolBytes(uint64_t bytes) const {
  for (auto& [size, list] : pool_) {
    while (!list.empty() && bytes > 0) {
      list.pop_back();
      stats_.pool_bytes -= size;
      bytes = bytes > size ? bytes - size : 0;
    }
  }
}

std::vector<uint8_t> DecodedFrameCache::TakeBuffer(uint64_t frame_bytes) {
  absl::MutexLock l(&mu_);
  auto it = pool_.find(frame_bytes);
  if (it == pool_.end() || it->second.empty()) return {};
  std::vector<uint8_t> b = std::move(it->second.back());
  it->second.pop_back();
  stats_.pool_bytes -= frame_bytes;
  ++stats_.buffers_lent;
  return b;
}

void DecodedFrameCache::Clear() {
  absl::MutexLock l(&mu_);
  map_.clear();
  lru_.clear();
  stats_.bytes = 0;
  stats_.frames = 0;
}

FrameCacheStats DecodedFrameCache::stats() const {
  FrameCacheStats s;
  {
    absl::MutexLock l(&mu_);
    s = stats_;
  }
  if (options_.store) {
    s.has_store = true;
    s.store = options_.store->stats();
  }
  return s;
}

uint64_t DecodedFrameBytes(const StreamSpec& s, const StreamInfo& info) {
  int64_t w = s.augment.crop.has_value() ? 0 : s.width;
  int64_t h = s.augment.crop.has_value() ? 0 : s.height;
  if (w <= 0 || h <= 0) {
    if (info.shape.size() < 2) return 0;
    h = info.shape[0];  // a quarter rotation swaps them: the same bytes
    w = info.shape[1];
  }
  return static_cast<uint64_t>(w * h * 3);
}

uint64_t PrefaultFrameCache(const Source& source, const SampleSpec& spec, DecodedFrameCache& cache,
                            int threads) {
  if (cache.options().max_bytes == 0 || source.is_mixture()) return 0;  // a mixture: not sized yet
  const Dataset& ds = source.dataset(0);
  const Manifest& m = ds.manifest();
  // Frames of each output size one epoch decodes: every frame of the spec's video streams.
  std::map<uint64_t, uint64_t> frames_by_size;
  for (const StreamSpec& s : spec.streams) {
    if (s.kind != format::v1::VIDEO) continue;
    const uint64_t bytes = DecodedFrameBytes(s, m.streams[s.stream]);
    if (bytes == 0) continue;
    uint64_t frames = 0;
    for (size_t e = 0; e < ds.num_episodes(); ++e) frames += ds.episodes().record(e).lengths[s.stream];
    frames_by_size[bytes] += frames;
  }
  uint64_t made = 0;
  for (const auto& [bytes, frames] : frames_by_size) made += cache.Prefault(bytes, frames, threads);
  return made;
}

bool ParseFrameCachePolicy(const std::string& name, DecodedFrameCache::Policy* out) {
  if (name == "pin") {
    *out = DecodedFrameCache::Policy::kPinWhatFits;
  } else if (name == "lru") {
    *out = DecodedFrameCache::Policy::kLru;
  } else {
    return false;
  }
  return true;
}

std::string FrameCacheDatasetKey(const Manifest& m) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  for (const ShardInfo& shard : m.shards) {
    XXH3_64bits_update(s, shard.path.data(), shard.path.size() + 1);  // with its terminator
    XXH3_64bits_update(s, &shard.bytes, sizeof shard.bytes);
  }
  XXH3_64bits_update(s, m.episode_table_xxh3.data(), m.episode_table_xxh3.size());
  XXH3_64bits_update(s, &m.total_bytes, sizeof m.total_bytes);
  const uint64_t contents = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(contents));
  return StrCat(m.fingerprint, "-", hex);
}

absl::StatusOr<std::shared_ptr<DecodedFrameCache>> MakeFrameCache(const FrameCacheConfig& config) {
  DecodedFrameCache::Options o;
  o.max_bytes = config.bytes;
  if (!ParseFrameCachePolicy(config.policy, &o.policy)) {
    return absl::InvalidArgumentError("frame cache policy '" + config.policy + "': expected pin or lru");
  }
  FrameStoreOptions so;
  if (!ParseFrameStoreCompression(config.compression, &so.compression)) {
    return absl::InvalidArgumentError("frame cache compression '" + config.compression +
                                      "': expected none, lz4 or zstd");
  }
  if (!config.dir.empty()) {
    so.dir = config.dir;
    so.shared_key_file = config.shared_key;
    so.max_bytes = config.dir_bytes;
    so.policy = o.policy == DecodedFrameCache::Policy::kLru ? FrameStoreOptions::Policy::kLru
                                                            : FrameStoreOptions::Policy::kPinWhatFits;
    if (so.max_bytes == 0) {
      // The filesystem the directory is or will be on: its nearest existing ancestor (the store
      // creates the directory itself, with the mode its sharing asks for).
      std::filesystem::path on(config.dir);
      struct statvfs vfs;
      while (::statvfs(on.c_str(), &vfs) != 0 && on.has_relative_path()) on = on.parent_path();
      if (on.empty()) on = ".";
      if (::statvfs(on.c_str(), &vfs) != 0) {
        return absl::InvalidArgumentError(StrCat("frame cache directory ", config.dir,
                                                 ": cannot size its filesystem; give --frame-cache-dir-bytes"));
      }
      so.max_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize / 4;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<FrameStore> store, FrameStore::Open(so));
    o.store = std::move(store);
  }
  if (o.max_bytes == 0 && !o.store) return std::shared_ptr<DecodedFrameCache>();
  return std::make_shared<DecodedFrameCache>(o);
}

}  // namespace conveyor
