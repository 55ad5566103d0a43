// `conveyor fetch`: a command-line client for smoke tests and audits. With --digest it prints
// exactly the lines `conveyor batches --digest` prints for the same config, consumer and cursor.
#include <chrono>
#include <cstdio>
#include <thread>

#include <google/protobuf/util/json_util.h>

#include "base/status_macros.h"
#include "base/strings.h"
#include "client/client.h"
#include "client/launch_env.h"
#include "shuffle/order.h"
#include "conveyor/v1/service.pb.h"
#include "storage/storage.h"
#include "tools/batch_line.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {
absl::Status RunFetch(const FetchOptions& o) {
  client::ClientOptions c;
  // The slice and the servers: flags first, then what the launcher set (torchrun, SLURM, ...).
  client::LaunchOverrides lo;
  if (o.consumer >= 0) lo.rank = o.consumer;
  if (o.consumers >= 1) lo.world_size = o.consumers;
  lo.rank_name = "--consumer";
  lo.world_size_name = "--consumers";
  lo.servers = o.servers;
  ASSIGN_OR_RETURN(client::LaunchEnv launch, client::ResolveLaunch(lo));
  c.servers = launch.servers;
  if (o.steps < 0) return absl::InvalidArgumentError("--steps must be >= 0 (0: to the end of the stream)");
  c.job = o.job;
  c.consumer = launch.rank;
  c.consumers = launch.world_size;
  ASSIGN_OR_RETURN(c.start, client::Cursor::Parse(o.cursor));
  // 0 to 3 (docs/pipeline.md "Schedule versions"); a server that does not know a version says so.
  if (o.schedule_version < 0 || o.schedule_version > static_cast<int>(kScheduleVersionCurrent)) {
    return absl::InvalidArgumentError(StrCat("--schedule-version ", o.schedule_version, ": expected 1 to ",
                                             kScheduleVersionCurrent));
  }
  c.schedule_version = static_cast<uint32_t>(o.schedule_version);
  c.max_batches = static_cast<uint64_t>(o.steps);
  if (!o.config.empty()) {
    ASSIGN_OR_RETURN(c.config_yaml, ReadLocalFile(o.config, "config"));
  }
  c.config_name = o.config_name;
  if (!o.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(c.auth_token, ReadTokenFile(o.auth_token_file));
  }
  c.tls = o.tls || !o.tls_ca.empty() || !o.tls_cert.empty();
  if (!o.tls_ca.empty()) {
    ASSIGN_OR_RETURN(c.tls_ca_pem, ReadLocalFile(o.tls_ca, "TLS CA"));
  }
  if (!o.tls_cert.empty()) {
    ASSIGN_OR_RETURN(c.tls_cert_pem, ReadLocalFile(o.tls_cert, "TLS certificate"));
  }
  if (!o.tls_key.empty()) {
    ASSIGN_OR_RETURN(c.tls_key_pem, ReadLocalFile(o.tls_key, "TLS key"));
  }
  c.tls_server_name = o.tls_server_name;
  c.prefetch_batches = static_cast<size_t>(std::max<int64_t>(1, o.prefetch));
  c.max_message_bytes = o.max_message_bytes;
  c.shared_memory = o.shared_memory;
  c.shared_memory_bytes = o.shared_memory_bytes;
  c.payload_streams = o.payload_streams;
  c.reconnect_timeout_s = o.reconnect_timeout;

  if (o.info) {
    ASSIGN_OR_RETURN(conveyor::v1::InfoResponse info, client::GetInfo(c));
    std::string json;
    google::protobuf::util::JsonPrintOptions jo;
    jo.add_whitespace = true;
    jo.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(info, &json, jo);
    std::printf("%s", json.c_str());
    return absl::OkStatus();
  }

  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client, client::Client::Create(c));
  int64_t n = 0;
  uint64_t samples = 0;
  for (;;) {
    absl::StatusOr<std::optional<client::Batch>> next = client->Next();
    if (!next.ok()) {
      const uint32_t v = client->schedule_version();
      return Annotate(next.status(), StrCat("after ", n, " batches; resume with --cursor ",
                                            client->cursor().ToString(),
                                            v > 0 ? StrCat(" --schedule-version ", v) : std::string()));
    }
    if (!next->has_value()) break;  // the end of the stream
    const client::Batch* b = &**next;
    std::vector<LineTensor> tensors;
    for (const client::TensorView& t : b->tensors) {
      tensors.push_back({&t, t.data, t.bytes});
    }
    std::vector<LineSample> ids;
    for (const client::SampleId& id : b->ids) ids.push_back({id.index, id.episode, id.step, id.dataset});
    ASSIGN_OR_RETURN(std::string line, BatchLine(b->cursor.epoch, b->cursor.step, b->consumer,
                                                 b->consumers, ids, tensors, o.digest, o.ids));
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    samples += b->ids.size();
    ++n;
    if (o.step_seconds > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(o.step_seconds));
    }
    if (o.stall_after >= 0 && n == o.stall_after) {
      std::fprintf(stderr, "conveyor fetch: stalling for %.1f s\n", o.stall_seconds);
      std::this_thread::sleep_for(std::chrono::duration<double>(o.stall_seconds));
    }
  }
  if (o.stats) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const client::ClientStats st = client->stats();
    std::fprintf(stderr,
                 "fetch: %lld batches, %llu samples in %.2f s = %.1f samples/s, %.1f MB/s; %llu "
                 "messages, %llu reconnects, waited %.2f s, %llu wait reports; next cursor %s "
                 "(schedule version %u); transport %s (%llu batches through shared memory)%s%s\n",
                 static_cast<long long>(n), static_cast<unsigned long long>(samples), s,
                 samples / std::max(s, 1e-9), st.bytes / 1e6 / std::max(s, 1e-9),
                 static_cast<unsigned long long>(st.messages),
                 static_cast<unsigned long long>(st.reconnects), st.wait_seconds,
                 static_cast<unsigned long long>(st.reports), client->cursor().ToString().c_str(),
                 client->schedule_version(), st.transport.c_str(),
                 static_cast<unsigned long long>(st.shared_memory_batches),
                 st.shared_memory_refused.empty() ? "" : "; shared memory refused: ",
                 st.shared_memory_refused.c_str());
  }
  return absl::OkStatus();
}


