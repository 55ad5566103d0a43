// read_bench: range-read throughput of Conveyor's storage backends, beside the command-line tools
// that read the same bytes.
//
// It writes a file of random bytes to a temp dir, warms the page cache by reading it once, starts
// its own nginx on 127.0.0.1, then times workloads (backend x pattern x range size x threads)
// through Storage/RandomAccessFile, and baselines measured in the same run:
//   cat FILE > /dev/null          the local file, whole
//   dd if=FILE bs=RANGE           the local file, whole, in blocks of the range size
//   curl -s -o /dev/null URL      the file over HTTP from the same nginx, whole, one connection
// Local workloads are compared with dd of the same block size, HTTP ones with curl. Each figure is
// the median of --reps runs (the JSON also has the slowest and fastest). After every run, each
// thread's last buffer is compared with the same range read from the local file. It prints a table
// and one JSON line, and writes the JSON to --json.
//
// Usage: read_bench [--size_mib=256] [--reps=5] [--json=FILE]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bench/machine_info.h"
#include "base/status_macros.h"
#include "base/worker_pool.h"
#include "base/strings.h"
#include "nlohmann/json.hpp"
#include "storage/storage.h"
#include "tests/support/nginx_server.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::NginxServer;
using testing::TempDir;

constexpr uint64_t kMiB = 1024 * 1024;
constexpr char kFileName[] = "bench.bin";

struct Flags {
  uint64_t size_mib = 256;
  int reps = 5;
  std::string json_path;
};

// Only for bad flags: it exits before anything needs cleaning up.
[[noreturn]] void Die(std::string_view message) {
  std::cerr << "read_bench: " << message << "\n";
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--size_mib=")) {
      if (!absl::SimpleAtoi(arg, &flags.size_mib) || flags.size_mib < 8) {
        Die("--size_mib needs a number >= 8");
      }
    } else if (absl::ConsumePrefix(&arg, "--reps=")) {
      if (!absl::SimpleAtoi(arg, &flags.reps) || flags.reps < 1) Die("--reps needs a number >= 1");
    } else if (absl::ConsumePrefix(&arg, "--json=")) {
      flags.json_path = std::string(arg);
    } else {
      Die(StrCat("unknown flag ", argv[i],
                 "\nusage: read_bench [--size_mib=256] [--reps=5] [--json=FILE]"));
    }
  }
  return flags;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string SizeName(uint64_t bytes) {
  if (bytes % kMiB == 0) return StrCat(bytes / kMiB, " MiB");
  return StrCat(bytes / 1024, " KiB");
}

// dd's spelling of a block size.
std::string DdBlockSize(uint64_t bytes) {
  if (bytes % kMiB == 0) return StrCat(bytes / kMiB, "M");
  return StrCat(bytes / 1024, "K");
}

absl::Status WriteRandomFile(const std::string& path, uint64_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::mt19937_64 rng(42);
  std::vector<uint64_t> chunk(kMiB / sizeof(uint64_t));
  for (uint64_t done = 0; done < size; done += kMiB) {
    for (uint64_t& w : chunk) w = rng();
    out.write(reinterpret_cast<const char*>(chunk.data()),
              static_cast<std::streamsize>(std::min<uint64_t>(kMiB, size - done)));
  }
  if (!out) return absl::UnavailableError("cannot write " + path);
  return absl::OkStatus();
}

// Runs `command`, whose last line of output is a duration in seconds, and returns it.
absl::StatusOr<double> RunTimed(const std::string& command) {
  testing::CommandResult r = testing::RunCommand(command, 120);
  absl::string_view out = r.output;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.remove_suffix(1);
  double seconds = 0;
  const size_t last_line = out.rfind('\n');
  if (r.exit_code != 0 ||
      !absl::SimpleAtod(out.substr(last_line == absl::string_view::npos ? 0 : last_line + 1),
                        &seconds) ||
      seconds <= 0) {
    return absl::InternalError(StrCat("baseline command failed: ", command, "\n", r.output));
  }
  return seconds;
}

// A command-line tool reading the same bytes. Where the tool reports its own transfer time (dd,
// curl) that time is used, so process start-up is not counted; `cat` is timed in the shell around
// it, which adds about a millisecond (its fork and exec).
struct Baseline {
  std::string name;
  std::string command;  // what is timed
  std::string timing;   // where the time comes from
  double mib_per_s = 0;
};

absl::StatusOr<Baseline> MeasureBaseline(std::string name, std::string command,
                                         std::string timed_command, std::string timing,
                                         uint64_t bytes, int reps) {
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    ASSIGN_OR_RETURN(const double seconds, RunTimed(timed_command));
    rates.push_back(static_cast<double>(bytes) / kMiB / seconds);
  }
  return Baseline{std::move(name), std::move(command), std::move(timing), Median(rates)};
}

absl::StatusOr<Baseline> Cat(const std::string& qpath, uint64_t bytes, int reps) {
  const std::string command = "cat " + qpath + " > /dev/null";
  return MeasureBaseline(
      "cat", command,
      StrCat("s=$(date +%s%N); ", command, " || exit 1; e=$(date +%s%N); echo \"$((e - s))e-9\""),
      "shell clock around cat", bytes, reps);
}

