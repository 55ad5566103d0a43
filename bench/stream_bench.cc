// stream_bench: what the wire costs.
//
//  1. Transport: GB/s and batches/s of conveyor.v1 over loopback (the server's batch encoder, a
//     gRPC server, the C++ client with its prefetch and reassembly) for a batch of the default
//     robot spec (taken once from the pipeline, then resent) and for one large synthetic tensor,
//     beside iperf3 over loopback in the same run (goal: at least 0.7 of iperf3); and the same
//     through the same-host transport (payloads in the server's region the client maps, headers over
//     gRPC) beside memcpy of the same bytes on one core (goal: at least 0.5 of memcpy).
//  2. End to end: samples/s from a `conveyor serve` process (1 and 2 worker threads) to a client,
//     over gRPC payloads and over shared memory, beside the same pipeline run offline in-process
//     with the same threads (goal for shared memory: at least 0.98 of offline).
//
// Usage: stream_bench [--quick] [--work_dir=DIR] [--json=FILE]
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "bench/machine_info.h"
#include "client/client.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "datasets/dataset.h"
#include "server/internal/batch_encoder.h"
#include "server/internal/payload_sink.h"
#include "server/internal/shm_sink.h"
#include "pipeline/pipeline.h"

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

std::string Run(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  return out;
}

// A port the kernel says is free now (bound to port 0, then released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// iperf3 over loopback: one TCP stream for `seconds`, as GB/s received.
double Iperf3(double seconds) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int port = FreePort();
    const pid_t pid = fork();
    if (pid == 0) {
      freopen("/dev/null", "w", stdout);
      freopen("/dev/null", "w", stderr);
      execlp("iperf3", "iperf3", "-s", "-1", "-p", std::to_string(port).c_str(), nullptr);
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string out = Run("iperf3 -c 127.0.0.1 -p " + std::to_string(port) + " -t " +
                                std::to_string(static_cast<int>(seconds)) + " -J 2>/dev/null");
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    try {
      const json j = json::parse(out);
      return j["end"]["sum_received"]["bits_per_second"].get<double>() / 8 / 1e9;
    } catch (...) {
      continue;
    }
  }
  return 0;
}

