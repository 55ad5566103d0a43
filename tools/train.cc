// `conveyor train`: the reference trainer (trainer/trainer.h, docs/trainer.md). One process per
// rank; ranks meet through --rendezvous; rank and world size default to the launcher's
// (client/launch_env.h: torchrun, Open MPI, SLURM).
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "base/status_macros.h"
#include "base/strings.h"
#include "client/launch_env.h"
#include "storage/storage.h"
#include "tools/command.h"
#include "tools/commands.h"
#include "trainer/trainer.h"

namespace conveyor::tools {
absl::Status RunTrain(const TrainCliOptions& o) {
  trainer::TrainOptions t;
  // Rank, world size and servers: flags first, then what the launcher set (client/launch_env.h).
  client::LaunchOverrides lo;
  if (o.rank >= 0) lo.rank = o.rank;
  if (o.world_size >= 1) lo.world_size = o.world_size;
  lo.rank_name = "--rank";
  lo.world_size_name = "--world-size";
  lo.servers = o.servers;
  ASSIGN_OR_RETURN(client::LaunchEnv launch, client::ResolveLaunch(lo));
  t.client.servers = launch.servers;
  t.client.job = o.job;
  t.client.consumer = launch.rank;
  t.client.consumers = launch.world_size;
  ASSIGN_OR_RETURN(t.client.start, client::Cursor::Parse(o.cursor));
  t.client.config_name = o.config_name;
  if (!o.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(t.client.auth_token, ReadTokenFile(o.auth_token_file));
  }
  if (!o.tls_ca.empty()) {
    t.client.tls = true;
    ASSIGN_OR_RETURN(t.client.tls_ca_pem, ReadLocalFile(o.tls_ca, "TLS CA"));
  }
  t.client.tls_server_name = o.tls_server_name;
  if (!o.config.empty()) {
    ASSIGN_OR_RETURN(t.config_yaml, ReadLocalFile(o.config, "config"));
  }
  t.steps = o.steps;
  t.lr = o.lr;
  t.shift_frames_steps = o.shift_frames;
  t.comm = o.comm;
  t.rendezvous = o.rendezvous;
  t.comm_host = o.comm_host;
  t.device = o.device;
  t.quiet = o.quiet;
  t.step_ms = o.step_ms;
  t.checkpoint = o.checkpoint;
  t.checkpoint_every = o.checkpoint_every;
  t.allow_data_change = o.allow_data_change;
  ASSIGN_OR_RETURN(trainer::TrainResult r, trainer::Train(t));
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << trainer::ResultJson(r);
    if (!f) return absl::InternalError(StrCat("cannot write ", o.json));
  }
  if (!o.quiet) {
    const double step = std::max(r.total.mean, 1e-12);
    if (r.resumed_at_step >= 0) {
      std::fprintf(stderr, "\ntrain: rank %d resumed at step %lld (cursor %s)", r.rank,
                   static_cast<long long>(r.resumed_at_step), r.resumed_cursor.c_str());
    }
    std::fprintf(stderr, "\ntrain: rank %d of %d, %zu steps, comm %s, %lld features -> %lld outputs\n",
                 r.rank, r.world_size, r.steps.size(), r.comm.c_str(),
                 static_cast<long long>(r.features), static_cast<long long>(r.outputs));
    std::fprintf(stderr, "  %-22s %10s %10s %10s %8s\n", "part", "mean ms", "p50 ms", "p99 ms", "share");
    auto row = [&](const char* name, const trainer::PartSummary& p) {
      std::fprintf(stderr, "  %-22s %10.2f %10.2f %10.2f %7.1f%%\n", name, p.mean * 1e3, p.p50 * 1e3,
                   p.p99 * 1e3, 100 * p.mean / step);
    };
    row("waiting for data", r.wait);
    row("host-to-device copy", r.h2d);
    row("compute", r.compute);
    row("communication", r.comm_time);
    row("step", r.total);
    std::fprintf(stderr, "  %.1f samples/s on this rank; %.1f%% of step time waiting for data\n",
                 r.samples_per_s, 100 * r.wait_share);
    std::fprintf(stderr, "  loss over the last quarter: %.5f; predicting the mean action: %.5f (ratio %.3f)\n",
                 r.final_loss, r.mean_action_loss,
                 r.mean_action_loss > 0 ? r.final_loss / r.mean_action_loss : 0);
    std::fprintf(stderr, "  first action of the chunk: %.5f; the mean action: %.5f (ratio %.3f)\n",
                 r.first_step_loss, r.first_step_mean_loss,
                 r.first_step_mean_loss > 0 ? r.first_step_loss / r.first_step_mean_loss : 0);
  }
  return absl::OkStatus();
}