absl::StatusOr<Baseline> Dd(const std::string& qpath, uint64_t block, uint64_t bytes, int reps) {
  const std::string command = StrCat("dd if=", qpath, " of=/dev/null bs=", DdBlockSize(block));
  // dd's last line: "N bytes (...) copied, 0.0412 s, 6.5 GB/s".
  return MeasureBaseline("dd bs=" + DdBlockSize(block), command,
                         command + " 2>&1 | sed -n 's/.* copied, \\([0-9.e-]*\\) s,.*/\\1/p'",
                         "dd's own report", bytes, reps);
}

absl::StatusOr<Baseline> Curl(const std::string& url, uint64_t bytes, int reps) {
  const std::string command = "curl -sf -o /dev/null " + testing::ShellQuote(url);
  return MeasureBaseline("curl", command, command + " -w '%{time_total}\\n'",
                         "curl's time_total (connect included)", bytes, reps);
}

enum class Pattern { kSequential, kRandom };

struct Workload {
  std::string backend;  // "local" or "http"
  Pattern pattern;
  uint64_t range;
  int threads;
};

// Reads the whole file's worth of bytes in `range`-sized reads split over `threads` threads and
// returns the elapsed seconds. Sequential: each thread reads one contiguous share in order.
// Random: offsets uniform over the file (not aligned), the same for every run. Afterwards (not
// timed) each thread's last read is checked against `reference`.
absl::StatusOr<double> RunWorkload(const RandomAccessFile& file, const RandomAccessFile& reference,
                                   const Workload& w) {
  const uint64_t count = file.size() / w.range;
  std::vector<std::vector<char>> buffers(w.threads, std::vector<char>(w.range, 1));
  // The offset of each thread's last read; none when the file has fewer ranges than threads.
  std::vector<std::optional<uint64_t>> last_offsets(w.threads);
  std::vector<absl::Status> errors(w.threads);
  const auto start = std::chrono::steady_clock::now();
  {
    WorkerPool pool("read-bench", w.threads, [&](int t) {
      std::mt19937_64 rng(1000 + t);
      const uint64_t first = count * t / w.threads;
      const uint64_t last = count * (t + 1) / w.threads;
      for (uint64_t i = first; i < last; ++i) {
        const uint64_t offset =
            w.pattern == Pattern::kSequential ? i * w.range : rng() % (file.size() - w.range + 1);
        absl::Status s = file.Read(offset, w.range, buffers[t].data());
        if (!s.ok()) {
          errors[t] = s;
          return;
        }
        last_offsets[t] = offset;
      }
    });
  }  // joins
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<char> expected(w.range);
  for (int t = 0; t < w.threads; ++t) {
    RETURN_IF_ERROR(errors[t]);
    if (!last_offsets[t].has_value()) continue;
    RETURN_IF_ERROR(reference.Read(*last_offsets[t], w.range, expected.data()));
    if (expected != buffers[t]) {
      return absl::DataLossError(StrCat(file.name(), ": bytes at offset ", *last_offsets[t],
                                        " differ from the local file"));
    }
  }
  return seconds;
}

using bench::CpuModel;
using bench::LoadAverage;

