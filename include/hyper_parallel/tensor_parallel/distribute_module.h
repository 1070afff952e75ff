#pragma once
// distribute_module: distributes a module's parameters once and installs its
// input/output conversions as hooks. Lives in the tensor_parallel layer because it needs the
// hooks of the nn/platform layers, which sit above the dtensor layer.
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

/// Called for every submodule (FQN relative to the distributed module, "" for itself); replaces
/// the parameters it wants sharded (e.g. with distribute_tensor).
using PartitionFn = std::function<void(const std::string& name, torch::nn::Module& module, const DeviceMesh& mesh)>;
/// Converts the positional inputs before forward; nullopt keeps them.
using InputFn = std::function<c10::optional<std::vector<c10::IValue>>(nn::Module& module,
                                                                      const std::vector<c10::IValue>& inputs,
                                                                      const DeviceMesh& mesh)>;
/// Converts the output after forward; nullopt keeps it.
using OutputFn = std::function<c10::optional<c10::IValue>(nn::Module& module, const c10::IValue& output,
                                                          const DeviceMesh& mesh)>;

/// 1. partition_fn on every submodule; 2. every parameter and buffer that is not a DTensor yet
/// becomes a Replicate DTensor (from src_data_rank); 3. input_fn / output_fn become forward
/// (pre-)hooks of `module`; 4. the module is marked, and a second call raises c10::Error
/// (RuntimeError). `module` must be a hyper_parallel::nn module (c10::TypeError otherwise).
/// e.g. `distribute_module(*norm, tp, nullptr, to_sequence_shards, nullptr);`
torch::nn::Module& distribute_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                     PartitionFn partition_fn = nullptr, InputFn input_fn = nullptr,
                                     OutputFn output_fn = nullptr, c10::optional<int64_t> src_data_rank = 0);

/// Makes `param`'s gradient take `param`'s placements as it reaches the parameter: the Partial
/// gradient of a replicated weight (a norm under sequence parallelism) is reduced once, in
/// backward, so `.grad` equals the one-process gradient when backward returns. distribute_module
/// does this for every DTensor parameter that requires grad; call it for a copy of one (a deepcopy,
/// a parameter assigned by load_state_dict(assign=True)). Needs a DTensor.
void reduce_gradient_to_placements(const at::Tensor& param);

/// Whether distribute_module was already applied to `module`.
bool distribute_module_applied(const torch::nn::Module& module);
/// Records whether it was: for a module that stands in for another frontend's module, which keeps
/// the flag itself (PyTorch's `module._distribute_module_applied`). Needs a hyper_parallel::nn module.
void set_distribute_module_applied(torch::nn::Module& module, bool applied);

/// After a step that ran code the library could not check beforehand (a user's style, a
/// partition_fn), every rank of `mesh` learns whether it failed on any rank, before anyone goes
/// on to a collective: the rank(s) that failed rethrow their own `error`; the others raise
/// RuntimeError "hyper_parallel::<what>: failed on rank R: <its message>". One control all_gather
/// per mesh dimension.
/// e.g. `agree_on_user_code(mesh, error, "parallelize_module: MyStyle on 'layers.0.mlp'");`
void agree_on_user_code(const DeviceMesh& mesh, std::exception_ptr error, const std::string& what);

/// distribute_tensor for a parameter, where meta tensors never communicate (they have no values).
DTensor distribute_parameter(const at::Tensor& param, const DeviceMesh& mesh, const Placements& placements,
                             c10::optional<int64_t> src_data_rank);

}  // namespace hyper_parallel
