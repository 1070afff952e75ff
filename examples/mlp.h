#pragma once
// The two-layer MLP of the tp_mlp example and the tp_mlp_vs_manual benchmark.
#include <ATen/ATen.h>

#include <hyper_parallel/nn/layers.h>

namespace hp_examples {
namespace hnn = hyper_parallel::nn;

/// down(gelu(up(x))).
class MlpImpl : public hnn::ModuleBase<MlpImpl> {
 public:
  MlpImpl(int64_t dim, int64_t hidden) {
    up = register_module("up", hnn::Linear(dim, hidden));
    down = register_module("down", hnn::Linear(hidden, dim));
  }
  at::Tensor forward(const at::Tensor& x) { return down(at::gelu(up(x))); }
  hnn::Linear up{nullptr}, down{nullptr};
};
HP_MODULE(Mlp);

}  // namespace hp_examples
