// `conveyor serve`: runs the data server until SIGTERM, SIGINT or SIGHUP, then drains (docs/serving.md).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <grp.h>
#include <pwd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/status_macros.h"
#include "base/strings.h"
#include "server/server.h"
#include "storage/storage.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {

namespace {

// A user or group named by name or number (--allow-uid, --allow-group).
absl::StatusOr<uint32_t> ResolveId(const std::string& what, const std::string& flag, bool group) {
  char* end = nullptr;
  const unsigned long n = std::strtoul(what.c_str(), &end, 10);
  if (!what.empty() && *end == '\0') return static_cast<uint32_t>(n);
  if (group) {
    if (const struct group* g = getgrnam(what.c_str())) return static_cast<uint32_t>(g->gr_gid);
  } else if (const passwd* p = getpwnam(what.c_str())) {
    return static_cast<uint32_t>(p->pw_uid);
  }
  return absl::InvalidArgumentError(StrCat(flag, " ", what, ": no such ", group ? "group" : "user", " on this host"));
}

// Who the banner says may connect.
std::string Protection(const ServeOptions& o) {
  if (!o.tls_cert.empty()) return o.tls_client_ca.empty() ? "TLS, bearer token" : "TLS, client certificates";
  if (!o.auth_token_file.empty()) return o.plaintext_token ? "bearer token WITHOUT TLS" : "bearer token";
  if (o.loopback_open) return "loopback, OPEN TO EVERY LOCAL USER";
  if (o.listen.rfind("unix:", 0) == 0) {
    return o.allow_groups.empty() ? "unix socket, its owner only" : "unix socket, its owner and group";
  }
  return o.allow_users.empty() && o.allow_groups.empty() ? "loopback, this user only"
                                                         : "loopback, this user and those allowed";
}

}  // namespace

absl::Status RunServe(const ServeOptions& o) {
  // Signals are taken by sigwait below; block them before any server thread starts so that
  // every thread inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // A hang-up (the launching terminal or ssh session closed) drains as SIGTERM does, rather than
  // killing the server with its streams mid-batch.
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  // Logs go to stderr, so stdout stays free for whoever runs the server.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("conveyor-serve"));
  ServerOptions so;
  so.dataset = o.dataset;
  so.config_paths = o.configs;
  so.listen = o.listen;
  so.metrics_listen = o.metrics_listen;
  so.auth_token_file = o.auth_token_file;
  so.tls_cert_file = o.tls_cert;
  so.tls_key_file = o.tls_key;
  so.tls_client_ca_file = o.tls_client_ca;
  for (const std::string& u : o.allow_users) {
    ASSIGN_OR_RETURN(const uint32_t uid, ResolveId(u, "--allow-uid", false));
    so.allow_uids.push_back(uid);
  }
  for (const std::string& g : o.allow_groups) {
    ASSIGN_OR_RETURN(const uint32_t gid, ResolveId(g, "--allow-group", true));
    so.allow_gids.push_back(gid);
  }
  so.loopback_open = o.loopback_open;
  so.plaintext_token = o.plaintext_token;
  so.job_idle_seconds = o.job_idle_seconds;
  so.threads = o.threads;
  so.cpu_slots = o.cpu_slots;
  so.queue_bytes = o.queue_bytes;
  ApplyFrameCache(o.frame_cache, &so);
  so.frame_cache_warm_threads = o.frame_cache_warm_threads;
  so.frame_cache_prefault = o.frame_cache.prefault;
  so.max_message_bytes = o.max_message_bytes;
  so.shared_memory = o.shared_memory;
  so.max_streams = o.max_streams;
  so.stream_progress_timeout_seconds = o.stream_progress_timeout_seconds;
  so.version = o.version;
  so.limits = o.limits;
  ASSIGN_OR_RETURN(std::unique_ptr<DataServer> server, DataServer::Start(so));
  std::fprintf(stderr, "conveyor serve: serving %s on %s%s%s (%s)\n", RedactUri(o.dataset).c_str(),
               server->address().c_str(),
               server->metrics_address().empty() ? "" : ", metrics on http://",
               server->metrics_address().empty() ? "" : (server->metrics_address() + "/metrics").c_str(),
               Protection(o).c_str());
  if (o.loopback_open) {
    std::fprintf(stderr, "conveyor serve: WARNING: --loopback-open: every user of this host may read the "
                 "dataset and write into any job's ledger and metrics\n");
  }
  if (o.plaintext_token) {
    std::fprintf(stderr, "conveyor serve: WARNING: --insecure-plaintext-token: the bearer token and the "
                 "batches cross the network in cleartext\n");
  }
  if (!o.ready_file.empty()) {
    // Written whole under a fresh name (mkstemp: O_EXCL, random, never through a link another
    // user planted beside it), then renamed into place.
    std::string tmp = o.ready_file + ".XXXXXX";
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) {
      return absl::InternalError(StrCat("cannot write ready file ", o.ready_file, ": ", std::strerror(errno)));
    }
    std::string text = server->address();
    if (!server->metrics_address().empty()) text += " " + server->metrics_address();
    text += "\n";
    const bool written = ::fchmod(fd, 0644) == 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!written || ::rename(tmp.c_str(), o.ready_file.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return absl::InternalError(StrCat("cannot write ready file ", o.ready_file, ": ", std::strerror(e)));
    }
  }
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "conveyor serve: %s: draining (health NOT_SERVING, streams end with "
               "UNAVAILABLE, at most %.1f s)\n", sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP", o.grace_seconds);
  server->Shutdown(o.grace_seconds);
  server->Wait();
  std::fprintf(stderr, "conveyor serve: stopped\n");
  return absl::OkStatus();
}