// `conveyor fetch`: its flags and its run (tools/command.h).
class FetchCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("fetch", "Stream batches from data servers (smoke tests, audits; --digest equals `conveyor batches --digest`)");
    c->add_option("--servers", o_.servers, "HOST:PORT[,HOST:PORT...] (default: $CONVEYOR_SERVERS); fails over in turn");
    c->add_option("--job", o_.job, "Job name (metrics, logs)")->capture_default_str();
    c->add_option("--consumer", o_.consumer, "This consumer's index (default: the launcher's rank, RANK or SLURM_PROCID ..., else 0; docs/launch.md)")->check(CLI::NonNegativeNumber);
    c->add_option("--consumers", o_.consumers, "Number of consumers (default: the launcher's world size, WORLD_SIZE or SLURM_STEP_NUM_TASKS ..., else 1)")->check(CLI::PositiveNumber);
    c->add_option("--cursor", o_.cursor, "Start at EPOCH:STEP, or EPOCH@POSITION (a sample position: any batch size)")
        ->capture_default_str();
    c->add_option("--schedule-version", o_.schedule_version,
                  "The order's schedule version to resume (what --stats printed with the cursor; 0: the config's)");
    c->add_option("--steps", o_.steps, "Batches to stream (0: to the end of the stream)")->capture_default_str()->check(CLI::NonNegativeNumber);
    c->add_flag("--digest", o_.digest, "Print the SHA-256 of each batch's tensors");
    c->add_flag("--ids", o_.ids, "Print every sample id (episode/step)");
    c->add_flag("--stats", o_.stats, "Print throughput, reconnects and waiting time at the end");
    auto* config = c->add_option("--config", o_.config, "Send this config (YAML) instead of using one of the server's");
    c->add_option("--config-name", o_.config_name, "Use the server's config of this name (default: its first)")->excludes(config);
    c->add_option("--auth-token-file", o_.auth_token_file, "File holding the bearer token");
    c->add_flag("--tls", o_.tls, "Use TLS with the system's roots");
    c->add_option("--tls-ca", o_.tls_ca, "Verify the server with these roots (PEM); implies --tls");
    c->add_option("--tls-cert", o_.tls_cert, "Client certificate (PEM); implies --tls");
    c->add_option("--tls-key", o_.tls_key, "Client key (PEM)");
    c->add_option("--tls-server-name", o_.tls_server_name, "Name to check in the server's certificate");
    c->add_option("--prefetch", o_.prefetch, "Batches received ahead")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--max-message-bytes", o_.max_message_bytes, "Ask for messages of at most this size (0: the server's)")->transform(CLI::AsSizeValue(true));
    c->add_option("--shared-memory", o_.shared_memory,
                  "Take a shared region from a server on this host, in which it builds the batches (docs/serving.md)")
        ->capture_default_str();
    c->add_option("--shared-memory-bytes", o_.shared_memory_bytes,
                  "The most bytes of that region's ring; a batch larger than the ring travels in messages")->transform(CLI::AsSizeValue(true))
        ->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--payload-streams", o_.payload_streams,
                  "Above 1: payload messages over this many more streams, each on its own connection "
                  "(at most 8; not with shared memory; docs/serving.md \"Striped payloads\")")
        ->capture_default_str()->check(CLI::Range(1, 8));
    c->add_option("--reconnect-timeout", o_.reconnect_timeout, "Give up after this many seconds without a batch")->capture_default_str();
    c->add_option("--stall-after", o_.stall_after, "Testing: stop reading after this many batches...");
    c->add_option("--stall-seconds", o_.stall_seconds, "...for this long");
    c->add_option("--step-seconds", o_.step_seconds, "Sleep this long after each batch, as a trainer's step would (the client reports its data wait against it)")->check(CLI::NonNegativeNumber);
    c->add_flag("--info", o_.info, "Print the server's dataset and configs (JSON) and exit");
    return c;
  }
  absl::Status Run() override {
    return RunFetch(o_);
  }

 private:
  FetchOptions o_;
};

std::unique_ptr<Command> NewFetchCommand() {
  return std::make_unique<FetchCommand>();
}

}  // namespace conveyor::tools