// Streams the same batch forever (cursor advancing), through the server's encoder.
class RepeatService final : public RawStreamBatchesService {
 public:
  RepeatService(const Batch* batch, uint64_t max_message) : batch_(batch), max_message_(max_message) {}
  grpc::Status StreamRaw(grpc::ServerContext*, const pb::StreamBatchesRequest* req,
                         Stream* w) override {
    pb::StreamBatchesResponse start;
    start.mutable_start()->set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
    start.mutable_start()->set_steps_per_epoch(1u << 30);
    // The same-host region: the batch is copied into a buffer of the ring, as a pipeline would
    // have built it there (server/internal/shm_sink.h), and only its header is sent.
    std::unique_ptr<SharedMemorySink> shm;
    if (req->has_shared_memory()) {
      auto created = SharedMemorySink::Create(req->shared_memory().capacity(), req->shared_memory().batches_ahead(),
                                              max_message_);
      if (created.ok()) {
        shm = std::move(*created);
        start.mutable_start()->set_shared_memory(true);
        start.mutable_start()->set_shared_memory_ring(shm->ring());
        start.mutable_start()->set_shared_memory_socket(shm->socket_path());
        start.mutable_start()->set_shared_memory_token(shm->token());
      }
    }
    if (!w->Write(SerializeMessage(start))) return grpc::Status::CANCELLED;
    const StopFn never = [] { return false; };
    if (shm && !shm->Handoff(absl::Seconds(5), never).ok()) shm.reset();
    std::unique_ptr<PayloadSink> grpc_sink = MakeGrpcSink(max_message_);
    PayloadSink& sink = shm ? static_cast<PayloadSink&>(*shm) : *grpc_sink;
    const BatchBuffers buffers = sink.buffers(never);
    Batch b = *batch_;
    for (uint64_t i = 0; i < req->max_batches(); ++i) {
      b.cursor = Cursor{req->start().epoch(), req->start().step() + i};
      if (buffers) {
        absl::StatusOr<std::shared_ptr<HostBuffer>> buf = buffers(batch_->buffer->size());
        if (!buf.ok()) return grpc::Status::CANCELLED;
        std::memcpy((*buf)->data(), batch_->buffer->data(), batch_->buffer->size());
        b.buffer = std::move(*buf);
      }
      const bool ok = sink.Send(b, Cursor{b.cursor.epoch, b.cursor.step + 1},
                                [&](const grpc::ByteBuffer& m) { return w->Write(m); }).ok();
      if (!ok) return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

 private:
  const Batch* batch_;
  uint64_t max_message_;
};

struct Transport {
  double gb_per_s = 0, batches_per_s = 0;
  uint64_t shm_batches = 0;
};

// memcpy of `bytes` between two buffers touched beforehand, on this thread: GB/s, best of a few.
double MemcpyGBps(size_t bytes, double seconds) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    uint64_t copied = 0;
    do {
      std::memcpy(b.data(), a.data(), bytes);
      copied += bytes;
      a[copied % bytes] ^= b[(copied / 3) % bytes];  // keep the copies observable
    } while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds / 3);
    best = std::max(best, copied / 1e9 / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// With `shm`, the client takes a region of six batches and the service copies payloads into it.
Transport StreamRepeated(const Batch& batch, uint64_t max_message, double seconds, bool shm = false) {
  RepeatService service(&batch, max_message);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(-1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  // Calibrate: how many batches fit in `seconds`, from a short first run.
  // Steady state: with shared memory the first lap of a new ring also allocates its pages (the
  // kernel zeroes each one on first touch), so the first `lap` batches are not timed.
  const uint64_t lap = shm ? 7 : 0;
  auto measure = [&](uint64_t n) {
    client::ClientOptions o;
    o.servers = {"127.0.0.1:" + std::to_string(port)};
    o.max_batches = n + lap;
    o.shared_memory = shm;
    o.shared_memory_bytes = 6 * batch.bytes() + (1 << 20);
    auto c = client::Client::Create(o);
    if (!c.ok()) {
      std::cerr << c.status() << "\n";
      std::exit(1);
    }
    auto t0 = Clock::now();
    uint64_t bytes = 0, got = 0, seen = 0;
    for (;;) {
      auto b = (*c)->Next();
      if (!b.ok() || !b->has_value()) break;
      if (++seen <= lap) {
        t0 = Clock::now();
        continue;
      }
      bytes += (*b)->bytes();
      ++got;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    Transport t;
    t.gb_per_s = bytes / 1e9 / s;
    t.batches_per_s = got / s;
    t.shm_batches = (*c)->stats().shared_memory_batches;
    return t;
  };
  const Transport warm = measure(4);
  const uint64_t n = std::max<uint64_t>(8, static_cast<uint64_t>(warm.batches_per_s * seconds));
  Transport best;
  for (int rep = 0; rep < 3; ++rep) {
    const Transport t = measure(n);
    if (t.gb_per_s > best.gb_per_s) best = t;
  }
  server->Shutdown();
  return best;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Batches not timed at the start of each end-to-end run (served and offline alike): start-up, the
// first lap of a shared-memory ring (its pages are allocated on first touch).
constexpr int kWarmBatches = 10;

// A `conveyor serve` process with `threads` workers; samples/s a client receives over `steps`.
double ServedSamplesPerSecond(const std::string& cli, const std::string& ds, const std::string& config,
                              const std::string& work, int threads, int steps, bool shm) {
  const std::string ready = work + "/ready-" + std::to_string(threads);
  std::filesystem::remove(ready);
  const pid_t pid = fork();
  if (pid == 0) {
    freopen((work + "/serve.log").c_str(), "w", stderr);
    execl(cli.c_str(), cli.c_str(), "serve", ds.c_str(), "--config", config.c_str(), "--listen",
          "127.0.0.1:0", "--threads", std::to_string(threads).c_str(), "--ready-file", ready.c_str(),
          "--queue-bytes", "1073741824", nullptr);
    _exit(127);
  }
  std::string address;
  for (int i = 0; i < 600 && address.empty(); ++i) {
    std::istringstream(ReadAll(ready)) >> address;
    if (address.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  double rate = 0;
  if (!address.empty()) {
    client::ClientOptions o;
    o.servers = {address};
    o.max_batches = static_cast<uint64_t>(steps + kWarmBatches);
    o.shared_memory = shm;
    auto c = client::Client::Create(o);
    auto t0 = Clock::now();
    uint64_t samples = 0;
    for (int seen = 0;; ++seen) {
      auto b = (*c)->Next();
      if (!b.ok()) std::cerr << b.status() << "\n";
      if (!b.ok() || !b->has_value()) break;
      if (seen < kWarmBatches) {
        t0 = Clock::now();
        continue;
      }
      samples += (*b)->ids.size();
    }
    rate = samples / std::chrono::duration<double>(Clock::now() - t0).count();
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  return rate;
}

double OfflineSamplesPerSecond(const Dataset& ds, const SampleSpec& spec, PipelineOptions o,
                               int threads, int steps) {
  o.threads = threads;
  // As the server does: the schedule resolved from the config's own budget, then the stream's
  // budget (the served runs' --queue-bytes) for what is in flight.
  if (absl::Status st = ResolveSchedule(ds, spec, &o); !st.ok()) {
    std::cerr << st << "\n";
    std::exit(1);
  }
  o.queue_bytes = 1ull << 30;
  auto p = Pipeline::Create(ds, spec, o, Cursor{});
  if (!p.ok()) {
    std::cerr << p.status() << "\n";
    std::exit(1);
  }
  auto t0 = Clock::now();
  uint64_t samples = 0;
  for (int i = 0; i < steps + kWarmBatches; ++i) {
    auto b = (*p)->Next();
    if (!b.ok() || !b->has_value()) break;
    if (i < kWarmBatches) {
      t0 = Clock::now();
      continue;
    }
    samples += (*b)->ids.size();
  }
  return samples / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  using namespace conveyor;
  bool quick = false;
  std::string work, json_path = "bench/out/stream_bench.json";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a.rfind("--work_dir=", 0) == 0) work = a.substr(11);
    else if (a.rfind("--json=", 0) == 0) json_path = a.substr(7);
    else {
      std::cerr << "usage: stream_bench [--quick] [--work_dir=DIR] [--json=FILE]\n";
      return 2;
    }
  }
  if (work.empty()) work = (std::filesystem::temp_directory_path() / "conveyor-stream-bench").string();
  std::filesystem::create_directories(work);
  const std::string cli = CONVEYOR_CLI;
  const std::string ds_dir = work + (quick ? "/ds-quick" : "/ds");
  if (!std::filesystem::exists(ds_dir + "/manifest.json")) {
    std::cerr << "stream_bench: making the dataset with conveyor synth\n";
    const std::string args = quick ? " --episodes 2 --episode-seconds 3" : " --episodes 6 --episode-seconds 20";
    if (Sh(cli + " synth --quiet --out '" + ds_dir + "'" + args) != 0) return 1;
  }
  const std::string config = std::string(CONVEYOR_BENCH_SOURCE_DIR) + "/examples/pipeline.yaml";
  auto ds = Dataset::Open(ds_dir);
  if (!ds.ok()) {
    std::cerr << ds.status() << "\n";
    return 1;
  }
  const std::string text = ReadAll(config);
  auto spec = SampleSpec::FromYaml(text, (*ds)->manifest(), config);
  PipelineOptions base;
  if (!spec.ok() || !base.MergeYaml(text, *spec, (*ds)->manifest(), config).ok()) {
    std::cerr << "config: " << spec.status() << "\n";
    return 1;
  }
  const double seconds = quick ? 0.5 : 3;
  json out = {{"machine", {{"nproc", std::thread::hardware_concurrency()},
                           {"cpu", bench::CpuModel()}, {"load_before", bench::LoadAverage()}}},
              {"dataset", ds_dir}};

  // 1. Transport.
  std::fprintf(stderr, "stream_bench: iperf3 over loopback...\n");
  const double iperf = Iperf3(quick ? 1 : 5);
  Batch robot;
  {
    auto p = Pipeline::Create(**ds, *spec, base, Cursor{});
    auto b = (*p)->Next();
    if (!b.ok() || !b->has_value()) {
      std::cerr << b.status() << "\n";
      return 1;
    }
    robot = std::move(**b);
  }
  Batch large;
  {
    const size_t bytes = quick ? (32u << 20) : (256u << 20);
    large.buffer = HostBuffer::Allocate(bytes, false);
    std::memset(large.buffer->data(), 7, bytes);
    large.tensors.push_back(TensorView{{"blob", DType::kUint8, {static_cast<int64_t>(bytes)}}, 0, bytes});
  }
  std::printf("stream_bench: conveyor.v1 over loopback (server encoder -> gRPC -> C++ client), best of 3\n");
  std::printf("iperf3 loopback (1 TCP stream): %.2f GB/s\n\n", iperf);
  std::printf("%-34s %10s %12s %10s %12s %12s\n", "workload", "MB/batch", "message MB", "GB/s",
              "batches/s", "of iperf3");
  json transport = json::array();
  struct W {
    const char* name;
    const Batch* batch;
    uint64_t max_message;
  };
  for (const W& w : {W{"robot spec batch (32 samples)", &robot, 1ull << 20},
                     W{"robot spec batch (32 samples)", &robot, 4ull << 20},
                     W{"robot spec batch (32 samples)", &robot, 16ull << 20},
                     W{"robot spec batch (32 samples)", &robot, 32ull << 20},
                     W{"one large tensor", &large, 4ull << 20},
                     W{"one large tensor", &large, 32ull << 20}}) {
    const Transport t = StreamRepeated(*w.batch, w.max_message, seconds);
    std::printf("%-34s %10.1f %12.0f %10.2f %12.1f %12.2f\n", w.name, w.batch->bytes() / 1e6,
                w.max_message / 1048576.0, t.gb_per_s, t.batches_per_s, iperf > 0 ? t.gb_per_s / iperf : 0);
    std::fflush(stdout);
    transport.push_back({{"workload", w.name}, {"batch_bytes", w.batch->bytes()},
                         {"max_message_bytes", w.max_message}, {"gb_per_s", t.gb_per_s},
                         {"batches_per_s", t.batches_per_s},
                         {"iperf3_gb_per_s", iperf}, {"ratio_to_iperf3", iperf > 0 ? t.gb_per_s / iperf : 0}});
  }
  out["iperf3_gb_per_s"] = iperf;
  out["transport"] = transport;

  // 1b. The same-host transport: payloads copied into the server's region the client maps, beside memcpy.
  std::printf("\nsame-host transport (payload copied into the stream's sealed memfd region, header over gRPC)\n");
  std::printf("%-34s %10s %10s %12s %12s %12s\n", "workload", "MB/batch", "GB/s", "batches/s",
              "memcpy GB/s", "of memcpy");
  json same_host = json::array();
  for (const Batch* b : {&robot, &large}) {
    const char* name = b == &robot ? "robot spec batch (32 samples)" : "one large tensor";
    const double memcpy_gbps = MemcpyGBps(b->bytes(), quick ? 0.3 : 1.5);
    const Transport t = StreamRepeated(*b, 4ull << 20, seconds, /*shm=*/true);
    std::printf("%-34s %10.1f %10.2f %12.1f %12.2f %12.2f\n", name, b->bytes() / 1e6, t.gb_per_s,
                t.batches_per_s, memcpy_gbps, memcpy_gbps > 0 ? t.gb_per_s / memcpy_gbps : 0);
    std::fflush(stdout);
    same_host.push_back({{"workload", name}, {"batch_bytes", b->bytes()}, {"gb_per_s", t.gb_per_s},
                         {"batches_per_s", t.batches_per_s}, {"shared_memory_batches", t.shm_batches},
                         {"memcpy_gb_per_s", memcpy_gbps},
                         {"ratio_to_memcpy", memcpy_gbps > 0 ? t.gb_per_s / memcpy_gbps : 0}});
  }
  out["same_host_transport"] = same_host;

  // 2. End to end.
  const int steps = quick ? 3 : 40;
  std::printf("\nend to end, default robot spec (examples/pipeline.yaml), %d batches of %llu after %d untimed\n",
              steps, static_cast<unsigned long long>(base.global_batch_size), kWarmBatches);
  std::printf("%-8s %18s %8s %18s %8s %18s\n", "threads", "served gRPC", "ratio", "served shm",
              "ratio", "offline samples/s");
  json e2e = json::array();
  for (int threads : {1, 2}) {
    const double offline = OfflineSamplesPerSecond(**ds, *spec, base, threads, steps);
    const double served = ServedSamplesPerSecond(cli, ds_dir, config, work, threads, steps, false);
    const double shm = ServedSamplesPerSecond(cli, ds_dir, config, work, threads, steps, true);
    std::printf("%-8d %18.1f %8.2f %18.1f %8.2f %18.1f\n", threads, served,
                offline > 0 ? served / offline : 0, shm, offline > 0 ? shm / offline : 0, offline);
    std::fflush(stdout);
    e2e.push_back({{"threads", threads}, {"served_samples_per_s", served},
                   {"served_shared_memory_samples_per_s", shm}, {"offline_samples_per_s", offline},
                   {"ratio", offline > 0 ? served / offline : 0},
                   {"shared_memory_ratio", offline > 0 ? shm / offline : 0}});
  }
  out["end_to_end"] = e2e;
  std::filesystem::create_directories(std::filesystem::path(json_path).parent_path().empty()
                                          ? "."
                                          : std::filesystem::path(json_path).parent_path());
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf("\nwrote %s\n", json_path.c_str());
  return 0;
}
