// Meta kernels for the aten ops a model's forward and backward meet that libtorch's C++ build has
// none for (PyTorch registers those from Python, which a C++ program never loads). With them a
// model runs on the meta device end to end (qwen3::plan_training, hp_plan). Each is registered
// only when the op has no Meta kernel of its own, so a libtorch that gains one keeps its own.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>

#include <hyper_parallel/runtime/errors.h>

namespace hyper_parallel {
namespace {

at::Tensor meta_like(at::IntArrayRef shape, const at::Tensor& like) {
  return at::empty(shape, like.options().device(at::kMeta));
}

// The kernels are boxed: the schemas differ between libtorch versions (int or SymInt sizes), and
// a boxed kernel reads its arguments off the stack whatever their C++ types.

// index_select(self, dim, index): rows `index` of `self` along `dim`.
void index_select_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const at::Tensor index = stack->back().toTensor();
  const int64_t dim = (*stack)[stack->size() - 2].toInt();
  const at::Tensor self = (*stack)[stack->size() - 3].toTensor();
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape[static_cast<size_t>(wrap_dim(dim, self.dim(), "index_select"))] = index.numel();
  torch::jit::drop(*stack, 3);
  stack->emplace_back(meta_like(shape, self));
}

// embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq): the
// weight's gradient, [num_weights, grad.size(-1)].
void embedding_dense_backward_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const size_t n = stack->size();
  const at::Tensor grad = (*stack)[n - 5].toTensor();
  const int64_t num_weights = (*stack)[n - 3].toInt();
  torch::jit::drop(*stack, 5);
  stack->emplace_back(meta_like({num_weights, grad.size(-1)}, grad));
}

// masked_fill_(self, mask, value): self, unchanged in shape.
void masked_fill_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const at::Tensor self = (*stack)[stack->size() - 3].toTensor();
  torch::jit::drop(*stack, 3);
  stack->emplace_back(self);
}

using BoxedFn = void(const c10::OperatorHandle&, torch::jit::Stack*);

template <BoxedFn* fn>
void register_missing(torch::Library& lib, const char* name, const char* overload) {
  const auto op = c10::Dispatcher::singleton().findOp({name, overload});
  if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) return;
  const std::string full = std::string(name).substr(6) + (*overload ? std::string(".") + overload : std::string());
  lib.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<fn>());
}

struct Registration {
  std::unique_ptr<torch::Library> lib;
  Registration() {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    register_missing<&index_select_meta>(*lib, "aten::index_select", "");
    register_missing<&embedding_dense_backward_meta>(*lib, "aten::embedding_dense_backward", "");
    register_missing<&masked_fill_meta>(*lib, "aten::masked_fill_", "Scalar");
    register_missing<&masked_fill_meta>(*lib, "aten::masked_fill_", "Tensor");
  }
};
const Registration g_registration;

}  // namespace
}  // namespace hyper_parallel
