#pragma once
// Process groups: the job-wide one made by init_process_group() and sub-groups of it.
// c10d stays out of this header; runtime/c10d_interop.h reaches the c10d object when needed.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyper_parallel {

/// A set of ranks that run collectives together. A cheap handle (copies share the group).
/// `rank()` and `size()` are within the group; `ranks()` lists its members' global ranks.
class Group {
 public:
  struct Impl;
  Group() = default;
  explicit Group(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  int64_t rank() const;
  int64_t size() const;
  const std::vector<int64_t>& ranks() const;
  /// Device the group's collectives run on ("cpu", "cuda").
  const std::string& device_type() const;
  /// Backend name, e.g. "gloo".
  std::string backend_name() const;
  /// What carries the group's collectives: "shm" (CPU, every member on this host), "gloo" (CPU,
  /// across hosts, or HP_TRANSPORT=gloo) or "nccl" (CUDA). HP_TRANSPORT=auto|shm|gloo|nccl chooses.
  std::string transport() const;

  bool operator==(const Group& o) const { return impl_ == o.impl_; }
  bool operator!=(const Group& o) const { return impl_ != o.impl_; }

 private:
  friend struct GroupAccess;  // src/runtime/process_group.cpp
  std::shared_ptr<Impl> impl_;
};

/// Options of init_process_group().
struct InitOptions {
  /// "cpu" selects shared memory or Gloo, "cuda" NCCL (when libtorch was built with it); with
  /// "cuda" each rank first sets its device to LOCAL_RANK % device count. The one place where a
  /// transport is chosen is src/runtime/process_group.cpp.
  /// e.g. `hp::InitOptions o; o.device_type = "cuda"; hp::init_process_group(o);`
  std::string device_type = "cpu";
  /// Collective and rendezvous timeout; unset means `HP_TIMEOUT_S` or 300 s.
  std::optional<std::chrono::milliseconds> timeout;
};

/// Joins the job described by the environment (see read_launch_env()): rendezvous through a
/// c10d TCPStore on MASTER_ADDR:MASTER_PORT served by rank 0, then a process group over all
/// ranks. A rank that never arrives makes the others fail after the timeout, naming it.
/// e.g. `hp::init_process_group();` in a program started by `hprun --nproc-per-node 2 prog`.
void init_process_group(const InitOptions& options = {});

/// Makes this process rank `rank` of a fake world of `world_size` ranks, to plan a large job on
/// one machine (as PyTorch's fake process group): groups, meshes and every collective work
/// without peers and without communicating. On meta tensors a collective only computes its
/// result's shape (a real world refuses them: peers with real tensors would wait); on real tensors it gives what it would if every rank of the group held this
/// rank's tensors (an all_gather repeats them, a sum multiplies by the group size, max, min,
/// avg and broadcast return them unchanged). CommDebugMode counts calls and bytes as a real run
/// would. What needs real peers (checkpoints, c10d_group) raises c10::NotImplementedError.
/// init_process_group() does the same when HP_FAKE_WORLD=N (and HP_FAKE_RANK=r, default 0) are set.
/// No device is touched: device_type only names what the plan is for.
/// e.g. `hp::init_fake_process_group(1024, 0); auto mesh = hp::init_device_mesh("cpu", {128, 8}, {"dp", "tp"});`
void init_fake_process_group(int64_t world_size, int64_t rank = 0, const InitOptions& options = {});

/// Whether this process is a rank of a fake world (init_fake_process_group).
bool is_fake_world();

/// Raises c10::NotImplementedError, naming `what` and what it `needs`, in a fake world.
/// e.g. `hp::require_real_world("load_sharded", "every rank's files");`
void require_real_world(const char* what, const char* needs);

/// Leaves the job: drops the world group, every sub-group and the store.
void destroy_process_group();

bool is_initialized();
/// Global rank of this process (requires init_process_group()).
int64_t get_rank();
int64_t get_world_size();
/// LOCAL_RANK of this process (the device index for accelerators).
int64_t get_local_rank();
/// The group over every rank.
Group world_group();
/// The group of the given global ranks (ascending order is not required, order defines the group
/// ranks). Every member must call it with the same list; non-members must not. Cached: the same
/// list returns the same group.
Group new_group(const std::vector<int64_t>& ranks);
/// The timeout collectives of this job use.
std::chrono::milliseconds collective_timeout();

}  // namespace hyper_parallel
