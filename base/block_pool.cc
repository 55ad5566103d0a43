#include "base/block_pool.h"

namespace conveyor {

BlockPool::BlockPool(size_t max_blocks, size_t max_bytes, size_t min_bytes, FreeFn free)
    : max_blocks_(max_blocks), min_bytes_(min_bytes), free_(free), max_bytes_(max_bytes) {}

BlockPool::~BlockPool() {
  absl::MutexLock lock(&mu_);
  for (const Block& b : kept_) free_(b.data, b.kind);
}

BlockPool::Block BlockPool::Take(size_t bytes, int kind) {
  absl::MutexLock lock(&mu_);
  size_t best = kept_.size();
  for (size_t i = 0; i < kept_.size(); ++i) {
    const Block& b = kept_[i];
    if (b.kind != kind || b.capacity < bytes || b.capacity > 2 * bytes + 4096) continue;
    if (best == kept_.size() || b.capacity < kept_[best].capacity) best = i;
  }
  if (best == kept_.size()) return Block{};
  const Block b = kept_[best];
  kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(best));
  bytes_ -= b.capacity;
  return b;
}

void BlockPool::Give(Block b) {
  if (b.data == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (b.capacity >= min_bytes_ && kept_.size() < max_blocks_ && bytes_ + b.capacity <= max_bytes_) {
      kept_.push_back(b);
      bytes_ += b.capacity;
      return;
    }
  }
  free_(b.data, b.kind);
}

void BlockPool::SetMaxBytes(size_t bytes) {
  std::vector<Block> freed;
  {
    absl::MutexLock lock(&mu_);
    max_bytes_ = bytes;
    while (bytes_ > max_bytes_ && !kept_.empty()) {
      freed.push_back(kept_.back());
      bytes_ -= kept_.back().capacity;
      kept_.pop_back();
    }
  }
  for (const Block& b : freed) free_(b.data, b.kind);
}

size_t BlockPool::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

size_t BlockPool::blocks() const {
  absl::MutexLock lock(&mu_);
  return kept_.size();
}

}  // namespace conveyor
