// What the kernel charges for memory a process touches for the first time, per GB: the price a
// decoded-frame cache pays in its first epoch for every frame it keeps (bench/RESULTS.md
// "Decoded-frame cache", epoch 1). Each row maps fresh anonymous chunks of 64 MiB and writes every
// byte once, as copying frames into a cache would; the baseline writes the same bytes again into
// memory already touched (the cost of the writing alone). CPU seconds (user + system, getrusage)
// rather than wall time, so that a busy machine changes little.
//
//   fresh_memory_bench [--gb=2] [--json=FILE]
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace {

struct Cpu {
  double user = 0, sys = 0;
  long faults = 0;
};

Cpu Now() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return Cpu{r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6, r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6,
             r.ru_minflt};
}

constexpr size_t kChunk = size_t{64} << 20;

enum class Mode { kTouched, kFaults, kPopulate, kHugePages };

// Writes `total` bytes in chunks; returns what it cost.
Cpu Run(Mode mode, size_t total) {
  std::vector<void*> chunks;
  void* touched = nullptr;
  if (mode == Mode::kTouched) {
    touched = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::memset(touched, 0, kChunk);
  }
  const Cpu a = Now();
  for (size_t done = 0; done < total; done += kChunk) {
    void* p = touched;
    if (mode != Mode::kTouched) {
      const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (mode == Mode::kPopulate ? MAP_POPULATE : 0);
      p = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, flags, -1, 0);
      if (p == MAP_FAILED) {
        std::perror("mmap");
        std::exit(1);
      }
      if (mode == Mode::kHugePages) madvise(p, kChunk, MADV_HUGEPAGE);
      chunks.push_back(p);
    }
    std::memset(p, static_cast<int>(done >> 26) | 1, kChunk);
  }
  const Cpu b = Now();
  for (void* p : chunks) munmap(p, kChunk);
  if (touched) munmap(touched, kChunk);
  return Cpu{b.user - a.user, b.sys - a.sys, b.faults - a.faults};
}

}  // namespace

int main(int argc, char** argv) {
  double gb = 2;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--gb=", 0) == 0) {
      gb = std::stod(a.substr(5));
    } else if (a.rfind("--json=", 0) == 0) {
      json_path = a.substr(7);
    } else {
      std::fprintf(stderr, "usage: fresh_memory_bench [--gb=2] [--json=FILE]\n");
      return 2;
    }
  }
  if (!(gb > 0 && gb <= 64)) {
    std::fprintf(stderr, "--gb must be in (0, 64]\n");
    return 2;
  }
  const size_t total = static_cast<size_t>(gb * (1 << 30)) / kChunk * kChunk;
  const double g = static_cast<double>(total) / 1e9;
  struct Row {
    const char* name;
    Mode mode;
  };
  const Row rows[] = {{"memset into memory already touched (baseline)", Mode::kTouched},
                      {"fresh 4 KiB pages, first-touch faults", Mode::kFaults},
                      {"fresh, mmap(MAP_POPULATE)", Mode::kPopulate},
                      {"fresh, madvise(MADV_HUGEPAGE)", Mode::kHugePages}};
  nlohmann::json out = nlohmann::json::array();
  std::printf("%-48s %12s %12s %12s %10s\n", "writing fresh memory", "cpu s/GB", "user s/GB", "sys s/GB",
              "faults/GB");
  for (int pass = 0; pass < 2; ++pass) {  // the first pass warms up; the second is reported
    for (const Row& r : rows) {
      const Cpu c = Run(r.mode, total);
      if (pass == 0) continue;
      std::printf("%-48s %12.3f %12.3f %12.3f %10.0f\n", r.name, (c.user + c.sys) / g, c.user / g, c.sys / g,
                  c.faults / g);
      out.push_back({{"bench", "fresh_memory"},
                     {"row", r.name},
                     {"gb", g},
                     {"cpu_s_per_gb", (c.user + c.sys) / g},
                     {"user_s_per_gb", c.user / g},
                     {"sys_s_per_gb", c.sys / g},
                     {"faults_per_gb", c.faults / g}});
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
