#pragma once
// Access to the c10d object behind a Group, for code that needs c10d directly (the collectives,
// or a user who wants to run their own c10d calls on our groups).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {

/// The c10d process group behind `group`.
const c10::intrusive_ptr<c10d::ProcessGroup>& c10d_group(const Group& group);

/// Joins a job whose rendezvous store another library already holds (e.g. an initialised
/// torch.distributed's), as init_process_group() does but without serving a store of its own:
/// this process is `rank` of `world_size`, and our keys live under "hyper_parallel/" there.
/// e.g. from Python: `init_process_group_with_store(torch.distributed.distributed_c10d._get_default_store(), rank, world)`.
void init_process_group_with_store(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
                                   const InitOptions& options = {});

/// Waits for `work`, a collective (`what`, e.g. "all_reduce") issued on `group`. When it fails
/// (a timeout, a peer gone), the ranks of the group that did not reach it are found through the
/// store and named in the c10::Error, on every rank that is still alive.
void wait_collective(const Group& group, const char* what, const c10::intrusive_ptr<c10d::Work>& work);

}  // namespace hyper_parallel
