// The smallest trainer loop over the C++ client: connect, take N batches, print for each its
// cursor, its sample ids (episode/step, as `conveyor fetch --ids` lists them) and its tensors.
//
//   conveyor_consumer --servers HOST:PORT[,HOST:PORT] [--steps N] [--consumer I --consumers N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/client.h"

namespace {

int Usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: conveyor_consumer --servers HOST:PORT[,...] [--steps N] [--consumer I "
               "--consumers N]\n"
               "Streams N batches (default 4) from Conveyor servers and prints one line per batch:\n"
               "  EPOCH:STEP samples K tensors T bytes B [episode/step ...]\n");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  conveyor::client::ClientOptions options;
  options.max_batches = 4;
  std::string servers;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return Usage(0);
    if (i + 1 >= argc) return Usage(2);
    const char* value = argv[++i];
    if (arg == "--servers") {
      servers = value;
    } else if (arg == "--steps") {
      options.max_batches = std::strtoull(value, nullptr, 10);
    } else if (arg == "--consumer") {
      options.consumer = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
    } else if (arg == "--consumers") {
      options.consumers = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
    } else {
      return Usage(2);
    }
  }
  options.servers = conveyor::client::ParseServers(servers);  // empty: $CONVEYOR_SERVERS
  if (options.servers.empty()) return Usage(2);

  auto client = conveyor::client::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "conveyor_consumer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  for (;;) {
    absl::StatusOr<std::optional<conveyor::client::Batch>> batch = (*client)->Next();
    if (!batch.ok()) {
      std::fprintf(stderr, "conveyor_consumer: %s\n", batch.status().ToString().c_str());
      return 1;
    }
    if (!batch->has_value()) break;  // the end of the stream: max_batches reached
    const conveyor::client::Batch& b = **batch;
    std::string ids;
    for (const conveyor::client::SampleId& id : b.ids) {
      ids += (ids.empty() ? "" : " ") + std::to_string(id.episode) + "/" + std::to_string(id.step);
    }
    std::printf("%llu:%llu samples %zu tensors %zu bytes %zu [%s]\n",
                static_cast<unsigned long long>(b.cursor.epoch),
                static_cast<unsigned long long>(b.cursor.step), b.ids.size(), b.tensors.size(),
                b.bytes(), ids.c_str());
  }
  return 0;
}
