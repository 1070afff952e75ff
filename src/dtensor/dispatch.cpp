// The boxed fallback at kDTensorKey: every aten op on a DTensor lands here, below autograd.
// Its three steps live in their own files: the call's inputs and decision key, and the decision
// itself (sharding_propagation), then the local run and the wrapped returns (op_execution).
#include <hyper_parallel/dtensor/dtensor.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>
#include <vector>

#include "dtensor_impl.h"
#include "foreach_ops.h"
#include "op_execution.h"
#include "op_interceptor.h"
#include "op_report.h"
#include "sharding_propagation.h"
#include "unboxed_kernels.h"

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

void run_on_dtensors(const c10::OperatorHandle& op, torch::jit::Stack* stack, const DeviceMesh* mesh) {
  if (C10_UNLIKELY(is_foreach_op(op))) return run_foreach(op, stack);
  const size_t nargs = op.schema().arguments().size();
  const c10::IValue* args = stack->data() + (stack->size() - nargs);
  TORCH_INTERNAL_ASSERT(mesh != nullptr, "DTensor fallback reached without a DTensor argument for ", op.operator_name());
  OpInfo info(op, args, nargs, *mesh);
  DecisionKey key;
  collect_inputs(info, key);
  std::shared_ptr<const Decision> d = propagate(info, key);
  if (d == nullptr) return decompose(op, args, nargs, stack);
  if (C10_UNLIKELY(d->communicates)) check_explicit_redistribution(info, *d);
  execute(info, *d, stack);
}

thread_local OpInterceptor* t_interceptor = nullptr;

}  // namespace

void check_dtensor_call(const c10::OperatorHandle& op, const torch::jit::Stack& call) {
  const size_t nargs = op.schema().arguments().size();
  const c10::IValue* args = call.data() + (call.size() - nargs);
  const DeviceMesh* mesh = find_mesh(args, nargs);
  if (mesh == nullptr) return;
  OpInfo info(op, args, nargs, *mesh);
  DecisionKey key;
  collect_inputs(info, key);
  std::shared_ptr<const Decision> d = propagate(info, key);
  if (d == nullptr) return;  // decomposed when it runs: its pieces are decided then
  if (C10_UNLIKELY(d->communicates)) check_explicit_redistribution(info, *d);
  check_writes(info, *d);
}

void dtensor_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t nargs = op.schema().arguments().size();
  const DeviceMesh* mesh = find_mesh(stack->data() + (stack->size() - nargs), nargs);
  OpInterceptor* interceptor = t_interceptor;
  if (C10_LIKELY(interceptor == nullptr)) {
    // No DTensor and no interceptor of ours: the key was included by someone else (torch's C++
    // FakeTensor mode). Plain tensors pass through untouched; making a DTensor is refused there.
    if (C10_UNLIKELY(mesh == nullptr))
      return op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kDTensorKey), stack);
    return run_on_dtensors(op, stack, mesh);
  }
  // The ops this op calls are not intercepted: the interceptor leaves the included keys.
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  const c10::impl::ForceDispatchKeyGuard outside(tls.included_.remove(kDTensorKey), tls.excluded_);
  OpInterceptorScope none(nullptr);
  interceptor->on_op(op, stack, [&] {
    if (mesh != nullptr) run_on_dtensors(op, stack, mesh);
    else op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kDTensorKey), stack);
  });
}

bool op_interceptor_installed() { return t_interceptor != nullptr; }

namespace {

// The fallback and the unboxed kernels are registered when the library loads, unless another
// library in the process took kDTensorKey first (upstream has begun to use `Fake` for a C++
// FakeTensor): the dispatcher would refuse a second fallback by aborting the load with a message
// about dispatch keys. Instead the load succeeds and making a DTensor raises a clear error.
// Whether `self` may take `from`'s metadata (`param.data = from`, which module.to and to_empty
// use to keep a parameter object): a DTensor takes any DTensor's (shallow_copy_from copies its
// local tensor and spec), whatever device its local tensor is on, so to_empty from meta keeps
// the parameter objects, and with them ties and gradient hooks. Anything else: torch's rule.
// The op is composite; this kernel sits at the Autograd keys our DTensors carry.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (is_dtensor(self) && is_dtensor(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

struct FallbackRegistration {
  std::unique_ptr<torch::Library> library, kernels;
  std::vector<std::unique_ptr<torch::Library>> autograd_kernels;
  bool taken_by_another = false;
  FallbackRegistration() {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kDTensorKey)) {
      taken_by_another = true;
      return;
    }
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kDTensorKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&dtensor_fallback>());
    kernels = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", kDTensorKey, __FILE__, __LINE__);
    register_unboxed_kernels(*kernels);
    for (const c10::DispatchKey key : {c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutogradCUDA, c10::DispatchKey::AutogradMeta}) {
      autograd_kernels.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__));
      autograd_kernels.back()->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
    }
  }
};

const FallbackRegistration& registration() {
  static const FallbackRegistration r;
  return r;
}
[[maybe_unused]] const bool registered_at_load = (registration(), true);

}  // namespace

OpInterceptorScope::OpInterceptorScope(OpInterceptor* interceptor)
    : previous_(t_interceptor), was_included_(c10::impl::tls_is_dispatch_key_included(kDTensorKey)) {
  if (interceptor != nullptr) check_dtensor_key_is_ours();
  t_interceptor = interceptor;
  c10::impl::tls_set_dispatch_key_included(kDTensorKey, interceptor != nullptr);
}

OpInterceptorScope::~OpInterceptorScope() {
  t_interceptor = previous_;
  c10::impl::tls_set_dispatch_key_included(kDTensorKey, was_included_);
}

std::atomic<bool> detail::g_dtensor_key_is_ours{false};

void detail::check_included_key_is_ours() {
  TORCH_CHECK(t_interceptor != nullptr, "hyper_parallel::DTensor: the dispatch key ", c10::toString(kDTensorKey),
              ", which DTensors use, is in this thread's included keys and hyper_parallel did not put it there: torch's ",
              "C++ FakeTensor mode (FakeTensorModeTLS) is active on this thread, and every op of it, plain tensors too, ",
              "would reach the DTensor fallback. Make and use DTensors outside that mode");
}

void detail::check_dtensor_key_is_ours_slow() {
  const bool ours = !registration().taken_by_another;
  TORCH_CHECK(ours, "hyper_parallel::DTensor: another library in this process registered a fallback for ",
              "the dispatch key ", c10::toString(kDTensorKey), " before hyper_parallel was loaded; DTensors need that ",
              "key's fallback (src/dtensor/dtensor_impl.h, kDTensorKey), so none can be made. Load only one of the two.");
  g_dtensor_key_is_ours.store(true, std::memory_order_relaxed);
}

}  // namespace hyper_parallel

