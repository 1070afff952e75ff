#pragma once
// torch's _foreach_* ops (what torch.optim runs with foreach=True and clip_grad_norm_ with
// _foreach_norm) on lists holding DTensors.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace hyper_parallel {

/// Whether `op` is one of torch's _foreach_ ops.
bool is_foreach_op(const c10::OperatorHandle& op);

/// Runs a _foreach_ op as its per-tensor op on each element of its lists (each call dispatched
/// as usual, so DTensor elements follow that op's sharding rule): the sharding of N separate calls
/// and the values of torch's own per-tensor path for foreach ops, which CPU tensors take.
void run_foreach_per_tensor(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace hyper_parallel
