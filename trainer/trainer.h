// The reference trainer (`conveyor train`): each rank embeds the C++ client, trains a small
// policy (pooled patches of every camera frame plus the state -> the action chunk) with MSE, and
// averages gradients across ranks (gloo on CPU, NCCL on GPUs). Every step is attributed: waiting
// for data, host-to-device copy, compute, communication. See docs/trainer.md.
//
// The point is not the model but the proof: on a `conveyor synth` dataset, whose actions are a
// documented function of the state and the cameras' colours (docs/format.md), the loss falls far
// below that of predicting the mean action only if frames, state and actions arrive aligned;
// `shift_frames_steps` deliberately shifts the cameras in time and the loss stays higher.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace conveyor::trainer {

struct TrainOptions {
  client::ClientOptions client;   // servers, job, consumer = rank, consumers = world size, ...
  // Resume a checkpoint on data other than it was taken on (a grown dataset, a changed
  // augmentation): the cursor's position is then read in the new order (docs/trainer.md).
  bool allow_data_change = false;
  std::string config_yaml;        // sent inline; empty: the server's config (config_name)
  int64_t steps = 200;
  double lr = 3e-3;
  int pool = 2;                   // each frame pooled to pool x pool patches per channel
  std::string action = "action";  // the target tensor
  int64_t shift_frames_steps = 0; // move camera timestamps by this many anchor steps
  std::string comm = "auto";      // auto, gloo, nccl, none
  std::string rendezvous;         // directory every rank sees (gloo, nccl)
  std::string comm_host;          // gloo: address to listen on (empty: hostname)
  double comm_timeout_s = 120;
  bool device = false;            // deliver batches to the GPU (CUDA builds)
  int print_every = 10;
  bool quiet = false;
  // A stand-in for a real model's step: each step's compute is padded (by sleeping, so the data
  // servers keep their cores) to at least this long. 0: the small policy's own cost only.
  double step_ms = 0;
  // The training state (weights, Adam moments, steps done, the global cursor of the next batch)
  // in one file. When it exists at start, training resumes from it: at its step, with its
  // weights, at its cursor (which overrides client.start), with any world size and any global
  // batch size (the cursor names a sample position: docs/trainer.md). Rank 0 rewrites it atomically every `checkpoint_every` steps and at the end.
  std::string checkpoint;
  int64_t checkpoint_every = 10;
};

struct StepTimes {
  int64_t step = 0;               // of the whole run (a resumed run starts at its checkpoint's)
  double wait = 0, h2d = 0, compute = 0, comm = 0, total = 0;
  double loss = 0;
  uint64_t samples = 0;
  std::string cursor;             // the batch's place in the global order, EPOCH@POSITION
  std::vector<std::string> ids;   // this rank's samples, in batch order (EPISODE/STEP)
};

struct PartSummary {
  double mean = 0, p50 = 0, p99 = 0;
};

struct TrainResult {
  int rank = 0, world_size = 1;
  std::string comm;
  std::vector<StepTimes> steps;
  PartSummary wait, h2d, compute, comm_time, total;
  double samples_per_s = 0;       // this rank
  double wait_share = 0;          // of step time
  double final_loss = 0;          // mean over the last quarter of steps, all ranks
  double mean_action_loss = 0;    // predicting the running mean action on those batches
  // The same for the chunk's first action only: on synthetic data it is an exact linear function
  // of the state and the cameras' mean colours at the anchor time, so it is what shows alignment.
  double first_step_loss = 0, first_step_mean_loss = 0;
  int64_t features = 0, outputs = 0;
  std::string weights_fnv1a;      // of the final weights: equal on every rank when gradients are averaged
  std::string config_sent;        // what was sent to the server (after any shift)
  int64_t resumed_at_step = -1;   // from the checkpoint; -1: started fresh
  std::string resumed_cursor;
  std::vector<client::CoverageSlice> coverage;  // what this rank received (client::Client::coverage)
};

// The training state a checkpoint holds (trainer.cc writes and reads it; public for tests).
struct TrainState {
  int64_t step = 0;               // steps done
  std::string cursor = "0:0";     // the global cursor of the next batch (EPOCH@POSITION or EPOCH:STEP)
  int64_t in = 0, out = 0;        // the linear policy's shape
  int64_t adam_t = 0;
  std::vector<float> w, m, v;     // each in * out
  uint32_t schedule_version = 0;  // the order's (client::Client::schedule_version); 0: unknown
  // The global batch size the cursor was recorded at (client::Client::global_batch_size); 0:
  // unknown (older checkpoints). With an EPOCH:STEP cursor, resuming converts it to the sample
  // position step x this, so a checkpoint resumes at another batch size.
  uint64_t global_batch_size = 0;
  // What the run trained on (client::ClientStats): a resume against other data is refused
  // (ClientOptions::expect_*) unless TrainOptions::allow_data_change. Empty in older checkpoints.
  std::string dataset_fingerprint;
  std::string order_digest;
};

// Writes `state` to `path` atomically (a temporary file beside it, fsync, rename), so a reader
// sees the old checkpoint or the new one, never a torn one.
absl::Status WriteCheckpoint(const std::string& path, const TrainState& state);
// NOT_FOUND when `path` does not exist; DATA_LOSS naming the file when it is torn, truncated or
// not a checkpoint.
absl::StatusOr<TrainState> ReadCheckpoint(const std::string& path);

absl::StatusOr<TrainResult> Train(const TrainOptions& options);

// Rewrites a sample spec so that every camera (video or image stream, by the server's Info) is
// sampled `shift_s` seconds later relative to the anchor.
absl::StatusOr<std::string> ShiftCameras(const std::string& yaml, const std::vector<std::string>& cameras,
                                         double shift_s);

std::string ResultJson(const TrainResult& r);

}  // namespace conveyor::trainer