absl::Status Run(const Flags& flags) {
  const uint64_t size = flags.size_mib * kMiB;
  const std::string load_before = LoadAverage();

  TempDir dir;
  const std::string path = dir.Join(kFileName);
  RETURN_IF_ERROR(WriteRandomFile(path, size));
  const std::string qpath = testing::ShellQuote(path);
  // Warm the page cache, so every figure below is memory and CPU bound, never disk bound.
  RETURN_IF_ERROR(Cat(qpath, size, 1).status());

  ASSIGN_OR_RETURN(std::unique_ptr<NginxServer> nginx,
                   NginxServer::Start(dir.path(), {.access_log = false}));
  const std::string url = nginx->base_url() + kFileName;

  std::unique_ptr<Storage> local = NewLocalStorage(dir.path());
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> http, NewHttpStorage(nginx->base_url(), HttpOptions()));
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> local_file, local->Open(kFileName));
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> http_file, http->Open(kFileName));

  // Both backends must return the file's bytes before their speed means anything.
  {
    std::string a(3 * kMiB + 5, '\0'), b(3 * kMiB + 5, '\0');
    const uint64_t offset = size / 2 + 12345;
    RETURN_IF_ERROR(local_file->Read(offset, a.size(), a.data()));
    RETURN_IF_ERROR(http_file->Read(offset, b.size(), b.data()));
    if (a != b) return absl::DataLossError("local and HTTP reads of the same range differ");
  }

  const std::vector<uint64_t> ranges = {64 * 1024, kMiB, 8 * kMiB};
  // Local workloads are compared with dd of their block size, HTTP ones with curl.
  std::vector<Baseline> baselines;
  std::map<uint64_t, size_t> dd_baseline;  // range -> index in `baselines`
  ASSIGN_OR_RETURN(Baseline cat, Cat(qpath, size, flags.reps));
  baselines.push_back(std::move(cat));
  for (uint64_t range : ranges) {
    ASSIGN_OR_RETURN(Baseline dd, Dd(qpath, range, size, flags.reps));
    dd_baseline[range] = baselines.size();
    baselines.push_back(std::move(dd));
  }
  ASSIGN_OR_RETURN(Baseline curl, Curl(url, size, flags.reps));
  const size_t curl_baseline = baselines.size();
  baselines.push_back(std::move(curl));

  nlohmann::json results = nlohmann::json::array();
  std::string table =
      absl::StrFormat("%-6s %-10s %-7s %7s %9s %6s %9s   %-10s %9s %6s\n", "store", "pattern",
                      "range", "threads", "MiB/s", "+-%", "reads/s", "baseline", "MiB/s", "ratio");
  for (const std::string backend : {"local", "http"}) {
    const RandomAccessFile& file = backend == "local" ? *local_file : *http_file;
    Storage& storage = backend == "local" ? *local : *http;
    for (Pattern pattern : {Pattern::kSequential, Pattern::kRandom}) {
      for (uint64_t range : ranges) {
        for (int threads : {1, 2}) {
          const Workload w{backend, pattern, range, threads};
          const StorageStats before = storage.stats();
          std::vector<double> seconds;
          for (int i = 0; i < flags.reps; ++i) {
            ASSIGN_OR_RETURN(const double s, RunWorkload(file, *local_file, w));
            seconds.push_back(s);
          }
          const StorageStats after = storage.stats();
          const uint64_t reads_per_run = size / range;
          const double secs = Median(seconds);
          const double mib = static_cast<double>(reads_per_run * range) / kMiB;
          const double mib_per_s = mib / secs;
          // Slowest and fastest run, as a spread around the median in percent.
          const auto [fastest, slowest] = std::minmax_element(seconds.begin(), seconds.end());
          const double spread = 100 * (mib / *fastest - mib / *slowest) / 2 / mib_per_s;
          const Baseline& base =
              baselines[backend == "http" ? curl_baseline : dd_baseline.at(range)];
          const std::string pattern_name =
              pattern == Pattern::kSequential ? "sequential" : "random";
          absl::StrAppendFormat(
              &table, "%-6s %-10s %-7s %7d %9.0f %6.0f %9.0f   %-10s %9.0f %6.2f\n", backend,
              pattern_name, SizeName(range), threads, mib_per_s, spread, reads_per_run / secs,
              base.name, base.mib_per_s, mib_per_s / base.mib_per_s);
          results.push_back(
              {{"backend", backend},
               {"pattern", pattern_name},
               {"range_bytes", range},
               {"threads", threads},
               {"mib_per_s", mib_per_s},
               {"mib_per_s_slowest", mib / *slowest},
               {"mib_per_s_fastest", mib / *fastest},
               {"reads_per_s", reads_per_run / secs},
               {"baseline", base.name},
               {"baseline_mib_per_s", base.mib_per_s},
               {"ratio", mib_per_s / base.mib_per_s},
               {"retries", after.retries - before.retries},
               {"connections_opened", after.connections_opened - before.connections_opened}});
        }
      }
    }
  }

  const std::string machine = StrCat(std::thread::hardware_concurrency(), " CPUs, ", CpuModel());
  std::cout << "read_bench: " << flags.size_mib << " MiB file of random bytes, page cache warm "
            << "(read once with cat before timing); nginx " << nginx->base_url()
            << " (sendfile on, access log off); median of " << flags.reps << " runs\n"
            << "machine: " << machine << "; load average before: " << load_before << "\n\n"
            << "baselines (whole file, one process, one stream):\n";
  for (const Baseline& b : baselines) {
    std::cout << absl::StrFormat("  %-10s %9.0f MiB/s   %s   [%s]\n", b.name, b.mib_per_s,
                                 b.command, b.timing);
  }
  std::cout << "\n" << table << "\n";

  nlohmann::json doc = {{"benchmark", "read_bench"},
                        {"machine",
                         {{"cpus", std::thread::hardware_concurrency()},
                          {"cpu_model", CpuModel()},
                          {"load_average_before", load_before},
                          {"load_average_after", LoadAverage()}}},
                        {"file_mib", flags.size_mib},
                        {"page_cache", "warm: the file was read once with cat before timing"},
                        {"reps", flags.reps},
                        {"statistic", "median"},
                        {"baselines", nlohmann::json::array()},
                        {"results", results}};
  for (const Baseline& b : baselines) {
    doc["baselines"].push_back({{"name", b.name},
                                {"command", b.command},
                                {"timing", b.timing},
                                {"mib_per_s", b.mib_per_s}});
  }
  std::cout << "JSON " << doc.dump() << "\n";
  if (!flags.json_path.empty()) {
    std::ofstream out(flags.json_path, std::ios::trunc);
    out << doc.dump(2) << "\n";
    if (!out) return absl::UnavailableError("cannot write " + flags.json_path);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  absl::Status status = conveyor::Run(conveyor::ParseFlags(argc, argv));
  if (!status.ok()) {
    std::cerr << "read_bench: " << status << "\n";
    return 1;
  }
  return 0;
}
