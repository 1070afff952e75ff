#pragma once
// Planning a redistribution: a pure function from (mesh shape, source placements, target
// placements, global shape) to the list of steps that turns one layout into the other. It needs
// no process group, so it is unit-tested on its own; dtensor/redistribute executes the steps.
#include <cstdint>
#include <string>
#include <vector>

#include <hyper_parallel/dtensor/placement.h>

namespace hyper_parallel {

/// One collective or local transformation on one mesh dimension.
struct RedistributeStep {
  enum class Kind {
    AllGather,      ///< Shard(dim) -> Replicate
    AllReduce,      ///< Partial(op) -> Replicate
    ReduceScatter,  ///< Partial(op) -> Shard(dim)
    AllToAll,       ///< Shard(dim) -> Shard(dim2)
    Chunk,          ///< Replicate -> Shard(dim): keep this rank's piece, no communication
    ToPartial,      ///< Replicate -> Partial(op): keep the value on coordinate 0, the identity elsewhere
  };
  Kind kind;
  int64_t mesh_dim;
  int64_t dim = -1;   ///< the tensor dim sharded before (AllGather, AllToAll) or after (Chunk, ReduceScatter)
  int64_t dim2 = -1;  ///< AllToAll: the tensor dim sharded after
  ReduceOp op = ReduceOp::SUM;
  /// Placements of the tensor after this step.
  Placements after;

  std::string to_string() const;
  bool operator==(const RedistributeStep& o) const {
    return kind == o.kind && mesh_dim == o.mesh_dim && dim == o.dim && dim2 == o.dim2 && op == o.op;
  }
};

/// The steps from `src` to `dst` (both normalised) for a tensor of `ndim` dimensions on a mesh of
/// `mesh_shape`. Mesh dimensions shard in order (a later one splits an earlier one's piece), so
/// the plan unshards from the last mesh dimension to the first and reshards from the first to the
/// last; a mesh dimension whose change would disturb a later one sharding the same tensor dim
/// makes that later one go through Replicate too.
/// Throws c10::ValueError for transitions with no meaning (e.g. Partial(sum) -> Partial(max)).
std::vector<RedistributeStep> plan_redistribute(const std::vector<int64_t>& mesh_shape,
                                                const Placements& src, const Placements& dst,
                                                int64_t ndim);

}  // namespace hyper_parallel
