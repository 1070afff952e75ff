#pragma once
// fully_shard: FSDP2-style data parallelism on DTensor, composed after tensor parallelism
// (parallelize_module(model, mesh["tp"], plan); fully_shard(model, mesh["dp"])).
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

/// Mixed precision of fully_shard (FSDP2's MixedPrecisionPolicy): the sharded parameters (and so
/// the optimizer's state) keep their dtype, e.g. float32, while the all-gather and the forward and
/// backward compute run in param_dtype, and the gradients are reduced in reduce_dtype and land on
/// the sharded parameters in their own dtype.
/// e.g. `o.mp_policy = {at::kBFloat16, at::kFloat};  // bf16 gathers and compute, fp32 reduction`
struct MixedPrecisionPolicy {
  /// The dtype of the gathered parameters forward and backward compute with (unset: their own).
  c10::optional<at::ScalarType> param_dtype;
  /// The dtype the gradients are reduce-scattered (and, with HSDP, all-reduced) in; unset: the
  /// compute dtype (param_dtype, else the parameters' own).
  c10::optional<at::ScalarType> reduce_dtype;
  /// Floating-point outputs of the module are cast to it (unset: left as computed).
  c10::optional<at::ScalarType> output_dtype;
  /// Floating-point tensor arguments of the module's forward are cast to param_dtype first.
  bool cast_forward_inputs = true;
};

/// Options of fully_shard (PyTorch's names).
struct FullyShardOptions {
  /// Free the gathered parameters after forward and gather them again before backward (less
  /// memory, one more all-gather per module and step); false keeps them until backward is done.
  /// The root module (the outermost fully_shard module of a forward) always keeps them, as its
  /// backward starts at once (FSDP2's rule).
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  /// The gradients are summed over the data-parallel ranks and divided by this instead of
  /// averaged over them (FSDP2's set_gradient_divide_factor). Experts sharded over ep and
  /// fully_shard over the remaining data ranks take the sum over every data rank that routed
  /// tokens to them: gradient_divide_factor = dp · ep makes it the whole batch's mean.
  c10::optional<double> gradient_divide_factor;
};

/// Shards the parameters of `module` that no earlier fully_shard call on a submodule took over
/// over dp_mesh, as one group. dp_mesh is 1-D (FSDP), or 2-D (replicate, shard) for HSDP: the
/// parameters are sharded over its second dimension and replicated over its first, e.g.
/// mesh[{"dp_replicate", "dp_shard"}]; the gradients are then reduce-scattered over the shard
/// dimension and all-reduced over the replicate one, averaged over both. With one dimension: a TP parameter on mesh["tp"] becomes a DTensor on the (dp, tp)
/// root mesh, sharded over dp on the first dimension its TP placement leaves whole (dim 0 unless
/// TP shards it); a 1-D parameter whose only dim TP shards stays replicated over dp. A plain
/// parameter becomes Shard(0) on dp_mesh. Before `module`'s forward the group is all-gathered
/// over dp (one collective per dtype, persistent buffers) into the tensors forward computes with
/// (TP DTensors, or plain tensors without TP). In backward the group's gradients are brought to
/// their TP placements and reduce-scattered, averaged over dp, in one collective per dtype into
/// the sharded parameters' gradients, so torch::optim updates the shards directly. Apply it per
/// block, then at the root. `options.mp_policy` sets the dtypes of the gather, the compute and the
/// reduction (MixedPrecisionPolicy). Throws before changing anything for a non-hookable module,
/// a dp_mesh of more than 2 dimensions, or parameters on a mesh that is not a sibling of dp_mesh.
/// e.g. `for (auto& l : *model->layers) hp::fully_shard(*l, mesh["dp"]); hp::fully_shard(*model, mesh["dp"]);`
torch::nn::Module& fully_shard(torch::nn::Module& module, const DeviceMesh& dp_mesh, FullyShardOptions options = {});

