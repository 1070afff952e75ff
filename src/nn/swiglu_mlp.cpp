#include <hyper_parallel/nn/swiglu_mlp.h>

#include <ATen/ATen.h>

namespace hyper_parallel {
namespace nn {

SwiGLUMlpImpl::SwiGLUMlpImpl(int64_t hidden, int64_t intermediate) {
  gate_proj = register_module("gate_proj", Linear(LinearOptions(hidden, intermediate).bias(false)));
  up_proj = register_module("up_proj", Linear(LinearOptions(hidden, intermediate).bias(false)));
  down_proj = register_module("down_proj", Linear(LinearOptions(intermediate, hidden).bias(false)));
}

at::Tensor SwiGLUMlpImpl::forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }

}  // namespace nn
}  // namespace hyper_parallel
