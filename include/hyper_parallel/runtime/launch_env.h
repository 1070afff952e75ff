#pragma once
// Where this process sits in the job, read from the launcher's environment.
#include <chrono>
#include <cstdint>
#include <string>

namespace hyper_parallel {

/// The launch parameters of this process.
struct LaunchEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::string launcher;  ///< "torchrun" (RANK/WORLD_SIZE, also hprun), "openmpi" or "slurm"
  /// `HP_RDZV_ID` (hprun sets it): the job's keys in the rendezvous store live under it, so
  /// ranks of another job pointed at the same MASTER_PORT cannot join this one. Empty: no prefix.
  std::string rdzv_id;
  /// Under torchrun's elastic agent (`TORCHELASTIC_USE_AGENT_STORE=True`) the agent serves the
  /// store at MASTER_ADDR:MASTER_PORT and every rank joins it as a client, our keys under this
  /// prefix: "hyper_parallel/<TORCHELASTIC_RUN_ID>/attempt_<TORCHELASTIC_RESTART_COUNT>/". Empty
  /// otherwise (rank 0 serves the store).
  std::string agent_store_prefix;
};

/// Reads, in this order of preference, torchrun-style `RANK`/`WORLD_SIZE`/`LOCAL_RANK`, OpenMPI's
/// `OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK`, or Slurm's `SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID`,
/// plus `MASTER_ADDR`/`MASTER_PORT`. Throws c10::ValueError naming the variable that is missing
/// or malformed. Under OpenMPI on one node and under Slurm, MASTER_ADDR/MASTER_PORT default to
/// the local host (or SLURM_LAUNCH_NODE_IPADDR) and 29500.
LaunchEnv read_launch_env();

/// The collective timeout: `HP_TIMEOUT_S` when set (seconds, > 0), else 300 s.
std::chrono::milliseconds default_timeout();

}  // namespace hyper_parallel
