// The state of a Pipeline (pipeline/pipeline.h), shared by the files that implement it by job:
// pipeline.cc (creation, the workers, Next), pipeline_plan.cc (the walk through the global
// positions: tasks, epoch orders planned ahead, the start cursor), window_prefetch.cc (a GOP
// window's frames decoded once per block, the decoded-frame cache). Not a public header: only
// those files include it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/worker_pool.h"
#include "pipeline/pipeline.h"
#include "shuffle/mixture.h"

namespace conveyor {

using PipelineClock = std::chrono::steady_clock;
inline double Seconds(PipelineClock::time_point a, PipelineClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Pipeline::Impl {
  // Where a sample sits in its member's own sequence: member counter c -> (member epoch, position).
  struct WindowKey {
    uint32_t member = 0;
    uint64_t epoch = 0;  // the member's epoch
    uint64_t w = 0;
    auto operator<=>(const WindowKey&) const = default;
  };
  struct Task {
    bool prefetch = false;
    uint64_t seq = 0;        // sample tasks: output order
    uint32_t member = 0;
    uint64_t member_epoch = 0;
    uint64_t counter = 0;    // the member's sample counter (sorting within a step)
    WindowKey window;        // the window whose frames it needs or fills
    uint64_t sample = 0;
    std::vector<uint64_t> block_samples;  // prefetch: this consumer's samples of one block
  };
  struct Window {
    int prefetch_left = 0;
    uint64_t samples_left = 0;
    uint64_t bytes = 0;
    std::unordered_map<uint64_t, std::shared_ptr<const RgbImage>> frames;
  };
  struct Result {
    absl::StatusOr<Sample> sample;
    uint64_t bytes = 0;
  };
  // The frames of one member's windows, as its assemblers look them up.
  struct MemberPrefetch : public WindowPrefetch {
    const Impl* impl = nullptr;
    uint32_t member = 0;
    std::shared_ptr<const RgbImage> Find(uint64_t episode, int stream, int64_t frame) const override;
  };
  struct Member {
    const Dataset* dataset = nullptr;
    BoundMember bound;
    SampleIndex index;
    OrderOptions order;
    uint64_t key = 0;
    std::string frame_cache_key;  // FrameCacheDatasetKey (empty without a frame cache)
    uint64_t epoch_len = 0;  // samples of one of its epochs in the sequence it feeds
    bool scheduled = false;
    MemberPrefetch prefetch;
    std::map<uint64_t, std::unique_ptr<EpochOrder>> orders;  // by member epoch; Impl::mu (OrderFor)
  };
  // This consumer's walk through the global positions, one global batch at a time: the batch
  // starts at sample position `pos` of epoch `epoch` (step = pos / batch).
  struct Walker {
    uint64_t epoch = 0, step = 0, pos = 0, seq = 0;
    MixtureSchedule::Step plan;
    std::vector<uint64_t> base;  // each member's counter at the start of this step
  };

  std::unique_ptr<Source> owned_source;
  const Source& source;
  SampleSpec spec;
  PipelineOptions opt;
  BatchBuffers batch_buffers;  // Next() only: where batches are built (null: HostBuffers)
  std::vector<SharedStream> layout;
  std::vector<std::unique_ptr<Member>> members;
  std::optional<MixtureSchedule> schedule;
  uint64_t n = 0, batch = 0, local = 0, steps = 0;
  uint64_t max_inflight = 0;
  // Where this pipeline's first batch starts: sample position start_pos of epoch start_epoch (the
  // start cursor normalized: a position with no whole batch left in its epoch is the next epoch's
  // 0), and how many batches its first epoch has from there.
  uint64_t start_epoch = 0, start_pos = 0, first_epoch_steps = 0;
  PipelineClock::time_point created = PipelineClock::now();

  // Everything below that workers and the consumer share is guarded by `mu` (checked by clang's
  // -Wthread-safety in ./run test); the fields above are set before the workers start.
  mutable absl::Mutex mu;
  absl::CondVar work_cv;    // workers: a task or budget became available
  absl::CondVar result_cv;  // Next(): a result arrived
  absl::CondVar window_cv;  // sample tasks: a window's frames are ready
  absl::CondVar plan_cv;    // the planner: an epoch order to build
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  absl::Status fatal ABSL_GUARDED_BY(mu);  // a worker failed outside any one sample: the pipeline is over
  Walker gen ABSL_GUARDED_BY(mu);          // the next global batch to turn into tasks
  bool gen_done ABSL_GUARDED_BY(mu) = false;
  std::deque<Task> pending ABSL_GUARDED_BY(mu);
  // Epoch orders to build ahead, off the lock (PlanAhead): queued, and queued or being built.
  std::deque<std::pair<uint32_t, uint64_t>> plans ABSL_GUARDED_BY(mu);  // (member, member epoch)
  std::set<std::pair<uint32_t, uint64_t>> planning ABSL_GUARDED_BY(mu);
  std::map<WindowKey, Window> windows ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Result> results ABSL_GUARDED_BY(mu);  // by seq
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;                // the next sample Next() hands out
  uint64_t results_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t prefetch_bytes ABSL_GUARDED_BY(mu) = 0;
  PipelineStats stats ABSL_GUARDED_BY(mu);
  std::vector<AssemblerStats> worker_stats ABSL_GUARDED_BY(mu);
  // The workers (base/worker_pool.h): its flag is the cancellation of their blocking reads.
  std::unique_ptr<WorkerPool> pool;
  // One thread that builds epoch orders ahead (PlanAhead); null when no member has GOP blocks.
  std::unique_ptr<WorkerPool> planner;

  Impl(const Source& src, SampleSpec s, PipelineOptions o)
      : source(src), spec(std::move(s)), opt(std::move(o)) {}
  ~Impl() { Stop(); }

  // Create's setup (Pipeline::Prepare, before any thread starts): member k of the source, its
  // sample index (quarantined episodes left out, counted and logged by CountQuarantine) and its
  // order; then where the first batch starts (the start cursor checked against the epoch).
  absl::Status AddMember(size_t k, BoundMember bound);
  absl::Status CountQuarantine(const Member& mem, const std::set<uint64_t>& quarantined);
  absl::Status PlaceStart(const Cursor& start);

  // Wakes every waiter; the workers' blocking reads give up (mu held).
  void CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Stop();

  static uint64_t FrameKey(uint64_t episode, int stream, int64_t frame) {
    return (episode << 24) ^ (static_cast<uint64_t>(stream) << 56) ^ static_cast<uint64_t>(frame);
  }

  // Member m's order of `epoch`, built here when the planner did not build it first (mu held:
  // every worker and the consumer wait meanwhile, so only a pipeline's first epoch should come
  // this way; later ones are planned ahead, PlanAhead). An order costs O(blocks) to build: about 0.2 s for 300,000 GOP
  // blocks, 1 s for 3 million (a large LeRobot dataset with GOP 2).
  const EpochOrder& OrderFor(Member& m, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Keeps the three latest epochs' orders of a member: the walker never needs an older one (its
  // member counters only grow, and the planner is never more than one epoch past them).
  std::map<uint64_t, std::unique_ptr<EpochOrder>>::iterator KeepOrder(
      Member& m, uint64_t epoch, std::unique_ptr<EpochOrder> order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // No epoch-boundary gap (issue 30 item 3): when the walker enters a member's epoch, the order
  // of its next epoch is queued for the planner thread to build without the lock, long before the
  // walker needs it; the walker waits for a plan in flight rather than building it again
  // (Generate). A thread of its own rather than a worker's task: at one worker thread, a worker
  // building a large order would stop decoding for as long (0.25 s per million blocks here).
  void PlanAhead(uint32_t k, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The planner thread: builds each queued order (no lock held while it is built) and hands it
  // to the walker.
  void Planner();

  // A mixture's positions are whole batches (Create checks), so (epoch, step) places it; a single
  // dataset's member counter is epoch * n + position, at any position.
  Walker WalkerAt(uint64_t epoch, uint64_t pos) const;

  // The next global batch: `batch` positions on, or the next epoch's first when fewer than
  // `batch` positions are left (the epoch's remainder is dropped).
  void NextStep(Walker* w) const;

  // The cursor of this pipeline's k-th batch (k = 0: the first), with its position.
  Cursor CursorOfBatch(uint64_t k) const;

  // The member and member counter of this consumer's j-th position in the walker's step.
  std::pair<uint32_t, uint64_t> PositionOf(const Walker& w, uint64_t j) const;

  // Registers member k's window `key` and queues the prefetch of the frames this consumer's
  // samples of it need (mu held). Walks ahead from the current step to find those samples; the
  // walk stops once the member's counter passes the window's end.
  void RegisterWindow(const WindowKey& key, const EpochOrder& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Turns this consumer's slice of the next global batch into tasks (mu held), each member's
  // samples in the order of its own sequence, so that its windows come in order; a window's
  // prefetch goes before its first sample.
  // False when the step needs an epoch order that the planner is still building (nothing
  // generated: wait for it).
  bool Generate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // At most two windows of a member hold frames: the one being assembled and the next.
  bool PrefetchMayStart(const Task& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The first prefetch task after the front, generating up to kLookaheadSteps steps ahead to find
  // one, taken when it may start.
  bool TakeLaterPrefetch(Task* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Blocks until a task may run (mu held; released while it waits). False when cancelled or done.
  bool TakeTask(Task* out, double* idle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A worker never lets an exception escape (it would terminate the process and every other
  // stream with it): a throw while assembling a sample becomes that sample's error; anything
  // else ends this pipeline with `fatal`, which Next() returns.
  // Runs under the pool's CancelScope: Cancel() aborts this worker's storage reads in flight.
  void Worker(size_t id);

  void Fail(absl::Status s);

  absl::StatusOr<Sample> AssembleNoThrow(SampleAssembler& assembler, const Task& task) const;

  // A block task's frames, decoded once or taken from the decoded-frame cache.
  struct DecodedBlock {
    std::vector<std::pair<uint64_t, std::shared_ptr<const RgbImage>>> frames;  // by FrameKey
    uint64_t from_cache = 0;         // frames the decoded-frame cache had
    uint64_t decoded_for_cache = 0;  // frames decoded and offered to it
    bool all_cached = true;          // no frame of the block was decoded
    bool empty = true;               // the block's samples need no frame
  };

  // Decodes the union of the frames a block's samples need, per (episode, stream), in one pass
  // each; frames the decoded-frame cache holds are not decoded. No lock held: a sample whose
  // frames fail here reports the error when it is assembled.
  DecodedBlock DecodeBlock(SampleAssembler& assembler, const Task& task,
                           std::vector<FrameRequest>* needed, std::vector<RgbImage>* images);

  // Decodes the frames the cache will keep into its pre-faulted buffers when it has them
  // (DecodedFrameCache::Prefault), so that keeping them costs this worker no page faults.
  void LendPrefaultedBuffers(uint32_t member, const FrameRequest& r, std::vector<RgbImage>* images) const;

  // Puts a decoded block's frames into its window's prefetch, counts them, and wakes the window's
  // sample tasks when it was the window's last block.
  void AddToWindow(const Task& task, DecodedBlock* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void WorkerLoop(size_t id);

  FrameCacheKey CacheKey(uint32_t member, const SampleAssembler& assembler, const FrameRequest& r,
                         int64_t frame) const;

  // All of `r`'s frames from the decoded-frame cache, appended to `out`; false (and nothing
  // appended) when any is missing: the decoder has to run from the keyframe anyway, and then
  // delivers them all.
  bool TakeCachedFrames(uint32_t member, const SampleAssembler& assembler, const FrameRequest& r,
                        std::vector<std::pair<uint64_t, std::shared_ptr<const RgbImage>>>* out) const;

  // The consumer takes epoch `last.epoch`'s last batch: is the next epoch's first batch (sequence
  // numbers from `next_seq`) already planned, and how much of it is assembled (stats()).
  void CountBoundary(Cursor last, uint64_t next_seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Hands a worker's counters to stats().
  void Publish(size_t id, const std::vector<std::unique_ptr<SampleAssembler>>& assemblers,
               double* idle, double* decode, double* assemble, double* slot_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace conveyor
