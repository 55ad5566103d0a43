// How much memory this process may use: the machine's (MemTotal of /proc/meminfo) or, when the
// process runs in a memory-limited cgroup (a container, a SLURM job with --mem, a systemd slice),
// that limit, whichever is smaller.
#pragma once

#include <cstdint>
#include <string>

namespace conveyor {

struct SystemMemory {
  uint64_t bytes = 0;   // min(machine, cgroup); 0 when neither could be read
  std::string source;   // "MemTotal" or the cgroup file the limit came from
};

SystemMemory ProbeSystemMemory();

}  // namespace conveyor
