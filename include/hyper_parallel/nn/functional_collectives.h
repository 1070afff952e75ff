#pragma once
// Collectives that autograd differentiates, on plain (local) tensors, for code that manages its
// own layouts (the token dispatch of mixture-of-experts layers, auxiliary losses over data ranks).
// DTensors do not need them: their redistributions are differentiable already.
#include <ATen/core/Tensor.h>

#include <hyper_parallel/runtime/process_group.h>

#include <vector>

namespace hyper_parallel {
namespace nn {
namespace functional {

/// all_to_all_single whose backward sends the gradient back the same way (splits swapped), as
/// PyTorch's all_to_all_single_autograd. Every rank must run the backward when one does: a
/// rank that receives nothing still returns a [0, ...] tensor in the graph.
/// e.g. `at::Tensor got = all_to_all_single_autograd(tokens, recv_counts, send_counts, ep_group);`
at::Tensor all_to_all_single_autograd(const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                                      const std::vector<int64_t>& input_split_sizes, const Group& group);

/// The sum over the group, whose backward is the sum of the gradients over the group (the adjoint
/// when each rank uses the sum in a loss of its own, e.g. statistics of a whole data-parallel
/// batch), as torch.distributed.nn.functional.all_reduce.
at::Tensor all_reduce_sum_autograd(const at::Tensor& input, const Group& group);

/// Megatron's "reduce from the model-parallel region": the forward sums partial results over the
/// group; the backward passes the gradient through, since every rank then computes the same thing
/// with the sum (the gradient is already whole on each).
at::Tensor reduce_from_group(const at::Tensor& input, const Group& group);

/// Megatron's "copy to the model-parallel region": the forward is the identity on an input every
/// rank of the group holds alike; the backward sums the gradient over the group, because each
/// rank only computed its part of it (its experts, its columns).
at::Tensor copy_to_group(const at::Tensor& input, const Group& group);

}  // namespace functional
}  // namespace nn
}  // namespace hyper_parallel
