// `conveyor serve`: runs the data server until SIGTERM or SIGINT, then drains (docs/serving.md).
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/status_macros.h"
#include "base/strings.h"
#include "server/server.h"
#include "tools/commands.h"

namespace conveyor::tools {

absl::Status RunServe(const ServeOptions& o) {
  // Signals are taken by sigwait below; block them before any server thread starts so that
  // every thread inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
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
  so.threads = o.threads;
  so.queue_bytes = o.queue_bytes;
  so.max_message_bytes = o.max_message_bytes;
  so.max_streams = o.max_streams;
  so.version = o.version;
  so.limits = o.limits;
  ASSIGN_OR_RETURN(std::unique_ptr<DataServer> server, DataServer::Start(so));
  std::fprintf(stderr, "conveyor serve: serving %s on %s%s%s (%s)\n", o.dataset.c_str(),
               server->address().c_str(),
               server->metrics_address().empty() ? "" : ", metrics on http://",
               server->metrics_address().empty() ? "" : (server->metrics_address() + "/metrics").c_str(),
               o.auth_token_file.empty() && o.tls_cert.empty() ? "loopback, no auth"
               : o.tls_cert.empty()                              ? "bearer token"
                                                                 : "TLS");
  if (!o.ready_file.empty()) {
    const std::string tmp = o.ready_file + ".tmp";
    {
      std::ofstream f(tmp);
      f << server->address();
      if (!server->metrics_address().empty()) f << " " << server->metrics_address();
      f << "\n";
      if (!f) return absl::InternalError(StrCat("cannot write ready file ", o.ready_file));
    }
    std::filesystem::rename(tmp, o.ready_file);
  }
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "conveyor serve: %s: draining (health NOT_SERVING, streams end with "
               "UNAVAILABLE, at most %.1f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", o.grace_seconds);
  server->Shutdown(o.grace_seconds);
  server->Wait();
  std::fprintf(stderr, "conveyor serve: stopped\n");
  return absl::OkStatus();
}

}  // namespace conveyor::tools
