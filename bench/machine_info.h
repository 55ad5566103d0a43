// What the benchmarks record about the machine they ran on, beside their figures.
#pragma once

#include <fstream>
#include <string>

namespace conveyor::bench {

// The CPU model from /proc/cpuinfo ("unknown" when it is not there).
inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// The 1, 5 and 15 minute load averages from /proc/loadavg, as "a b c".
inline std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace conveyor::bench
