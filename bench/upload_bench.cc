// upload_bench: host-to-GPU throughput of the Uploader (device/upload.h) beside plain cudaMemcpy
// of the same bytes, for batches of 1, 16, 64 and 256 MiB.
//
// On a GPU (CUDA built in and a device present), per batch size:
//   uploader          Uploader::Upload of pinned HostBuffers: one cudaMemcpyAsync per batch on
//                     the uploader's stream, double-buffered (the consumer waits for batch k while
//                     the copy of k+1 is queued); also the time an Upload call takes to return
//   memcpy pinned     cudaMemcpy (synchronous) from cudaHostAlloc memory   } baselines: the same
//   memcpy pageable   cudaMemcpy (synchronous) from aligned_alloc memory   } bytes, the same run
// and an overlap workload: a consumer that "trains" on each batch for as long as its copy takes
// (a host sleep standing in for the step), with 1 buffer (copy and step in series) and with 2
// (copy of k+1 during the step on k): batches per second and the ratio.
// Without a GPU it says why, and times memcpy of the same sizes and the Uploader's CPU path
// (no copy; the figure is how fast batches are handed over).
//
// Each GB/s figure (10^9 bytes per second) is the median of --reps runs of at least 1 GiB each
// (the JSON also has the slowest and fastest). After timing, the last batch on the device is
// copied back and compared with its host bytes. Prints a table and one JSON line and writes the
// JSON to --json (default bench/out/upload_bench.json in the source tree).
//
// Usage: upload_bench [--sizes_mib=1,16,64,256] [--reps=5] [--device=0] [--json=FILE]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bench/machine_info.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "nlohmann/json.hpp"
#include "device/upload.h"
#include "pipeline/batch.h"

#if CONVEYOR_HAVE_CUDA
#include "device/internal/cuda.h"
#endif

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kMinBytesPerRun = 1024 * kMiB;

struct Flags {
  std::vector<uint64_t> sizes_mib = {1, 16, 64, 256};
  int reps = 5;
  int device = 0;
  std::string json_path = StrCat(CONVEYOR_BENCH_SOURCE_DIR, "/bench/out/upload_bench.json");
};

// Only for bad flags: it exits before anything needs cleaning up.
[[noreturn]] void Die(std::string_view message) {
  std::cerr << "upload_bench: " << message << "\n";
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--sizes_mib=")) {
      flags.sizes_mib.clear();
      for (absl::string_view s : absl::StrSplit(arg, ',')) {
        uint64_t mib = 0;
        if (!absl::SimpleAtoi(s, &mib) || mib < 1) Die("--sizes_mib needs numbers >= 1, like 1,16");
        flags.sizes_mib.push_back(mib);
      }
    } else if (absl::ConsumePrefix(&arg, "--reps=")) {
      if (!absl::SimpleAtoi(arg, &flags.reps) || flags.reps < 1) Die("--reps needs a number >= 1");
    } else if (absl::ConsumePrefix(&arg, "--device=")) {
      if (!absl::SimpleAtoi(arg, &flags.device) || flags.device < 0) {
        Die("--device needs a CUDA ordinal >= 0");
      }
    } else if (absl::ConsumePrefix(&arg, "--json=")) {
      flags.json_path = std::string(arg);
    } else {
      Die(StrCat("unknown flag ", argv[i],
                 "\nusage: upload_bench [--sizes_mib=1,16,64,256] [--reps=5] [--device=0] "
                 "[--json=FILE]"));
    }
  }
  return flags;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Copies per run: at least 1 GiB per run and at least 4 copies.
uint64_t CopiesPerRun(uint64_t bytes) { return std::max<uint64_t>(4, kMinBytesPerRun / bytes); }

// A figure: GB/s median over runs, with the slowest and fastest run.
struct Rate {
  double gb_per_s = 0;
  double slowest = 0;
  double fastest = 0;
  nlohmann::json Json() const {
    return {{"gb_per_s", gb_per_s}, {"gb_per_s_slowest", slowest}, {"gb_per_s_fastest", fastest}};
  }
};

