#include <gtest/gtest.h>

#include <cstdlib>

#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/launch_env.h>

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_runtime_launch_env_test {
namespace {
const char* kVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                       "SLURM_LOCALID", "SLURM_LAUNCH_NODE_IPADDR", "HP_TIMEOUT_S"};

class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { for (auto v : kVars) unsetenv(v); }
  void TearDown() override { for (auto v : kVars) unsetenv(v); }
  // The message of the c10::ValueError read_launch_env() throws.
  static std::string error() {
    try {
      hp::read_launch_env();
    } catch (const c10::ValueError& e) {
      return e.what();
    }
    return "no error";
  }
};
}  // namespace

TEST_F(LaunchEnvTest, TorchrunVariables) {
  setenv("RANK", "3", 1); setenv("WORLD_SIZE", "4", 1); setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1); setenv("MASTER_PORT", "29400", 1);
  auto e = hp::read_launch_env();
  EXPECT_EQ(e.rank, 3); EXPECT_EQ(e.world_size, 4); EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.1"); EXPECT_EQ(e.master_port, 29400);
  EXPECT_EQ(e.launcher, "torchrun");
}

TEST_F(LaunchEnvTest, OpenMpiOnOneNodeDefaultsToLoopback) {
  setenv("OMPI_COMM_WORLD_RANK", "1", 1); setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1); setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  auto e = hp::read_launch_env();
  EXPECT_EQ(e.rank, 1); EXPECT_EQ(e.world_size, 2); EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.master_addr, "127.0.0.1"); EXPECT_EQ(e.master_port, 29500);
}

TEST_F(LaunchEnvTest, OpenMpiAcrossNodesNeedsMasterAddr) {
  setenv("OMPI_COMM_WORLD_RANK", "1", 1); setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_NE(error().find("MASTER_ADDR"), std::string::npos);
}

TEST_F(LaunchEnvTest, SlurmVariables) {
  setenv("SLURM_PROCID", "5", 1); setenv("SLURM_NTASKS", "8", 1); setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3", 1);
  auto e = hp::read_launch_env();
  EXPECT_EQ(e.rank, 5); EXPECT_EQ(e.world_size, 8); EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3"); EXPECT_EQ(e.launcher, "slurm");
}

TEST_F(LaunchEnvTest, MissingAndMalformedVariablesAreNamed) {
  EXPECT_NE(error().find("RANK is not set"), std::string::npos);
  setenv("RANK", "0", 1);
  EXPECT_NE(error().find("WORLD_SIZE is not set"), std::string::npos);
  setenv("WORLD_SIZE", "two", 1);
  EXPECT_NE(error().find("WORLD_SIZE='two' is not an integer"), std::string::npos);
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_NE(error().find("MASTER_ADDR is not set"), std::string::npos);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  EXPECT_NE(error().find("MASTER_PORT is not set"), std::string::npos);
  setenv("MASTER_PORT", "70000", 1);
  EXPECT_NE(error().find("MASTER_PORT=70000"), std::string::npos);
  setenv("MASTER_PORT", "1234", 1);
  setenv("RANK", "2", 1);
  EXPECT_NE(error().find("must be < world size 2"), std::string::npos);
  setenv("RANK", "-1", 1);
  EXPECT_NE(error().find("RANK=-1 must be >= 0"), std::string::npos);
}

TEST_F(LaunchEnvTest, TimeoutOverride) {
  EXPECT_EQ(hp::default_timeout(), std::chrono::seconds(300));
  setenv("HP_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(hp::default_timeout(), std::chrono::milliseconds(2500));
  setenv("HP_TIMEOUT_S", "soon", 1);
  EXPECT_THROW(hp::default_timeout(), c10::ValueError);
  for (const char* bad : {"inf", "nan", "-1", "0", "1e300"}) {
    setenv("HP_TIMEOUT_S", bad, 1);
    EXPECT_THROW(hp::default_timeout(), c10::ValueError) << bad;  // never a negative or overflowed timeout
  }
}

TEST(Chunking, FollowsTorchChunk) {
  EXPECT_EQ(hp::chunk_sizes(7, 4), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(hp::chunk_sizes(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(hp::chunk_sizes(1, 4), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(hp::chunk_sizes(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(hp::chunk_offset(5, 4, 3), 5);
  EXPECT_EQ(hp::chunk_offset(5, 4, 2), 4);
}

}  // namespace t_unit_runtime_launch_env_test
