// A GOP window's frames (pipeline/internal/pipeline_impl.h): each block's frames decoded once, in
// one forward pass per (episode, stream), or taken from the decoded-frame cache, then held in the
// window's prefetch until its last sample is assembled.
#include <algorithm>
#include <map>

#include "pipeline/internal/pipeline_impl.h"

namespace conveyor {

std::shared_ptr<const RgbImage> Pipeline::Impl::MemberPrefetch::Find(uint64_t episode, int stream,
                                                                     int64_t frame) const {
  absl::MutexLock lock(&impl->mu);
  const uint64_t k = FrameKey(episode, stream, frame);
  for (auto it = impl->windows.lower_bound(WindowKey{member, 0, 0});
       it != impl->windows.end() && it->first.member == member; ++it) {
    auto f = it->second.frames.find(k);
    if (f != it->second.frames.end()) return f->second;
  }
  return nullptr;
}

Pipeline::Impl::DecodedBlock Pipeline::Impl::DecodeBlock(SampleAssembler& assembler,
                                                         const Task& task,
                                                         std::vector<FrameRequest>* needed,
                                                         std::vector<RgbImage>* images) {
  std::map<std::pair<uint64_t, size_t>, FrameRequest> merged;
  for (uint64_t s : task.block_samples) {
    if (!assembler.NeededFrames(s, task.member_epoch, needed).ok()) continue;  // the sample task reports it
    for (FrameRequest& r : *needed) {
      FrameRequest& m = merged[{r.episode, r.spec_stream}];
      m.episode = r.episode;
      m.spec_stream = r.spec_stream;
      m.stream = r.stream;
      m.frames.insert(m.frames.end(), r.frames.begin(), r.frames.end());
    }
  }
  DecodedBlock out;
  out.empty = merged.empty();
  for (auto& [k, r] : merged) {
    std::sort(r.frames.begin(), r.frames.end());
    r.frames.erase(std::unique(r.frames.begin(), r.frames.end()), r.frames.end());
    if (TakeCachedFrames(task.member, assembler, r, &out.frames)) {
      out.from_cache += r.frames.size();
      continue;
    }
    out.all_cached = false;
    if (opt.frame_cache) LendPrefaultedBuffers(task.member, r, images);
    if (!assembler.DecodeFrames(r, images).ok()) continue;  // the sample task reports it
    for (size_t i = 0; i < r.frames.size(); ++i) {
      auto img = std::make_shared<const RgbImage>(std::move((*images)[i]));
      if (opt.frame_cache) {
        opt.frame_cache->Insert(CacheKey(task.member, assembler, r, r.frames[i]), img);
        ++out.decoded_for_cache;
      }
      out.frames.emplace_back(FrameKey(r.episode, r.stream, r.frames[i]), std::move(img));
    }
  }
  return out;
}

void Pipeline::Impl::LendPrefaultedBuffers(uint32_t member, const FrameRequest& r,
                                           std::vector<RgbImage>* images) const {
  const Member& m = *members[member];
  const StreamSpec& s = m.bound.spec.streams[r.spec_stream];
  const uint64_t bytes = DecodedFrameBytes(s, m.dataset->manifest().streams[s.stream]);
  if (bytes == 0) return;
  if (images->size() < r.frames.size()) images->resize(r.frames.size());
  for (size_t i = 0; i < r.frames.size(); ++i) {
    std::vector<uint8_t>& px = (*images)[i].pixels;
    if (px.size() == bytes) continue;
    std::vector<uint8_t> b = opt.frame_cache->TakeBuffer(bytes);
    if (b.empty()) return;  // the pool is spent
    px = std::move(b);
  }
}

void Pipeline::Impl::AddToWindow(const Task& task, DecodedBlock* block) {
  stats.frame_cache_hits += block->from_cache;
  stats.frame_cache_misses += block->decoded_for_cache;
  if (opt.frame_cache && block->all_cached && !block->empty) ++stats.blocks_from_frame_cache;
  Window& w = windows[task.window];
  for (auto& [k, img] : block->frames) {
    if (w.frames.emplace(k, img).second) {
      w.bytes += img->pixels.size();
      prefetch_bytes += img->pixels.size();
    }
  }
  stats.prefetch_bytes_peak = std::max(stats.prefetch_bytes_peak, prefetch_bytes);
  stats.queue_bytes_peak = std::max(stats.queue_bytes_peak, prefetch_bytes + results_bytes);
  if (--w.prefetch_left == 0) window_cv.SignalAll();
  work_cv.SignalAll();
}

FrameCacheKey Pipeline::Impl::CacheKey(uint32_t member, const SampleAssembler& assembler,
                                       const FrameRequest& r, int64_t frame) const {
  return FrameCacheKey{members[member]->frame_cache_key, r.episode, r.stream, frame,
                       assembler.DecodeSettingsKey(r.spec_stream)};
}

bool Pipeline::Impl::TakeCachedFrames(
    uint32_t member, const SampleAssembler& assembler, const FrameRequest& r,
    std::vector<std::pair<uint64_t, std::shared_ptr<const RgbImage>>>* out) const {
  if (!opt.frame_cache || r.frames.empty()) return false;
  const size_t before = out->size();
  for (int64_t f : r.frames) {
    std::shared_ptr<const RgbImage> img = opt.frame_cache->Find(CacheKey(member, assembler, r, f));
    if (!img) {
      out->resize(before);
      return false;
    }
    out->emplace_back(FrameKey(r.episode, r.stream, f), std::move(img));
  }
  return true;
}
}  // namespace conveyor