// Runs `run` (which moves `bytes` bytes per call and returns its seconds) `reps` times.
template <typename Run>
absl::StatusOr<Rate> Measure(int reps, uint64_t bytes, Run run) {
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    ASSIGN_OR_RETURN(const double seconds, run());
    rates.push_back(static_cast<double>(bytes) / seconds / 1e9);
  }
  const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
  return Rate{Median(rates), *lo, *hi};
}

// One batch of a single uint8 tensor filling a HostBuffer of `bytes` random bytes.
Batch MakeBatch(uint64_t bytes, uint64_t seed, uint64_t step) {
  Batch batch;
  batch.cursor.step = step;
  batch.buffer = HostBuffer::Allocate(bytes, /*pinned=*/true);
  std::mt19937_64 rng(seed);
  uint8_t* p = batch.buffer->data();
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = rng();
    std::memcpy(p + i, &r, 8);
  }
  batch.tensors.push_back(
      TensorView{{.name = "x", .dtype = DType::kUint8, .shape = {static_cast<int64_t>(bytes)}},
                 0,
                 bytes});
  return batch;
}

// Pageable memory of `bytes` bytes, touched (so page faults are not timed).
struct PageableBuffer {
  explicit PageableBuffer(uint64_t bytes)
      : data(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data.get(), 0x5A, bytes);
  }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data;
};

// A pipeline batch as the uploader takes it: its one buffer, owned by the upload.
HostBatch AsHostBatch(const Batch& batch) {
  HostBatch host;
  host.label = StrCat("batch ", batch.cursor.step);
  host.data = batch.buffer->data();
  host.size = batch.buffer->size();
  host.pinned = batch.buffer->pinned();
  for (const TensorView& t : batch.tensors) {
    host.tensors.push_back(HostTensor{TensorDesc(t), t.offset, t.bytes});
  }
  host.owner = batch.buffer;
  return host;
}

#if CONVEYOR_HAVE_CUDA
// The host bytes an upload was made from.
const uint8_t* HostData(const DeviceBatch& b) {
  return static_cast<const HostBuffer*>(b.owner().get())->data();
}
#endif

// The consumer loop of the docs (docs/pipeline.md): hold at most `buffers` batches; when full,
// wait for the oldest, "train" on it for `step` (0: none), and drop it, then upload the next.
// Returns the seconds for `copies` batches, and the median time an Upload call took to return.
absl::StatusOr<double> RunUploader(Uploader& uploader, const std::vector<Batch>& ring,
                                   uint64_t copies, int buffers, std::chrono::microseconds step,
                                   std::vector<double>* call_seconds,
                                   std::unique_ptr<DeviceBatch>* last) {
  if (last != nullptr) last->reset();  // a batch kept from an earlier run would hold a buffer
  std::deque<std::unique_ptr<DeviceBatch>> live;
  const auto consume = [&]() -> absl::Status {
    RETURN_IF_ERROR(live.front()->Wait());
    if (step.count() > 0) std::this_thread::sleep_for(step);
    live.pop_front();
    return absl::OkStatus();
  };
  const auto start = Clock::now();
  for (uint64_t i = 0; i < copies; ++i) {
    if (live.size() == static_cast<size_t>(buffers)) RETURN_IF_ERROR(consume());
    HostBatch host = AsHostBatch(ring[i % ring.size()]);
    const auto call = Clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceBatch> b, uploader.Upload(std::move(host)));
    if (call_seconds != nullptr) call_seconds->push_back(Seconds(call));
    live.push_back(std::move(b));
  }
  while (live.size() > 1) RETURN_IF_ERROR(consume());
  RETURN_IF_ERROR(live.front()->Wait());
  if (step.count() > 0) std::this_thread::sleep_for(step);
  const double seconds = Seconds(start);
  if (last != nullptr) *last = std::move(live.front());
  return seconds;
}

using bench::CpuModel;
using bench::LoadAverage;

#if CONVEYOR_HAVE_CUDA

absl::Status CheckSame(const void* device, const uint8_t* host, uint64_t bytes, std::string what) {
  std::vector<uint8_t> back(bytes);
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemcpy(back.data(), device, bytes, cudaMemcpyDeviceToHost));
  if (std::memcmp(back.data(), host, bytes) != 0) {
    return absl::DataLossError(StrCat(what, ": the bytes on the device differ from the host's"));
  }
  return absl::OkStatus();
}

