#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/launch_env.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

namespace hyper_parallel {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int64_t parse_int(const char* name, const std::string& value, int64_t min_value) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  HP_CHECK_T(c10::ValueError, errno == 0 && end != value.c_str() && *end == '\0',
             "hyper_parallel::read_launch_env: environment variable ", name, "='", value, "' is not an integer");
  HP_CHECK_T(c10::ValueError, v >= min_value, "hyper_parallel::read_launch_env: environment variable ", name, "=", v,
             " must be >= ", min_value);
  return static_cast<int64_t>(v);
}

int64_t required_int(const char* name, int64_t min_value, const char* launcher) {
  auto v = env(name);
  HP_CHECK_T(c10::ValueError, v.has_value(), "hyper_parallel::read_launch_env: environment variable ", name,
             " is not set (the ", launcher,
             " launch variables are partly present; set it or start the program with hprun)");
  return parse_int(name, *v, min_value);
}

int64_t optional_int(const char* name, int64_t fallback, int64_t min_value) {
  auto v = env(name);
  return v ? parse_int(name, *v, min_value) : fallback;
}

}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv e;
  std::optional<std::string> default_addr;
  if (env("RANK") || env("WORLD_SIZE")) {
    e.launcher = "torchrun";
    e.rank = required_int("RANK", 0, "torchrun-style");
    e.world_size = required_int("WORLD_SIZE", 1, "torchrun-style");
    e.local_rank = optional_int("LOCAL_RANK", e.rank, 0);
  } else if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "openmpi";
    e.rank = required_int("OMPI_COMM_WORLD_RANK", 0, "OpenMPI");
    e.world_size = required_int("OMPI_COMM_WORLD_SIZE", 1, "OpenMPI");
    e.local_rank = optional_int("OMPI_COMM_WORLD_LOCAL_RANK", e.rank, 0);
    // One node: every rank can find rank 0 on the loopback interface.
    if (optional_int("OMPI_COMM_WORLD_LOCAL_SIZE", 0, 0) == e.world_size)
      default_addr = "127.0.0.1";
  } else if (env("SLURM_PROCID") || env("SLURM_NTASKS")) {
    e.launcher = "slurm";
    e.rank = required_int("SLURM_PROCID", 0, "Slurm");
    e.world_size = required_int("SLURM_NTASKS", 1, "Slurm");
    e.local_rank = optional_int("SLURM_LOCALID", e.rank, 0);
    default_addr = env("SLURM_LAUNCH_NODE_IPADDR");
  } else {
    HP_CHECK_T(c10::ValueError, false,
               "hyper_parallel::read_launch_env: environment variable RANK is not set: start the program with hprun (or torchrun, "
               "mpirun, srun), or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  }
  HP_CHECK_T(c10::ValueError, e.rank < e.world_size, "hyper_parallel::read_launch_env: rank ", e.rank,
             " (from the ", e.launcher, " environment) must be < world size ", e.world_size);

  auto addr = env("MASTER_ADDR");
  if (!addr && default_addr) addr = default_addr;
  HP_CHECK_T(c10::ValueError, addr.has_value(),
             "hyper_parallel::read_launch_env: environment variable MASTER_ADDR is not set (the address of rank 0's host)");
  e.master_addr = *addr;
  auto port = env("MASTER_PORT");
  if (!port && default_addr) port = std::string("29500");
  HP_CHECK_T(c10::ValueError, port.has_value(),
             "hyper_parallel::read_launch_env: environment variable MASTER_PORT is not set (a free TCP port on rank 0's host)");
  const int64_t p = parse_int("MASTER_PORT", *port, 1);
  HP_CHECK_T(c10::ValueError, p <= 65535, "hyper_parallel::read_launch_env: environment variable MASTER_PORT=", p,
             " is not a TCP port (1..65535)");
  e.master_port = static_cast<int>(p);
  if (auto id = env("HP_RDZV_ID")) e.rdzv_id = *id;
  const auto agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
  if (agent_store && (*agent_store == "True" || *agent_store == "true" || *agent_store == "1"))
    e.agent_store_prefix = "hyper_parallel/" + env("TORCHELASTIC_RUN_ID").value_or("run") + "/attempt_" +
                           env("TORCHELASTIC_RESTART_COUNT").value_or("0") + "/";
  return e;
}

std::chrono::milliseconds default_timeout() {
  auto v = env("HP_TIMEOUT_S");
  if (!v) return std::chrono::seconds(300);
  char* end = nullptr;
  const double s = std::strtod(v->c_str(), &end);
  HP_CHECK_T(c10::ValueError, end != v->c_str() && *end == '\0' && s > 0 && s <= 1e7,
             "hyper_parallel::default_timeout: environment variable HP_TIMEOUT_S='", *v, "' must be a number of seconds in (0, 1e7] ",
             "(collectives need a finite timeout; use a large one to wait long)");
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

}  // namespace hyper_parallel
