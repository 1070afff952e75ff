#pragma once
// Gradient clipping over a whole device mesh, and the parameter list an optimizer should get.
// The norm of a model's gradients is the norm of the one-process gradients whatever their layout:
// each DTensor gradient's local piece contributes once per distinct element (sharded dims are
// summed over their ranks, replicated ones are not, Partial ones are reduced first), and plain
// gradients count as this rank's own (PyTorch's clip_grad_norm_ on local tensors).
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <hyper_parallel/mesh/device_mesh.h>

#include <vector>

namespace hyper_parallel {

/// Every distinct parameter of `module` once, in `parameters()` order: a tied weight (lm_head
/// sharing embed_tokens' weight) appears once, so an optimizer steps it once (libtorch's
/// parameters() lists it in every module that holds it).
/// e.g. `torch::optim::AdamW opt(hp::unique_parameters(*model), ...);`
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module);

/// The norm of `norm_type` (2, inf, any p > 0) of all the gradients of `parameters` taken together
/// (undefined gradients are skipped), equal to the norm one process computes for the same
/// gradients; when it exceeds `max_norm` every gradient is scaled in place by
/// max_norm / (norm + 1e-6) (PyTorch's clip_grad_norm_). Collective over every mesh the DTensor
/// gradients live on (one scalar all-reduce per sharded mesh dimension): call it on every rank
/// with the same parameter list. Returns the total norm (before clipping), a float32 scalar.
/// A non-finite norm raises c10::ValueError on every rank when `error_if_nonfinite`, else the
/// gradients are scaled by it as PyTorch does (NaN stays NaN).
/// With `pp_mesh` (1-D, the pipeline dimension; torchtitan's argument), `parameters` are this
/// rank's stages' and the norm is taken over every stage's (one more scalar all-reduce): call it
/// on every rank of the pipeline, also one whose stages hold no gradient.
/// e.g. `double n = hp::clip_grad_norm_(hp::unique_parameters(*model), 1.0).item<double>();`
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false, const DeviceMesh& pp_mesh = DeviceMesh());

}  // namespace hyper_parallel
