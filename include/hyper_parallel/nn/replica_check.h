#pragma once
// The invariant every parallel training step keeps: two ranks that hold the same elements of a
// parameter hold the same bits. A replica that drifts (a gradient that depends on rank-local
// work, reduced over too few ranks or not at all) trains silently wrong from the next step on;
// this finds it at the step it appears. Megatron checks parameter hashes across data-parallel
// replicas; this does it for every layout: a DTensor's Replicate mesh dimensions, data-parallel
// copies of a plain module, replicated KV heads, routers replicated beside split experts.
#include <torch/nn/module.h>

#include <hyper_parallel/runtime/process_group.h>

#include <string>
#include <vector>

namespace hyper_parallel {

/// A parameter whose copies on two ranks differ: the same `name` and the same box of the
/// global tensor (`offset`, `sizes`), different bytes.
struct ReplicaMismatch {
  std::string name;
  std::vector<int64_t> offset, sizes;
  int64_t rank = -1, other_rank = -1;  ///< global ranks; rank < other_rank
};

/// Compares every two ranks of `group` that hold the same elements of a parameter of `module` of
/// the same name (a DTensor's local piece by its global offset and sizes; a plain tensor whole):
/// their bytes must be equal. Pieces that differ in name or box are not compared (pipeline stages,
/// shards). Collective over `group` (two control all-gathers of 64-bit hashes, not counted by
/// CommDebugMode; the bytes are hashed where they are). Every rank gets the same list, sorted by
/// name and ranks; empty when all replicas agree. Partial parameters are skipped (they are not
/// copies).
std::vector<ReplicaMismatch> find_replica_mismatches(const torch::nn::Module& module, const Group& group);

/// Raises c10::Error on every rank of `group` when find_replica_mismatches finds a mismatch,
/// naming the parameters (up to eight), their boxes and the ranks that disagree.
/// e.g. after `optimizer.step()`: `hp::check_replicas_equal(*model, hp::world_group());`
void check_replicas_equal(const torch::nn::Module& module, const Group& group);

}  // namespace hyper_parallel
