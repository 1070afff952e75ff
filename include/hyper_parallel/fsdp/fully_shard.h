#pragma once
// fully_shard: FSDP2-style data parallelism on DTensor, composed after tensor parallelism
// (seed §4.2: parallelize_module(model, mesh["tp"], plan); fully_shard(model, mesh["dp"])).
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

/// Shards the parameters of `module` that no earlier fully_shard call on a submodule took over
/// dp_mesh (1-D): a TP parameter on mesh["tp"] becomes a DTensor on the (dp, tp) root mesh,
/// sharded over dp on the first dimension its TP placement leaves whole (dim 0 unless TP shards
/// it); a 1-D parameter whose only dim TP shards stays replicated over dp. A plain parameter
/// becomes Shard(0) on dp_mesh. Before `module`'s forward its parameters are all-gathered over
/// dp into the tensors forward computes with (TP DTensors, or plain tensors without TP); they are
/// dropped after forward except where autograd keeps them. In backward each gradient is brought
/// to its TP placements, reduce-scattered and averaged over dp into the sharded parameter's
/// gradient, so torch::optim updates the shards directly. Apply it per block, then at the root.
/// Throws before changing anything for a non-hookable module, an N-D dp_mesh, or parameters on a
/// mesh that is not a sibling of dp_mesh.
/// e.g. `for (auto& l : *model->layers) hp::fully_shard(*l, mesh["dp"]); hp::fully_shard(*model, mesh["dp"]);`
torch::nn::Module& fully_shard(torch::nn::Module& module, const DeviceMesh& dp_mesh);

}  // namespace hyper_parallel
