#include "client/launch_env.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::client {
namespace {

// One launcher's variables: rank and world size, optionally the local pair.
struct Launcher {
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
};

constexpr Launcher kTorchrun{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Launcher kOpenMpi{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};

// A non-negative integer below 2^32, or nullopt when unset.
absl::StatusOr<std::optional<int64_t>> Int(const EnvLookup& env, std::string_view name) {
  std::optional<std::string> v = env(name);
  if (!v) return std::optional<int64_t>();
  int64_t x = 0;
  if (!absl::SimpleAtoi(absl::string_view(*v), &x) || x < 0 || x > 0xffffffffll) {
    return absl::InvalidArgumentError(
        StrCat(name, "='", *v, "' is not a non-negative integer (a rank or a process count)"));
  }
  return std::optional<int64_t>(x);
}

// Both or neither of a pair: a rank without its world size is a launcher set up by hand, wrongly.
absl::Status BothOrNeither(const std::optional<int64_t>& a, std::string_view a_name,
                           const std::optional<int64_t>& b, std::string_view b_name) {
  if (a.has_value() == b.has_value()) return absl::OkStatus();
  const std::string_view set = a ? a_name : b_name, unset = a ? b_name : a_name;
  return absl::InvalidArgumentError(
      StrCat(set, " is set but ", unset, " is not: set both (launchers set both)"));
}

absl::Status CheckRank(int64_t rank, std::string_view rank_name, int64_t world,
                       std::string_view world_name) {
  if (world < 1) return absl::InvalidArgumentError(StrCat(world_name, " is ", world, ": need >= 1"));
  if (rank >= world) {
    return absl::InvalidArgumentError(StrCat(rank_name, " is ", rank, " but ", world_name, " is ",
                                             world, ": need ", rank_name, " < ", world_name));
  }
  return absl::OkStatus();
}

// SLURM_STEP_TASKS_PER_NODE is "2(x3),1": three nodes with 2 tasks, then one with 1. The count of
// node `node`, or nullopt when the text is not in that form.
std::optional<int64_t> TasksOnNode(const std::string& text, int64_t node) {
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t count = 0, repeat = 1;
    const size_t paren = part.find('(');
    if (paren == absl::string_view::npos) {
      if (!absl::SimpleAtoi(part, &count)) return std::nullopt;
    } else {
      if (part.size() < paren + 4 || part.substr(paren, 2) != "(x" || part.back() != ')' ||
          !absl::SimpleAtoi(part.substr(0, paren), &count) ||
          !absl::SimpleAtoi(part.substr(paren + 2, part.size() - paren - 3), &repeat)) {
        return std::nullopt;
      }
    }
    if (node < repeat) return count;
    node -= repeat;
  }
  return std::nullopt;
}

// Fills `out` from one of torchrun or Open MPI when its rank is set; false when it is not.
absl::StatusOr<bool> FromLauncher(const Launcher& l, const EnvLookup& env, LaunchEnv* out) {
  ASSIGN_OR_RETURN(std::optional<int64_t> rank, Int(env, l.rank));
  ASSIGN_OR_RETURN(std::optional<int64_t> world, Int(env, l.world));
  RETURN_IF_ERROR(BothOrNeither(rank, l.rank, world, l.world));
  if (!rank) return false;
  RETURN_IF_ERROR(CheckRank(*rank, l.rank, *world, l.world));
  ASSIGN_OR_RETURN(std::optional<int64_t> local_rank, Int(env, l.local_rank));
  ASSIGN_OR_RETURN(std::optional<int64_t> local_world, Int(env, l.local_world));
  if (local_world) {
    if (*local_world > *world) {
      return absl::InvalidArgumentError(StrCat(l.local_world, " is ", *local_world, " but ", l.world,
                                               " is ", *world, ": a node cannot hold more ranks than the job"));
    }
    if (local_rank) RETURN_IF_ERROR(CheckRank(*local_rank, l.local_rank, *local_world, l.local_world));
  }
  out->rank = static_cast<uint32_t>(*rank);
  out->world_size = static_cast<uint32_t>(*world);
  out->local_rank = static_cast<uint32_t>(local_rank.value_or(0));
  out->local_world_size = static_cast<uint32_t>(local_world.value_or(1));
  out->source = StrCat(l.rank, ", ", l.world);
  return true;
}

// SLURM: the step's task count (SLURM_STEP_NUM_TASKS, which SLURM_PROCID numbers), else
// SLURM_NTASKS (what jax.distributed.initialize() reads).
absl::StatusOr<bool> FromSlurm(const EnvLookup& env, LaunchEnv* out) {
  ASSIGN_OR_RETURN(std::optional<int64_t> rank, Int(env, "SLURM_PROCID"));
  ASSIGN_OR_RETURN(std::optional<int64_t> step_tasks, Int(env, "SLURM_STEP_NUM_TASKS"));
  ASSIGN_OR_RETURN(std::optional<int64_t> ntasks, Int(env, "SLURM_NTASKS"));
  const char* world_name = step_tasks ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  const std::optional<int64_t> world = step_tasks ? step_tasks : ntasks;
  if (!rank && !step_tasks) return false;  // SLURM_NTASKS alone: a batch script, not a task
  RETURN_IF_ERROR(BothOrNeither(rank, "SLURM_PROCID", world, world_name));
  RETURN_IF_ERROR(CheckRank(*rank, "SLURM_PROCID", *world, world_name));
  ASSIGN_OR_RETURN(std::optional<int64_t> local_rank, Int(env, "SLURM_LOCALID"));
  ASSIGN_OR_RETURN(std::optional<int64_t> node, Int(env, "SLURM_NODEID"));
  std::optional<int64_t> local_world;
  const char* per_node_name = "SLURM_STEP_TASKS_PER_NODE";
  std::optional<std::string> per_node = env(per_node_name);
  if (!per_node) {
    per_node_name = "SLURM_TASKS_PER_NODE";
    per_node = env(per_node_name);
  }
  if (per_node && node) local_world = TasksOnNode(*per_node, *node);
  if (local_world && local_rank) {
    RETURN_IF_ERROR(CheckRank(*local_rank, "SLURM_LOCALID", *local_world,
                              StrCat(per_node_name, "[SLURM_NODEID=", *node, "]")));
  }
  out->rank = static_cast<uint32_t>(*rank);
  out->world_size = static_cast<uint32_t>(*world);
  out->local_rank = static_cast<uint32_t>(local_rank.value_or(0));
  out->local_world_size = static_cast<uint32_t>(local_world.value_or(1));
  out->source = StrCat("SLURM_PROCID, ", world_name);
  return true;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

absl::StatusOr<LaunchEnv> ResolveLaunch(const LaunchOverrides& o, const EnvLookup& env) {
  // The launchers' view, also when the caller gives both values (local rank, the JAX check).
  LaunchEnv out;
  bool found = false;
  bool torchrun = false;
  for (const Launcher* l : {&kTorchrun, &kOpenMpi}) {
    ASSIGN_OR_RETURN(found, FromLauncher(*l, env, &out));
    torchrun = found && l == &kTorchrun;
    if (found) break;
  }
  if (!found) {
    ASSIGN_OR_RETURN(found, FromSlurm(env, &out));
  }
  if (!found) out.source = "default";
  // The names of what was read: "RANK, WORLD_SIZE" -> "RANK" and "WORLD_SIZE".
  const size_t comma = out.source.find(", ");
  const std::string env_rank = found ? out.source.substr(0, comma) : "the default rank";
  const std::string env_world = found ? out.source.substr(comma + 2) : "the default world size";

  if (o.from_jax && o.world_size && found && !torchrun &&
      static_cast<int64_t>(out.world_size) != *o.world_size) {
    // jax.distributed.initialize() took its count from these same variables unless it was
    // given another: two views of one job that disagree.
    return absl::InvalidArgumentError(StrCat(
        o.world_size_name, " is ", *o.world_size, " but ", env_world, " is ", out.world_size,
        ": pass rank= and world_size= to say which is right"));
  }
  if (o.rank || o.world_size) {
    const int64_t rank = o.rank.value_or(out.rank);
    const int64_t world = o.world_size.value_or(out.world_size);
    const std::string rank_name = o.rank ? o.rank_name : env_rank;
    const std::string world_name = o.world_size ? o.world_size_name : env_world;
    if (rank < 0) return absl::InvalidArgumentError(StrCat(rank_name, " is ", rank, ": need >= 0"));
    RETURN_IF_ERROR(CheckRank(rank, rank_name, world, world_name));
    if (world > 0xffffffffll) {
      return absl::InvalidArgumentError(StrCat(world_name, " is ", world, ": at most 2^32 - 1"));
    }
    out.rank = static_cast<uint32_t>(rank);
    out.world_size = static_cast<uint32_t>(world);
    out.source = StrCat(rank_name, ", ", world_name);
    if (out.local_world_size > out.world_size) {  // the launcher's node view no longer applies
      out.local_rank = 0;
      out.local_world_size = 1;
    }
  }

  std::string list = o.servers;
  out.servers_source = "explicit";
  if (list.empty()) {
    list = env("CONVEYOR_SERVERS").value_or("");
    out.servers_source = "CONVEYOR_SERVERS";
  }
  for (absl::string_view s : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    out.servers.emplace_back(absl::StripAsciiWhitespace(s));
  }
  if (out.servers.empty()) {
    out.servers_source.clear();
    if (o.servers_required) {
      return absl::InvalidArgumentError(
          "no server given: pass the servers (--servers HOST:PORT[,HOST:PORT...], servers=[...]) "
          "or set CONVEYOR_SERVERS");
    }
  }
  return out;
}

}  // namespace conveyor::client