// Synchronous cudaMemcpy of `src` to `dst`, `copies` times; the device is synchronized at the end
// because cudaMemcpy from pageable memory may return before the last DMA has landed.
absl::StatusOr<double> RunMemcpy(void* dst, const void* src, uint64_t bytes, uint64_t copies) {
  const auto start = Clock::now();
  for (uint64_t i = 0; i < copies; ++i) {
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Seconds(start);
}

absl::StatusOr<nlohmann::json> GpuInfo(int device) {
  cudaDeviceProp prop{};
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  int runtime = 0, driver = 0;
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
  return nlohmann::json{{"name", prop.name},
                        {"device", device},
                        {"pci_bus", prop.pciBusID},
                        {"memory_gib", static_cast<double>(prop.totalGlobalMem) / (1024.0 * kMiB)},
                        {"cuda_runtime", runtime},
                        {"cuda_driver", driver}};
}

absl::Status RunGpu(const Flags& flags, Uploader& uploader, nlohmann::json& doc) {
  ASSIGN_OR_RETURN(doc["gpu"], GpuInfo(flags.device));
  std::cout << "GPU: " << doc["gpu"]["name"].get<std::string>() << " (device " << flags.device
            << ")\n\n";
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json overlap = nlohmann::json::array();
  std::string table = absl::StrFormat("%-8s %6s   %13s %5s   %13s %6s   %15s %6s   %s\n", "batch",
                                      "copies", "uploader GB/s", "+-%", "pinned memcpy", "ratio",
                                      "pageable memcpy", "ratio", "Upload() returns in");
  std::string overlap_table = absl::StrFormat("%-8s %10s   %14s %14s %7s\n", "batch", "step (ms)",
                                              "1 buffer b/s", "2 buffers b/s", "ratio");
  for (uint64_t mib : flags.sizes_mib) {
    const uint64_t bytes = mib * kMiB;
    const uint64_t copies = CopiesPerRun(bytes);
    // Three batches in rotation, so consecutive uploads read different host memory.
    std::vector<Batch> ring;
    for (uint64_t i = 0; i < 3; ++i) ring.push_back(MakeBatch(bytes, mib * 10 + i, i));
    if (!ring[0].buffer->pinned()) {
      return absl::FailedPreconditionError("HostBuffer did not get pinned memory on a GPU machine");
    }
    ASSIGN_OR_RETURN(cuda::UniqueDeviceMemory dst, cuda::AllocDevice(bytes));
    ASSIGN_OR_RETURN(cuda::UniquePinnedMemory pinned, cuda::AllocPinned(bytes));
    std::memcpy(pinned.get(), ring[0].buffer->data(), bytes);
    PageableBuffer pageable(bytes);
    std::memcpy(pageable.data.get(), ring[0].buffer->data(), bytes);

    // Warm-up: grows the uploader's device buffers, faults in every page once.
    RETURN_IF_ERROR(RunUploader(uploader, ring, 2, 2, {}, nullptr, nullptr).status());
    RETURN_IF_ERROR(RunMemcpy(dst.get(), pinned.get(), bytes, 1).status());
    RETURN_IF_ERROR(RunMemcpy(dst.get(), pageable.data.get(), bytes, 1).status());

    std::vector<double> call_seconds;
    std::unique_ptr<DeviceBatch> last;
    ASSIGN_OR_RETURN(const Rate up, Measure(flags.reps, copies * bytes, [&] {
                       return RunUploader(uploader, ring, copies, 2, {}, &call_seconds, &last);
                     }));
    RETURN_IF_ERROR(CheckSame(last->tensors()[0].data, HostData(*last), bytes,
                              StrCat("uploader, ", mib, " MiB")));
    last.reset();
    ASSIGN_OR_RETURN(const Rate pin, Measure(flags.reps, copies * bytes, [&] {
                       return RunMemcpy(dst.get(), pinned.get(), bytes, copies);
                     }));
    RETURN_IF_ERROR(CheckSame(dst.get(), ring[0].buffer->data(), bytes,
                              StrCat("cudaMemcpy pinned, ", mib, " MiB")));
    ASSIGN_OR_RETURN(const Rate page, Measure(flags.reps, copies * bytes, [&] {
                       return RunMemcpy(dst.get(), pageable.data.get(), bytes, copies);
                     }));
    RETURN_IF_ERROR(CheckSame(dst.get(), ring[0].buffer->data(), bytes,
                              StrCat("cudaMemcpy pageable, ", mib, " MiB")));
    const double call_us = Median(call_seconds) * 1e6;
    const double spread = 100 * (up.fastest - up.slowest) / 2 / up.gb_per_s;
    absl::StrAppendFormat(&table,
                          "%-8s %6d   %13.2f %5.0f   %13.2f %6.2f   %15.2f %6.2f   "
                          "%.0f us (the copy: %.0f us)\n",
                          StrCat(mib, " MiB"), copies, up.gb_per_s, spread, pin.gb_per_s,
                          up.gb_per_s / pin.gb_per_s, page.gb_per_s, up.gb_per_s / page.gb_per_s,
                          call_us, bytes / up.gb_per_s / 1e3);
    results.push_back({{"batch_bytes", bytes},
                       {"copies_per_run", copies},
                       {"uploader", up.Json()},
                       {"uploader_call_us_median", call_us},
                       {"memcpy_pinned", pin.Json()},
                       {"memcpy_pageable", page.Json()},
                       {"ratio_vs_pinned", up.gb_per_s / pin.gb_per_s},
                       {"ratio_vs_pageable", up.gb_per_s / page.gb_per_s}});

    // Overlap: a consumer step as long as one copy. 1 buffer: copy and step in series (about 2
    // copy-times per batch); 2 buffers: the next copy runs during the step (about 1).
    const auto step = std::chrono::microseconds(static_cast<int64_t>(bytes / up.gb_per_s / 1e3));
    const uint64_t batches = std::max<uint64_t>(8, std::min<uint64_t>(copies, 64));
    double per_s[2] = {0, 0};
    for (int buffers : {1, 2}) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<Uploader> u,
          Uploader::Create({.device = flags.device, .buffers = buffers, .require_gpu = true}));
      RETURN_IF_ERROR(RunUploader(*u, ring, 2, buffers, {}, nullptr, nullptr).status());
      std::vector<double> rates;
      for (int r = 0; r < flags.reps; ++r) {
        ASSIGN_OR_RETURN(const double s,
                         RunUploader(*u, ring, batches, buffers, step, nullptr, nullptr));
        rates.push_back(batches / s);
      }
      per_s[buffers - 1] = Median(rates);
    }
    absl::StrAppendFormat(&overlap_table, "%-8s %10.2f   %14.1f %14.1f %7.2f\n",
                          StrCat(mib, " MiB"), step.count() / 1e3, per_s[0], per_s[1],
                          per_s[1] / per_s[0]);
    overlap.push_back({{"batch_bytes", bytes},
                       {"step_us", step.count()},
                       {"batches_per_run", batches},
                       {"one_buffer_batches_per_s", per_s[0]},
                       {"two_buffers_batches_per_s", per_s[1]},
                       {"ratio", per_s[1] / per_s[0]}});
  }
  std::cout << "host -> device, GB/s = 10^9 bytes/s, median of " << flags.reps
            << " runs; ratio = uploader / baseline\n"
            << table << "\n"
            << "overlap: consumer step (host sleep) as long as one copy; batches per second\n"
            << overlap_table << "\n";
  doc["results"] = results;
  doc["overlap"] = overlap;
  return absl::OkStatus();
}

