#pragma once
// fully_shard: FSDP2-style data parallelism on DTensor, composed after tensor parallelism
// (parallelize_module(model, mesh["tp"], plan); fully_shard(model, mesh["dp"])).
#include <vector>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

/// Options of fully_shard (PyTorch's names).
struct FullyShardOptions {
  /// Free the gathered parameters after forward and gather them again before backward (less
  /// memory, one more all-gather per module and step); false keeps them until backward is done.
  /// The root module (the outermost fully_shard module of a forward) always keeps them, as its
  /// backward starts at once (FSDP2's rule).
  bool reshard_after_forward = true;
};

/// Shards the parameters of `module` that no earlier fully_shard call on a submodule took over
/// dp_mesh (1-D), as one group: a TP parameter on mesh["tp"] becomes a DTensor on the (dp, tp)
/// root mesh, sharded over dp on the first dimension its TP placement leaves whole (dim 0 unless
/// TP shards it); a 1-D parameter whose only dim TP shards stays replicated over dp. A plain
/// parameter becomes Shard(0) on dp_mesh. Before `module`'s forward the group is all-gathered
/// over dp (one collective per dtype, persistent buffers) into the tensors forward computes with
/// (TP DTensors, or plain tensors without TP). In backward the group's gradients are brought to
/// their TP placements and reduce-scattered, averaged over dp, in one collective per dtype into
/// the sharded parameters' gradients, so torch::optim updates the shards directly. Apply it per
/// block, then at the root. Throws before changing anything for a non-hookable module, an N-D
/// dp_mesh, or parameters on a mesh that is not a sibling of dp_mesh.
/// e.g. `for (auto& l : *model->layers) hp::fully_shard(*l, mesh["dp"]); hp::fully_shard(*model, mesh["dp"]);`
torch::nn::Module& fully_shard(torch::nn::Module& module, const DeviceMesh& dp_mesh, FullyShardOptions options = {});

/// Gathers the parameters of `module` (a fully_shard root of a group) now, e.g. before an
/// evaluation loop with reshard_after_forward; its next forward then gathers nothing. Collective
/// over dp. c10::ValueError when fully_shard was not applied to `module`.
void unshard(torch::nn::Module& module);
/// Frees the gathered parameters of `module` (the next forward gathers them again).
void reshard(torch::nn::Module& module);
/// When `module`'s forward starts, also gather the parameters of `modules` (in order), as
/// PyTorch's FSDPModule.set_modules_to_forward_prefetch; each must be a fully_shard module.
void set_modules_to_forward_prefetch(torch::nn::Module& module, const std::vector<torch::nn::Module*>& modules);

}  // namespace hyper_parallel
