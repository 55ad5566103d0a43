#include "pipeline/frame_cache.h"

#include <functional>

#include "base/mix.h"

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
  absl::MutexLock l(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  if (options_.policy == Policy::kLru) lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.frame;
}

void DecodedFrameCache::Insert(const FrameCacheKey& key, std::shared_ptr<const RgbImage> frame) {
  if (!frame) return;
  const uint64_t bytes = frame->pixels.size();
  absl::MutexLock l(&mu_);
  if (map_.count(key) > 0) return;
  if (bytes > options_.max_bytes) {
    ++stats_.rejected;
    return;
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

void DecodedFrameCache::Clear() {
  absl::MutexLock l(&mu_);
  map_.clear();
  lru_.clear();
  stats_.bytes = 0;
  stats_.frames = 0;
}

FrameCacheStats DecodedFrameCache::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
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

absl::StatusOr<std::shared_ptr<DecodedFrameCache>> MakeFrameCache(uint64_t max_bytes, const std::string& policy) {
  DecodedFrameCache::Options o;
  o.max_bytes = max_bytes;
  if (!ParseFrameCachePolicy(policy, &o.policy)) {
    return absl::InvalidArgumentError("frame cache policy '" + policy + "': expected pin or lru");
  }
  if (max_bytes == 0) return std::shared_ptr<DecodedFrameCache>();
  return std::make_shared<DecodedFrameCache>(o);
}

}  // namespace conveyor
