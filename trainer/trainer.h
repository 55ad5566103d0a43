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
};

struct StepTimes {
  double wait = 0, h2d = 0, compute = 0, comm = 0, total = 0;
  double loss = 0;
  uint64_t samples = 0;
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
};

absl::StatusOr<TrainResult> Train(const TrainOptions& options);

// Rewrites a sample spec so that every camera (video or image stream, by the server's Info) is
// sampled `shift_s` seconds later relative to the anchor.
absl::StatusOr<std::string> ShiftCameras(const std::string& yaml, const std::vector<std::string>& cameras,
                                         double shift_s);

std::string ResultJson(const TrainResult& r);

}  // namespace conveyor::trainer