#endif  // CONVEYOR_HAVE_CUDA

// No GPU: memcpy of the same sizes, and the Uploader's CPU path (no copy: hand-over only).
absl::Status RunCpu(const Flags& flags, Uploader& uploader, nlohmann::json& doc) {
  nlohmann::json results = nlohmann::json::array();
  std::string table = absl::StrFormat("%-8s %7s   %12s %7s   %22s\n", "batch", "copies",
                                      "memcpy GB/s", "+-%", "Upload() returns in");
  for (uint64_t mib : flags.sizes_mib) {
    const uint64_t bytes = mib * kMiB;
    const uint64_t copies = CopiesPerRun(bytes);
    PageableBuffer src(bytes), dst(bytes);
    ASSIGN_OR_RETURN(const Rate rate, Measure(flags.reps, copies * bytes, [&] {
                       const auto start = Clock::now();
                       for (uint64_t i = 0; i < copies; ++i) {
                         std::memcpy(dst.data.get(), src.data.get(), bytes);
                       }
                       return absl::StatusOr<double>(Seconds(start));
                     }));
    if (std::memcmp(dst.data.get(), src.data.get(), bytes) != 0) {
      return absl::DataLossError("memcpy: destination differs");
    }
    const std::vector<Batch> ring = {MakeBatch(bytes, mib, 0)};
    std::vector<double> call_seconds;
    std::unique_ptr<DeviceBatch> last;
    RETURN_IF_ERROR(RunUploader(uploader, ring, 1000, 2, {}, &call_seconds, &last).status());
    if (std::memcmp(last->tensors()[0].data, ring[0].buffer->data(), bytes) != 0) {
      return absl::DataLossError("uploader CPU path: tensor differs from the batch");
    }
    const double call_us = Median(call_seconds) * 1e6;
    absl::StrAppendFormat(&table, "%-8s %7d   %12.2f %7.0f   %19.2f us\n", StrCat(mib, " MiB"),
                          copies, rate.gb_per_s,
                          100 * (rate.fastest - rate.slowest) / 2 / rate.gb_per_s, call_us);
    results.push_back({{"batch_bytes", bytes},
                       {"copies_per_run", copies},
                       {"memcpy", rate.Json()},
                       {"uploader_call_us_median", call_us}});
  }
  std::cout << "memcpy host -> host, GB/s = 10^9 bytes/s, median of " << flags.reps
            << " runs; the Uploader's CPU path copies nothing (its tensors point into the batch)\n"
            << table << "\n";
  doc["results"] = results;
  return absl::OkStatus();
}

