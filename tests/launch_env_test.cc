// client/launch_env.h: rank, world size and servers from what torchrun, Open MPI and SLURM set,
// with the precedence docs/launch.md states and errors that name the variables. The variable
// sets below are what the launchers set (torchrun 2 nodes x 4 GPUs under srun; SLURM 22.05 in a
// heterogeneous job's second component, as tests/slurm runs it).
#include "client/launch_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <ostream>
#include <string>

namespace conveyor::client {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup Env(Vars vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

LaunchOverrides NoServersNeeded() {
  LaunchOverrides o;
  o.servers_required = false;
  return o;
}

TEST(LaunchEnvTest, NothingSetIsRankZeroOfOne) {
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(NoServersNeeded(), Env({}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 0u);
  EXPECT_EQ(e->world_size, 1u);
  EXPECT_EQ(e->local_rank, 0u);
  EXPECT_EQ(e->local_world_size, 1u);
  EXPECT_TRUE(e->servers.empty());
}

TEST(LaunchEnvTest, Torchrun) {
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(
      NoServersNeeded(),
      Env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 5u);
  EXPECT_EQ(e->world_size, 8u);
  EXPECT_EQ(e->local_rank, 1u);
  EXPECT_EQ(e->local_world_size, 4u);
  EXPECT_EQ(e->source, "RANK, WORLD_SIZE");
}

TEST(LaunchEnvTest, TorchrunInsideAnSrunTaskWins) {
  // srun -N2 --ntasks-per-node=1 torchrun --nproc-per-node=4: SLURM numbers the node tasks,
  // torchrun the GPU processes; the consumer slice is the process's.
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(
      NoServersNeeded(), Env({{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"},
                              {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"RANK", "6"},
                              {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 6u);
  EXPECT_EQ(e->world_size, 8u);
  EXPECT_EQ(e->local_rank, 2u);
}

TEST(LaunchEnvTest, SlurmStepOfAHeterogeneousJob) {
  // srun --het-group=1 of a job whose component 1 has 2 tasks on one node.
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(
      NoServersNeeded(),
      Env({{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_NTASKS", "2"},
           {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2"},
           {"SLURM_JOB_ID", "17"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 1u);
  EXPECT_EQ(e->world_size, 2u);
  EXPECT_EQ(e->local_rank, 1u);
  EXPECT_EQ(e->local_world_size, 2u);
  EXPECT_EQ(e->source, "SLURM_PROCID, SLURM_STEP_NUM_TASKS");
}

TEST(LaunchEnvTest, SlurmTasksPerNodeInItsCompressedForm) {
  // 3 nodes with 2 tasks, then 1 node with 1: the last node's only task.
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(
      NoServersNeeded(),
      Env({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "0"},
           {"SLURM_NODEID", "3"}, {"SLURM_TASKS_PER_NODE", "2(x3),1"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 6u);
  EXPECT_EQ(e->world_size, 7u);
  EXPECT_EQ(e->local_world_size, 1u);
  EXPECT_EQ(e->source, "SLURM_PROCID, SLURM_NTASKS");
  e = ResolveLaunch(NoServersNeeded(),
                    Env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "1"},
                         {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2(x3),1"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->local_world_size, 2u);
}

TEST(LaunchEnvTest, SlurmBatchScriptIsNotATask) {
  // The batch script has SLURM_NTASKS (the job's) but is no task of a step: no rank from it.
  absl::StatusOr<LaunchEnv> e =
      ResolveLaunch(NoServersNeeded(), Env({{"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "17"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->world_size, 1u);
}

TEST(LaunchEnvTest, OpenMpi) {
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(
      NoServersNeeded(),
      Env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
           {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));  // mpirun inside a batch script
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3u);
  EXPECT_EQ(e->world_size, 4u);
  EXPECT_EQ(e->local_rank, 1u);
  EXPECT_EQ(e->source, "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE");
}

TEST(LaunchEnvTest, ExplicitValuesWin) {
  LaunchOverrides o = NoServersNeeded();
  o.rank = 0;
  o.world_size = 1;
  o.rank_name = "--consumer";
  o.world_size_name = "--consumers";
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(o, Env({{"RANK", "5"}, {"WORLD_SIZE", "8"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 0u);
  EXPECT_EQ(e->world_size, 1u);
  EXPECT_EQ(e->source, "--consumer, --consumers");
}

TEST(LaunchEnvTest, OneExplicitValueCompletesTheOtherFromTheEnvironment) {
  LaunchOverrides o = NoServersNeeded();
  o.rank = 3;
  o.rank_name = "--consumer";
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(o, Env({{"RANK", "1"}, {"WORLD_SIZE", "4"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3u);
  EXPECT_EQ(e->world_size, 4u);
  EXPECT_EQ(e->source, "--consumer, WORLD_SIZE");
  e = ResolveLaunch(o, Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(), "--consumer is 3 but WORLD_SIZE is 2: need --consumer < WORLD_SIZE");
  e = ResolveLaunch(o, Env({}));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(),
            "--consumer is 3 but the default world size is 1: need --consumer < the default world size");
}

// Each inconsistency is an error naming the variables.
struct BadCase {
  const char* name;
  Vars vars;
  const char* message;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class LaunchEnvErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(LaunchEnvErrorTest, NamesTheVariables) {
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(NoServersNeeded(), Env(GetParam().vars));
  ASSERT_FALSE(e.ok()) << "accepted: rank " << e->rank << " of " << e->world_size;
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Bad, LaunchEnvErrorTest,
    ::testing::Values(
        BadCase{"RankWithoutWorldSize", {{"RANK", "0"}},
                "RANK is set but WORLD_SIZE is not: set both (launchers set both)"},
        BadCase{"WorldSizeWithoutRank", {{"WORLD_SIZE", "2"}},
                "WORLD_SIZE is set but RANK is not: set both (launchers set both)"},
        BadCase{"RankNotBelowWorldSize", {{"RANK", "2"}, {"WORLD_SIZE", "2"}},
                "RANK is 2 but WORLD_SIZE is 2: need RANK < WORLD_SIZE"},
        BadCase{"NotANumber", {{"RANK", "one"}, {"WORLD_SIZE", "2"}},
                "RANK='one' is not a non-negative integer (a rank or a process count)"},
        BadCase{"Negative", {{"RANK", "-1"}, {"WORLD_SIZE", "2"}},
                "RANK='-1' is not a non-negative integer (a rank or a process count)"},
        BadCase{"ZeroWorld", {{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE is 0: need >= 1"},
        BadCase{"LocalRankNotBelowLocalWorld",
                {{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}},
                "LOCAL_RANK is 4 but LOCAL_WORLD_SIZE is 4: need LOCAL_RANK < LOCAL_WORLD_SIZE"},
        BadCase{"LocalWorldLargerThanWorld",
                {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}},
                "LOCAL_WORLD_SIZE is 4 but WORLD_SIZE is 2: a node cannot hold more ranks than the job"},
        BadCase{"SlurmProcidNotBelowTasks", {{"SLURM_PROCID", "2"}, {"SLURM_STEP_NUM_TASKS", "2"}},
                "SLURM_PROCID is 2 but SLURM_STEP_NUM_TASKS is 2: need SLURM_PROCID < "
                "SLURM_STEP_NUM_TASKS"},
        BadCase{"SlurmProcidWithoutCount", {{"SLURM_PROCID", "0"}},
                "SLURM_PROCID is set but SLURM_NTASKS is not: set both (launchers set both)"},
        BadCase{"SlurmLocalIdNotBelowTheNodesTasks",
                {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"},
                 {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}},
                "SLURM_LOCALID is 2 but SLURM_TASKS_PER_NODE[SLURM_NODEID=1] is 2: need "
                "SLURM_LOCALID < SLURM_TASKS_PER_NODE[SLURM_NODEID=1]"},
        BadCase{"OpenMpiRankNotBelowSize",
                {{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
                "OMPI_COMM_WORLD_RANK is 4 but OMPI_COMM_WORLD_SIZE is 4: need "
                "OMPI_COMM_WORLD_RANK < OMPI_COMM_WORLD_SIZE"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(LaunchEnvTest, JaxCountMustAgreeWithTheClusterJaxRead) {
  LaunchOverrides o = NoServersNeeded();
  o.rank = 1;
  o.world_size = 2;
  o.rank_name = "jax.process_index()";
  o.world_size_name = "jax.process_count()";
  o.from_jax = true;
  const Vars slurm{{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"}};
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(o, Env(slurm));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(),
            "jax.process_count() is 2 but SLURM_STEP_NUM_TASKS is 4: pass rank= and world_size= "
            "to say which is right");
  o.world_size = 4;
  e = ResolveLaunch(o, Env(slurm));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->world_size, 4u);
  // The same values given as plain arguments are the user's choice: no check.
  o.world_size = 2;
  o.from_jax = false;
  EXPECT_TRUE(ResolveLaunch(o, Env(slurm)).ok());
}

TEST(LaunchEnvTest, Servers) {
  LaunchOverrides o;
  absl::StatusOr<LaunchEnv> e = ResolveLaunch(o, Env({}));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("CONVEYOR_SERVERS"), std::string::npos) << e.status();
  e = ResolveLaunch(o, Env({{"CONVEYOR_SERVERS", "10.0.0.1:7700, 10.0.0.2:7700,"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->servers, (std::vector<std::string>{"10.0.0.1:7700", "10.0.0.2:7700"}));
  EXPECT_EQ(e->servers_source, "CONVEYOR_SERVERS");
  o.servers = "dns:///conveyor:7700";
  e = ResolveLaunch(o, Env({{"CONVEYOR_SERVERS", "10.0.0.1:7700"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->servers, (std::vector<std::string>{"dns:///conveyor:7700"}));
  EXPECT_EQ(e->servers_source, "explicit");
}

TEST(LaunchEnvTest, ProcessEnvReadsTheRealEnvironment) {
  ::setenv("CONVEYOR_LAUNCH_ENV_TEST", "x", 1);
  EXPECT_EQ(ProcessEnv()("CONVEYOR_LAUNCH_ENV_TEST"), std::optional<std::string>("x"));
  ::setenv("CONVEYOR_LAUNCH_ENV_TEST", "", 1);
  EXPECT_EQ(ProcessEnv()("CONVEYOR_LAUNCH_ENV_TEST"), std::nullopt);
  ::unsetenv("CONVEYOR_LAUNCH_ENV_TEST");
}

}  // namespace
}  // namespace conveyor::client
