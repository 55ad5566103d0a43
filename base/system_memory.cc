#include "base/system_memory.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

namespace conveyor {
namespace {

// The value of a one-number file ("max" and absurd values count as no limit): 0 when none.
uint64_t ReadLimit(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text == "max") return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || v == 0 || v >= (1ull << 60)) return 0;  // cgroup v1's "unlimited"
  return v;
}

// The directories of this process's memory cgroup: v2's ("0::/path") under /sys/fs/cgroup, and
// v1's ("N:...memory...:/path") under /sys/fs/cgroup/memory; "" for one that is not there.
void CgroupDirs(std::string* v2, std::string* v1) {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("0::", 0) == 0) {
      *v2 = "/sys/fs/cgroup" + line.substr(3);
      continue;
    }
    const size_t a = line.find(':');
    const size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (controllers.find(",memory,") != std::string::npos) {
      *v1 = "/sys/fs/cgroup/memory" + line.substr(b + 1);
    }
  }
}

// The tightest limit from `dir` up to `root` in file `name`; 0 when none.
uint64_t TightestLimit(std::string dir, const std::string& root, const std::string& name,
                       std::string* where) {
  uint64_t best = 0;
  while (!dir.empty()) {
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const uint64_t limit = ReadLimit(dir + "/" + name);
    if (limit != 0 && (best == 0 || limit < best)) {
      best = limit;
      *where = dir + "/" + name;
    }
    if (dir.size() <= root.size()) break;
    dir = dir.substr(0, dir.rfind('/'));
  }
  return best;
}

}  // namespace

SystemMemory ProbeSystemMemory() {
  SystemMemory m;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit) {
    if (key == "MemTotal:") {
      m.bytes = kb * 1024;
      m.source = "MemTotal";
      break;
    }
  }
  std::string v2, v1;
  CgroupDirs(&v2, &v1);
  for (const auto& [dir, root, name] :
       {std::tuple<std::string, std::string, std::string>{v2, "/sys/fs/cgroup", "memory.max"},
        {v1, "/sys/fs/cgroup/memory", "memory.limit_in_bytes"}}) {
    std::string where;
    const uint64_t limit = TightestLimit(dir, root, name, &where);
    if (limit != 0 && (m.bytes == 0 || limit < m.bytes)) {
      m.bytes = limit;
      m.source = where;
    }
  }
  return m;
}

}  // namespace conveyor