// `conveyor serve`: its flags and its run (tools/command.h).
class ServeCommand final : public Command {
 public:
  explicit ServeCommand(std::string version) { o_.version = std::move(version); }
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("serve", "Serve batches over gRPC to training workers (docs/serving.md)");
    c->add_option("dataset", o_.dataset, "Dataset path or URL")->required();
    c->add_option("--config", o_.configs, "Config (YAML); repeat for several, named by file stem; the first is the default")->required();
    c->add_option("--listen", o_.listen, "Address to listen on (port 0: pick a free one); beyond loopback needs TLS with --auth-token-file or --tls-client-ca")->capture_default_str();
    c->add_option("--metrics-listen", o_.metrics_listen, "Serve Prometheus metrics on http://ADDR/metrics");
    c->add_option("--auth-token-file", o_.auth_token_file, "File holding the bearer token clients must send");
    c->add_option("--allow-uid", o_.allow_users,
                  "On loopback: also admit this local user (name or uid; repeat). The server's own user and root always may");
    c->add_option("--allow-group", o_.allow_groups,
                  "On loopback: also admit this group's members (name or gid; repeat); for unix:PATH, the socket's group (0660)");
    c->add_flag("--loopback-open", o_.loopback_open,
                "On loopback: admit every local user (no identity check; warned at start)");
    c->add_flag("--insecure-plaintext-token", o_.plaintext_token,
                "Beyond loopback: allow a bearer token without TLS (cleartext; for networks private or encrypted below gRPC)");
    c->add_option("--job-idle-seconds", o_.job_idle_seconds,
                  "A job with no stream or call for this long gives up its slot (metrics series, ledger, secret) to a new job when all 256 are taken")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    c->add_option("--tls-cert", o_.tls_cert, "TLS certificate chain (PEM)");
    c->add_option("--tls-key", o_.tls_key, "TLS private key (PEM)");
    c->add_option("--tls-client-ca", o_.tls_client_ca, "Require client certificates signed by this CA (PEM)");
    c->add_option("--threads", o_.threads, "Decode workers per stream")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--cpu-slots", o_.cpu_slots,
                  "How many decode workers of all streams compute at once (default: one more than the CPUs this process "
                  "may use, from its affinity and cgroup quota; 0: no bound beyond --threads per stream)")
        ->check(CLI::Range(0, 1024));
    c->add_option("--queue-bytes", o_.queue_bytes, "Byte budget of samples in flight per stream")->transform(CLI::AsSizeValue(true))->capture_default_str()->check(CLI::PositiveNumber);
    AddFrameCacheFlags(c, &o_.frame_cache);
    c->add_option("--frame-cache-warm-threads", o_.frame_cache_warm_threads,
                  "Warm the frame cache in the background from start-up with this many threads, ahead of the order "
                  "(for spare cores; 0: no warm-up)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    c->add_option("--max-message-bytes", o_.max_message_bytes, "Largest message; batches are split")->transform(CLI::AsSizeValue(true))->capture_default_str();
    c->add_option("--shared-memory", o_.shared_memory,
                  "Build the batches of clients on this host in a shared region each takes from the server (docs/serving.md)")
        ->capture_default_str();
    c->add_option("--max-streams", o_.max_streams, "Concurrent streams (stripe streams, --payload-streams, have a pool of this many of their own)")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--stream-progress-timeout", o_.stream_progress_timeout_seconds, "End a stream (or stripe stream) whose client took no batch for this many seconds, freeing its slot (0: never)")->capture_default_str()->check(CLI::NonNegativeNumber);
    c->add_option("--ready-file", o_.ready_file, "Write the bound address here once serving");
    c->add_option("--grace-seconds", o_.grace_seconds, "Drain time on SIGTERM")->capture_default_str()->check(CLI::NonNegativeNumber);
    // Ceilings no request can raise (docs/serving.md "Ceilings").
    c->add_option("--stream-memory-bytes", o_.limits.stream_memory_bytes, "Per stream: pre-decoded frames + samples in flight + batch buffers, estimated before a stream starts")->transform(CLI::AsSizeValue(true))->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--server-memory-bytes", o_.limits.server_memory_bytes, "All streams together: a stream is admitted only when its estimate fits beside the running ones (default: 3/4 of the machine's or cgroup's memory, less --frame-cache-bytes)")->transform(CLI::AsSizeValue(true))->check(CLI::PositiveNumber);
    c->add_option("--max-global-batch-size", o_.limits.max_global_batch_size, "Largest global batch a request may ask for")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--max-pixels", o_.limits.max_pixels, "Largest decoded frame or output image, in pixels")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--max-frames-per-sample", o_.limits.max_frames_per_sample, "Most frames per stream and sample")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--max-audio-samples", o_.limits.max_audio_samples, "Longest audio window, in samples per channel")->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--max-sample-bytes", o_.limits.max_sample_bytes, "Largest sample (all its tensors)")->transform(CLI::AsSizeValue(true))->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--max-batch-bytes", o_.limits.max_batch_bytes, "Largest consumer batch")->transform(CLI::AsSizeValue(true))->capture_default_str()->check(CLI::PositiveNumber);
    c->add_option("--max-streams-per-peer", o_.limits.max_streams_per_peer, "Concurrent streams per client: its local user on this host, its address otherwise")->capture_default_str()->check(CLI::PositiveNumber);
    return c;
  }
  absl::Status Run() override {
    return RunServe(o_);
  }

 private:
  ServeOptions o_;
};

std::unique_ptr<Command> NewServeCommand(std::string version) {
  return std::make_unique<ServeCommand>(std::move(version));
}

}  // namespace conveyor::tools
