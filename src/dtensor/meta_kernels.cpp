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

// Rows `index` of `self` along `dim`.
at::Tensor index_select_meta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  std::vector<int64_t> shape = self.sizes().vec();
  if (shape.empty()) return meta_like({}, self);
  dim = wrap_dim(dim, self.dim(), "index_select");
  shape[static_cast<size_t>(dim)] = index.numel();
  return meta_like(shape, self);
}

// The gradient of an embedding's weight: [num_weights, grad.size(-1)].
at::Tensor embedding_dense_backward_meta(const at::Tensor& grad, const at::Tensor&, c10::SymInt num_weights, c10::SymInt,
                                         bool) {
  return meta_like({num_weights.expect_int(), grad.size(-1)}, grad);
}

at::Tensor& masked_fill_scalar_meta(at::Tensor& self, const at::Tensor&, const at::Scalar&) { return self; }
at::Tensor& masked_fill_tensor_meta(at::Tensor& self, const at::Tensor&, const at::Tensor&) { return self; }

template <class F>
void register_missing(torch::Library& lib, const char* name, const char* overload, F* fn) {
  const auto op = c10::Dispatcher::singleton().findOp({name, overload});
  if (op && op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) return;
  const std::string full = std::string(name).substr(6) + (*overload ? std::string(".") + overload : std::string());
  lib.impl(full.c_str(), fn);
}

struct Registration {
  std::unique_ptr<torch::Library> lib;
  Registration() {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    register_missing(*lib, "aten::index_select", "", &index_select_meta);
    register_missing(*lib, "aten::embedding_dense_backward", "", &embedding_dense_backward_meta);
    register_missing(*lib, "aten::masked_fill_", "Scalar", &masked_fill_scalar_meta);
    register_missing(*lib, "aten::masked_fill_", "Tensor", &masked_fill_tensor_meta);
  }
};
const Registration g_registration;

}  // namespace
}  // namespace hyper_parallel