/// Gathers the parameters of `module` (a fully_shard root of a group) now, e.g. before an
/// evaluation loop with reshard_after_forward; its next forward then gathers nothing. Collective
/// over dp. c10::ValueError when fully_shard was not applied to `module`.
void unshard(torch::nn::Module& module);
/// Frees the gathered parameters of `module` (the next forward gathers them again).
void reshard(torch::nn::Module& module);
/// Whether the next backward passes reduce the gradients of `module`'s group (FSDP2's
/// set_requires_gradient_sync): with false, each backward adds its unreduced gradients to a
/// buffer of the group (in reduce_dtype) and communicates nothing; the first backward with true
/// again reduces everything accumulated, so gradient accumulation over microbatches costs one
/// reduction. Set it on every fully_shard module (`recurse`: on every one inside `module`).
/// e.g. `hp::set_requires_gradient_sync(*model, microbatch + 1 == n);`
void set_requires_gradient_sync(torch::nn::Module& module, bool requires_sync, bool recurse = true);
/// Whether fully_shard was applied to `module` or to a module inside it.
bool has_fully_shard(const torch::nn::Module& module);
/// When `module`'s forward starts, also gather the parameters of `modules` (in order), as
/// PyTorch's FSDPModule.set_modules_to_forward_prefetch; each must be a fully_shard module.
void set_modules_to_forward_prefetch(torch::nn::Module& module, const std::vector<torch::nn::Module*>& modules);

/// The parameters of one fully_shard call, for a frontend that keeps its modules' parameter
/// slots itself (the Python face swaps a torch.nn module's parameters in its own hooks); the C++
/// fully_shard above is this plus libtorch modules' slots and hooks. A handle: copies share one
/// group, which lives while a copy does.
/// e.g. `FullyShardGroup g(params, names, mesh["dp"]); auto compute = g.pre_forward(); ...; g.post_forward(out);`
class FullyShardGroup {
 public:
  /// Shards `params` (each a plain tensor or a TP DTensor, none twice) over dp_mesh as
  /// fully_shard does; `fqns` name them in errors. Throws before sharding anything when one of
  /// them cannot be, or was taken over by an earlier group (a weight tied across two calls).
  FullyShardGroup(const std::vector<at::Tensor>& params, const std::vector<std::string>& fqns, const DeviceMesh& dp_mesh,
                  FullyShardOptions options = {});
  /// The sharded parameters (DTensors on dp_mesh, or on the dp x tp root), in the order given:
  /// what optimizers and state dicts see, and what the module's slots hold outside forward.
  std::vector<at::Tensor> sharded_parameters() const;
  /// Before the module's forward: gathers the group (and starts the prefetched groups' gathers)
  /// and returns the tensors forward computes with, one per parameter, in the module's slots
  /// until post_forward. Their backward reduce-scatters the group's gradients into the sharded
  /// parameters' .grad.
  std::vector<at::Tensor> pre_forward();
  /// After it, with the sharded parameters back in the slots: reshards (unless this is the root
  /// or reshard_after_forward is off) and has backward gather again when `output`'s gradients
  /// arrive. `output` None: the forward threw.
  void post_forward(const c10::IValue& output);
  /// Gathers the parameters now (async_op: starts the gather; unsharded_parameters() completes it).
  void unshard(bool async_op = false);
  /// Frees the gathered parameters.
  void reshard();
  /// The gathered parameters, one per parameter in the order given, without autograd (plain, or
  /// a TP DTensor), once a gather in flight completes: what unshard() shows in the module's
  /// slots. Valid until reshard().
  std::vector<at::Tensor> unsharded_parameters() const;
  /// Whether this group's first forward found no other fully_shard forward running (the root);
  /// true once, at that forward.
  bool claim_root();
  /// The module's path from the root, named in this group's collective labels.
  void set_fqn(const std::string& fqn);
  /// FSDP2's set_requires_gradient_sync for this group (see the free function).
  void set_requires_gradient_sync(bool requires_sync);
  /// Whether backward frees the gathered parameters when it is done with them (true by default);
  /// false keeps them for the next forward (gradient accumulation: set it back to true before
  /// the optimizer step's microbatch, or the next forward computes with the old values).
  void set_reshard_after_backward(bool reshard_after_backward);
  /// set_modules_to_forward_prefetch, by group.
  void set_modules_to_forward_prefetch(const std::vector<FullyShardGroup>& groups);
  /// Whether two handles are one group.
  bool operator==(const FullyShardGroup& other) const { return group_ == other.group_; }

 private:
  c10::intrusive_ptr<torch::CustomClassHolder> group_;  // an fsdp::FSDPParamGroup
};

}  // namespace hyper_parallel
