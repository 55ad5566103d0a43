#include "pipeline/cache_warm.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "pipeline/internal/spec_figures.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/worker_pool.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/sample_index.h"
#include "sample/quarantine.h"
#include "sample/sample_assembler.h"
#include "spdlog/spdlog.h"

namespace conveyor {
namespace {

struct Member {
  const Dataset* dataset = nullptr;
  BoundMember bound;
  SampleIndex index;
  std::string key;  // FrameCacheDatasetKey
};

struct Item {
  size_t member;
  uint64_t episode;
};

// Assemblers are per thread in the pipeline; here a worker borrows one per member for an episode.
class AssemblerPool {
 public:
  explicit AssemblerPool(const std::vector<std::unique_ptr<Member>>& members) : members_(members) {}
  std::unique_ptr<SampleAssembler> Take(size_t k) {
    {
      absl::MutexLock l(&mu_);
      auto& free = free_[k];
      if (!free.empty()) {
        std::unique_ptr<SampleAssembler> a = std::move(free.back());
        free.pop_back();
        return a;
      }
    }
    const Member& m = *members_[k];
    return std::make_unique<SampleAssembler>(*m.dataset, m.bound.spec, m.index);
  }
  void Give(size_t k, std::unique_ptr<SampleAssembler> a) {
    absl::MutexLock l(&mu_);
    free_[k].push_back(std::move(a));
  }

 private:
  const std::vector<std::unique_ptr<Member>>& members_;
  absl::Mutex mu_;
  std::map<size_t, std::vector<std::unique_ptr<SampleAssembler>>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<WarmProgress> WarmFrameCache(const Source& source, const SampleSpec& spec, DecodedFrameCache* cache,
                                            const WarmOptions& options) {
  if (cache == nullptr) return absl::InvalidArgumentError("warming needs a frame cache (bytes or a directory)");
  if (!HasVideo(spec)) return absl::InvalidArgumentError("the config has no video stream: nothing to warm");
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::vector<BoundMember> bound, source.Bind(spec));
  std::vector<std::unique_ptr<Member>> members;
  std::vector<Item> items;
  for (size_t k = 0; k < source.size(); ++k) {
    auto m = std::make_unique<Member>();
    m->dataset = &source.dataset(k);
    m->bound = std::move(bound[k]);
    if (!HasVideo(m->bound.spec)) continue;
    ASSIGN_OR_RETURN(std::set<uint64_t> quarantined, QuarantinedEpisodes(m->bound.spec, *m->dataset));
    ASSIGN_OR_RETURN(m->index,
                     SampleIndex::Build(*m->dataset, m->bound.spec.anchor_stream, quarantined));
    m->key = FrameCacheDatasetKey(m->dataset->manifest());
    cache->NameDataset(m->key, m->dataset->uri());
    for (uint64_t e = 0; e < m->index.num_episodes(); ++e) {
      if (m->index.EpisodeSamples(e) > 0) items.push_back({members.size(), e});
    }
    members.push_back(std::move(m));
  }
  AssemblerPool assemblers(members);
  absl::Mutex mu;
  WarmProgress total;
  total.episodes = items.size();
  const size_t per_pass = std::max<size_t>(1, options.frames_per_pass);

  RETURN_IF_ERROR(ParallelFor("cache-warm", options.threads, items.size(), [&](size_t i) -> absl::Status {
    const Item& item = items[i];
    const Member& m = *members[item.member];
    std::unique_ptr<SampleAssembler> a = assemblers.Take(item.member);
    WarmProgress mine;
    // The union of the frames the episode's samples need, per spec stream.
    std::map<size_t, FrameRequest> requests;
    std::vector<FrameRequest> needed;
    absl::Status failed;
    const uint64_t first = m.index.EpisodeStart(item.episode);
    for (uint64_t s = first; s < first + m.index.EpisodeSamples(item.episode) && failed.ok(); ++s) {
      failed = a->NeededFrames(s, /*epoch=*/0, &needed);  // every anchor step: no clips
      for (FrameRequest& r : needed) {
        FrameRequest& into = requests[r.spec_stream];
        into.episode = r.episode;
        into.spec_stream = r.spec_stream;
        into.stream = r.stream;
        into.frames.insert(into.frames.end(), r.frames.begin(), r.frames.end());
      }
    }
    std::vector<RgbImage> images;
    for (auto it = requests.begin(); it != requests.end() && failed.ok(); ++it) {
      FrameRequest& r = it->second;
      std::sort(r.frames.begin(), r.frames.end());
      r.frames.erase(std::unique(r.frames.begin(), r.frames.end()), r.frames.end());
      const uint64_t settings = a->DecodeSettingsKey(r.spec_stream);
      mine.frames_needed += r.frames.size();
      FrameRequest pass = r;
      pass.frames.clear();
      auto flush = [&]() -> absl::Status {
        if (pass.frames.empty()) return absl::OkStatus();
        RETURN_IF_ERROR(a->DecodeFrames(pass, &images));
        for (size_t j = 0; j < pass.frames.size(); ++j) {
          mine.bytes_decoded += images[j].pixels.size();
          cache->Insert(FrameCacheKey{m.key, r.episode, r.stream, pass.frames[j], settings},
                        std::make_shared<const RgbImage>(std::move(images[j])));
        }
        mine.frames_decoded += pass.frames.size();
        pass.frames.clear();
        return absl::OkStatus();
      };
      for (int64_t f : r.frames) {
        if (cache->Contains(FrameCacheKey{m.key, r.episode, r.stream, f, settings})) {
          ++mine.frames_present;
          continue;
        }
        pass.frames.push_back(f);
        if (pass.frames.size() >= per_pass) failed = flush();
        if (!failed.ok()) break;
      }
      if (failed.ok()) failed = flush();
    }
    assemblers.Give(item.member, std::move(a));
    absl::MutexLock l(&mu);
    if (!failed.ok()) {
      ++total.episodes_failed;
      spdlog::warn("cache warm: dataset {}, episode {}: {} (skipped)", m.dataset->uri(), item.episode,
                   failed.ToString());
    }
    ++total.episodes_done;
    total.frames_needed += mine.frames_needed;
    total.frames_present += mine.frames_present;
    total.frames_decoded += mine.frames_decoded;
    total.bytes_decoded += mine.bytes_decoded;
    total.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (options.progress) options.progress(total);
    return absl::OkStatus();
  }));
  total.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return total;
}

}  // namespace conveyor
