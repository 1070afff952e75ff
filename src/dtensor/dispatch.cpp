// The boxed fallback at kDTensorKey: every aten op on a DTensor lands here, below autograd.
// Its three steps live in their own files: the call's inputs and decision key, and the decision
// itself (sharding_propagation), then the local run and the wrapped returns (op_execution).
#include <hyper_parallel/dtensor/dtensor.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "dtensor_impl.h"
#include "op_execution.h"
#include "sharding_propagation.h"

namespace hyper_parallel {
namespace {

// A composite op (linear, matmul, dropout, ...) with no rule of its own, reaching DTensors
// undecomposed (autograd is off for the call, as under c10::InferenceMode, so its decomposition
// at the Autograd keys did not run): decompose it here, as autograd would have; its pieces come
// back to the fallback one by one.
void decompose(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs, torch::jit::Stack* stack) {
  c10::Device device(c10::kCPU);
  for (size_t i = 0; i < nargs; ++i)
    if (args[i].isTensor())
      if (DTensorImpl* d = dtensor_impl(args[i].toTensor())) {
        device = d->local().device();
        break;
      }
  op.redispatchBoxed(c10::DispatchKeySet(c10::computeDispatchKey(c10::nullopt, c10::kStrided, device)), stack);
}

void dtensor_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t nargs = op.schema().arguments().size();
  const c10::IValue* args = stack->data() + (stack->size() - nargs);
  const DeviceMesh* mesh = find_mesh(args, nargs);
  TORCH_INTERNAL_ASSERT(mesh != nullptr, "DTensor fallback reached without a DTensor argument for ", op.operator_name());
  OpInfo info(op, args, nargs, *mesh);
  std::shared_ptr<const Decision> d = propagate(info, collect_inputs(info));
  if (d == nullptr) return decompose(op, args, nargs, stack);
  execute(info, *d, stack);
}

}  // namespace
}  // namespace hyper_parallel

TORCH_LIBRARY_IMPL(_, Fake, m) {
  static_assert(hyper_parallel::kDTensorKey == c10::DispatchKey::Fake, "the fallback registration must name kDTensorKey");
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&hyper_parallel::dtensor_fallback>());
}