// `conveyor train`: its flags and its run (tools/command.h).
class TrainCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("train", "The reference trainer: one rank of a data-parallel run, with step-time attribution (docs/trainer.md)");
    c->add_option("--servers", o_.servers, "HOST:PORT[,...] (default: $CONVEYOR_SERVERS)");
    c->add_option("--job", o_.job, "Job name")->capture_default_str();
    c->add_option("--rank", o_.rank, "This rank (default: the launcher's, RANK or SLURM_PROCID ..., else 0; docs/launch.md)");
    c->add_option("--world-size", o_.world_size, "Ranks (default: the launcher's, WORLD_SIZE or SLURM_STEP_NUM_TASKS ..., else 1)");
    c->add_option("--cursor", o_.cursor, "Start at EPOCH:STEP, or EPOCH@POSITION (a sample position: any batch size)")
        ->capture_default_str();
    auto* config = c->add_option("--config", o_.config, "Config (YAML) to send");
    c->add_option("--config-name", o_.config_name, "The server's config of this name")->excludes(config);
    c->add_option("--auth-token-file", o_.auth_token_file, "Bearer token file");
    c->add_option("--tls-ca", o_.tls_ca, "Use TLS and verify the servers with these roots (PEM)");
    c->add_option("--tls-server-name", o_.tls_server_name, "Name to check in the servers' certificate");
    c->add_option("--steps", o_.steps, "Training steps")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--lr", o_.lr, "Adam learning rate")->capture_default_str();
    c->add_option("--shift-frames", o_.shift_frames, "Deliberately shift the cameras by this many anchor steps (misalignment check)");
    c->add_option("--comm", o_.comm, "auto, gloo, nccl or none")->capture_default_str();
    c->add_option("--rendezvous", o_.rendezvous, "Directory every rank sees (gloo, nccl)");
    c->add_option("--comm-host", o_.comm_host, "gloo: address to listen on (default: the hostname)");
    c->add_flag("--device", o_.device, "Deliver batches to the GPU (CUDA builds)");
    c->add_option("--json", o_.json, "Write per-step times and the summary as JSON");
    c->add_flag("--quiet", o_.quiet, "No progress output");
    c->add_option("--step-ms", o_.step_ms, "Pad each step's compute to at least this many ms (a stand-in for a real model; sleeps)")
        ->capture_default_str()->check(CLI::Range(0.0, 600000.0));
    c->add_option("--checkpoint", o_.checkpoint, "Training state file: resumed from when it exists (its cursor overrides --cursor); rank 0 rewrites it atomically");
    c->add_option("--checkpoint-every", o_.checkpoint_every, "Steps between checkpoints (and one at the end)")
        ->capture_default_str()->check(CLI::PositiveNumber);
    c->add_flag("--allow-data-change", o_.allow_data_change,
                "Resume the checkpoint although the server serves other data than it was taken on "
                "(its dataset fingerprint or order digest); the cursor's position is read in the new order");
    return c;
  }
  absl::Status Run() override {
    return RunTrain(o_);
  }

 private:
  TrainCliOptions o_;
};

std::unique_ptr<Command> NewTrainCommand() {
  return std::make_unique<TrainCommand>();
}

}  // namespace conveyor::tools
