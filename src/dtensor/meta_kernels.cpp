// Meta kernels for the aten ops a model's forward and backward meet that libtorch's C++ build has
// none for (PyTorch registers those from Python, which a C++ program never loads). With them a
// model runs on the meta device end to end (models::plan_training, hp_plan). Each is registered
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

// convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed,
// output_padding, groups): [N, C_out, L_out...] with L_out = (L + 2p - d(k - 1) - 1) / s + 1
// per spatial dimension (a device type without its own convolution, meta among them, lands here).
void convolution_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const size_t n = stack->size();
  const at::Tensor input = (*stack)[n - 9].toTensor(), weight = (*stack)[n - 8].toTensor();
  const auto stride = (*stack)[n - 6].toIntVector(), padding = (*stack)[n - 5].toIntVector(), dilation = (*stack)[n - 4].toIntVector();
  HP_CHECK_T(c10::NotImplementedError, !(*stack)[n - 3].toBool(), "hyper_parallel::convolution_meta: the meta device's convolution_overrideable does ",
             "not do transposed convolutions");
  std::vector<int64_t> shape{input.size(0), weight.size(0)};
  for (int64_t d = 2; d < input.dim(); ++d) {
    const size_t i = static_cast<size_t>(d - 2);
    auto at = [&](const std::vector<int64_t>& v) { return v.size() == 1 ? v[0] : v[i]; };
    shape.push_back((input.size(d) + 2 * at(padding) - at(dilation) * (weight.size(d) - 1) - 1) / at(stride) + 1);
  }
  torch::jit::drop(*stack, 9);
  stack->emplace_back(meta_like(shape, input));
}

// convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
// transposed, output_padding, groups, output_mask): the gradients of input, weight and bias,
// shaped as they are (undefined where output_mask says no).
void convolution_backward_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const size_t n = stack->size();
  const at::Tensor grad = (*stack)[n - 10].toTensor(), input = (*stack)[n - 9].toTensor(), weight = (*stack)[n - 8].toTensor();
  const auto mask = (*stack)[n - 1].toBoolList();
  torch::jit::drop(*stack, 10);
  stack->emplace_back(mask.get(0) ? meta_like(input.sizes(), input) : at::Tensor());
  stack->emplace_back(mask.get(1) ? meta_like(weight.sizes(), weight) : at::Tensor());
  stack->emplace_back(mask.get(2) ? meta_like({grad.size(1)}, grad) : at::Tensor());
}

// linalg_solve_triangular(A, B, upper, left, unitriangular): X shaped as B, its batch dimensions
// broadcast with A's.
void solve_triangular_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const size_t n = stack->size();
  const at::Tensor a = (*stack)[n - 5].toTensor(), b = (*stack)[n - 4].toTensor();
  std::vector<int64_t> batch = at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2));
  batch.push_back(b.size(-2));
  batch.push_back(b.size(-1));
  torch::jit::drop(*stack, 5);
  stack->emplace_back(meta_like(batch, b));
}

// flip(self, dims): self's shape.
void flip_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const at::Tensor self = (*stack)[stack->size() - 2].toTensor();
  torch::jit::drop(*stack, 2);
  stack->emplace_back(meta_like(self.sizes(), self));
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
    register_missing<&convolution_meta>(*lib, "aten::convolution_overrideable", "");
    register_missing<&convolution_backward_meta>(*lib, "aten::convolution_backward_overrideable", "");
    register_missing<&solve_triangular_meta>(*lib, "aten::linalg_solve_triangular", "");
    register_missing<&flip_meta>(*lib, "aten::flip", "");
  }
};
const Registration g_registration;

}  // namespace
}  // namespace hyper_parallel