absl::Status Run(const Flags& flags) {
  const std::string load_before = LoadAverage();
  ASSIGN_OR_RETURN(std::unique_ptr<Uploader> uploader,
                   Uploader::Create({.device = flags.device, .buffers = 2}));
  nlohmann::json doc = {{"benchmark", "upload_bench"},
                        {"machine",
                         {{"cpus", std::thread::hardware_concurrency()},
                          {"cpu_model", CpuModel()},
                          {"load_average_before", load_before}}},
                        {"path", uploader->gpu() ? "gpu" : "cpu"},
                        {"units", "GB/s = 10^9 bytes per second"},
                        {"reps", flags.reps},
                        {"statistic", "median"},
                        {"min_bytes_per_run", kMinBytesPerRun}};
  std::cout << "upload_bench: " << std::thread::hardware_concurrency() << " CPUs, " << CpuModel()
            << "; load average before: " << load_before << "\n";
  if (uploader->gpu()) {
#if CONVEYOR_HAVE_CUDA
    RETURN_IF_ERROR(RunGpu(flags, *uploader, doc));
#endif
  } else {
    std::cout << "no GPU: " << uploader->cpu_reason() << "\n\n";
    doc["no_gpu_reason"] = uploader->cpu_reason();
    RETURN_IF_ERROR(RunCpu(flags, *uploader, doc));
  }
  doc["machine"]["load_average_after"] = LoadAverage();
  std::cout << "JSON " << doc.dump() << "\n";
  if (!flags.json_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(flags.json_path).parent_path(), ec);
    std::ofstream out(flags.json_path, std::ios::trunc);
    out << doc.dump(2) << "\n";
    if (!out) return absl::UnavailableError("cannot write " + flags.json_path);
    std::cout << "upload_bench: wrote " << flags.json_path << "\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  absl::Status status = conveyor::Run(conveyor::ParseFlags(argc, argv));
  if (!status.ok()) {
    std::cerr << "upload_bench: " << status << "\n";
    return 1;
  }
  return 0;
}
