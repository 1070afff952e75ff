#pragma once
// The gated MLP of the Qwen families' decoder layers and of their shared experts:
// down_proj(silu(gate_proj(x)) * up_proj(x)), projections without bias (transformers' Qwen3MLP,
// Qwen3_5MLP, Qwen3_5MoeMLP).
#include <hyper_parallel/nn/layers.h>

namespace hyper_parallel {
namespace nn {

/// gate_proj and up_proj [intermediate, hidden], down_proj [hidden, intermediate]; forward(x [..., hidden]).
class SwiGLUMlpImpl : public ModuleBase<SwiGLUMlpImpl> {
 public:
  SwiGLUMlpImpl(int64_t hidden_size, int64_t intermediate_size);
  at::Tensor forward(const at::Tensor& x);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
HP_MODULE(SwiGLUMlp);

}  // namespace nn
}  // namespace hyper_parallel
