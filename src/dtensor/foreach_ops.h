#pragma once
// torch's _foreach_* ops (what torch.optim runs with foreach=True and clip_grad_norm_ with
// _foreach_norm) on lists holding DTensors.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace hyper_parallel {

/// Whether `op` is one of torch's _foreach_ ops.
bool is_foreach_op(const c10::OperatorHandle& op);

/// Runs a _foreach_ op on lists holding DTensors: torch's foreach kernel once on the local pieces
/// when every element is laid out alike and the op is pointwise; otherwise each element as its
/// per-tensor op (matched by schema), every element decided before any runs.
void run_foreach(const c10::OperatorHandle& op, torch::jit::Stack* stack);

/// Decides the call at the top of `call` (the arguments of `op`) as the DTensor fallback would,
/// without running it: raises what running it would refuse (dispatch.cpp).
void check_dtensor_call(const c10::OperatorHandle& op, const torch::jit::Stack& call);

}  // namespace hyper_parallel
