// Where a training process stands in its job: its rank (the consumer slice it streams), the
// world size (the number of slices), its local rank on the node, and the data servers. One
// function reads what the launchers set, so the C++ client, the CLI (`conveyor fetch`, `train`)
// and the Python Loader (through the pybind module) agree; docs/launch.md has the table.
//
// Precedence, first match wins:
//   1. explicit values (flags, Loader arguments, jax.process_index()/process_count());
//   2. torchrun (torch.distributed.run): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE;
//   3. Open MPI (mpirun): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
//   4. SLURM (srun): SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
//      the node's count from SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE) and
//      SLURM_NODEID;
//   5. rank 0 of 1.
// torchrun comes before SLURM because torchrun inside an srun task is the usual GPU setup: there
// SLURM_PROCID numbers the nodes' tasks and RANK the GPU processes. JAX documents no variable
// of its own for the process index: jax.distributed.initialize() reads the SLURM and Open MPI
// variables above, and the Python helper passes jax.process_index() explicitly.
//
// Servers: explicit list, else $CONVEYOR_SERVERS (comma-separated; any gRPC target).
//
// Errors (INVALID_ARGUMENT), each naming the variables involved: a value that is not a
// non-negative integer, a rank without its world size (or the reverse), rank >= world size,
// local rank >= local world size, a local world larger than the world, a JAX process count
// that disagrees with the SLURM/Open MPI world that jax.distributed.initialize() read, no server.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::client {

// What the caller knows itself; unset fields come from the environment.
struct LaunchOverrides {
  std::optional<int64_t> rank;
  std::optional<int64_t> world_size;
  // How these values are named in messages: "--consumer" and "--consumers", "rank=" and
  // "world_size=", "jax.process_index()" and "jax.process_count()".
  std::string rank_name = "rank";
  std::string world_size_name = "world size";
  // The values come from jax.process_index()/process_count(): they are then checked against the
  // SLURM/Open MPI variables jax.distributed.initialize() reads itself.
  bool from_jax = false;
  std::string servers;  // comma-separated; empty: $CONVEYOR_SERVERS
  bool servers_required = true;
};

struct LaunchEnv {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t local_rank = 0;        // the process's index on its node (which GPU it drives)
  uint32_t local_world_size = 1;  // processes on this node
  // Where rank and world size came from, the names of what was read: "RANK, WORLD_SIZE",
  // "--consumer, SLURM_STEP_NUM_TASKS", "default" (nothing set).
  std::string source;
  std::vector<std::string> servers;
  std::string servers_source;     // "explicit" or "CONVEYOR_SERVERS"; empty when none
};

// Looks a variable up; std::nullopt when unset. Empty values count as unset.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// The process's environment (getenv).
EnvLookup ProcessEnv();

absl::StatusOr<LaunchEnv> ResolveLaunch(const LaunchOverrides& overrides,
                                        const EnvLookup& env = ProcessEnv());

}  // namespace conveyor::client
