#pragma once
// Materialising a model built on the meta device: every parameter and buffer gets memory for its
// local shard only (a DTensor's local piece, a plain tensor whole), on one device, in its dtype.
// The pattern of PyTorch's `with torch.device("meta")` + `to_empty` + `reset_parameters`, in one
// call (HyperParallel's init_parameters):
//
//   { hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16));
//     model = qwen3::CausalLM(config); }                      // shapes only: no memory, any size
//   hp::parallelize_module(*model, mesh["tp"], plan);          // no allocation, no communication
//   hp::fully_shard(*model, mesh["dp"]);
//   hp::init_parameters(*model, "cpu");                        // this rank's shards, initialised
//
// Tensors keep their identity (their TensorImpl is filled in place): tied weights stay one
// tensor, and whatever holds a parameter (an FSDP group, an optimizer made before) sees the
// materialised one.
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <string>

namespace hyper_parallel {

/// Allocates every parameter and buffer of `module` (recursively, each distinct tensor once) as
/// its local shard on `device`, leaving the values uninitialised (PyTorch's Module.to_empty); for
/// a model whose every value is loaded next (load_hf_checkpoint, load_sharded).
/// All or nothing, checked before anything is allocated: c10::ValueError when no tensor of
/// `module` is on meta (it was materialised already), when some are and others are not (naming
/// those that are not), or when a DTensor's mesh is not of `device`'s type.
void to_empty(torch::nn::Module& module, const c10::Device& device);
inline void to_empty(torch::nn::Module& module, const std::string& device) { to_empty(module, c10::Device(device)); }

/// to_empty, then every module's reset_parameters (hyper_parallel::nn::Module), in named_modules
/// order. Initialisation draws through the layout-independent generator, so for a given
/// hyper_parallel::manual_seed every element equals the one a one-process model built eagerly
/// holds, at any tensor-parallel, FSDP or mesh layout. A slot whose tensor an earlier module owns
/// (a tied weight) is not drawn again. The reset_parameters are first run on the meta model (where
/// they draw and write nothing), so a module that cannot initialise its parameters is refused
/// before anything is allocated.
/// e.g. `hp::manual_seed(0); hp::init_parameters(*model, "cpu");`
void init_parameters(torch::nn::Module& module, const c10::Device& device);
inline void init_parameters(torch::nn::Module& module, const std::string& device) { init_parameters(module, c10::Device(device)); }

}  // namespace hyper_parallel
