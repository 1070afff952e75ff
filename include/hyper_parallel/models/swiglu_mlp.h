#pragma once
// The MLP every Qwen family's decoder layer shares: down_proj(silu(gate_proj(x)) * up_proj(x)),
// projections without bias (transformers' Qwen3MLP and Qwen3_5MLP).
#include <hyper_parallel/nn/layers.h>

namespace hyper_parallel {
namespace models {

/// gate_proj and up_proj [intermediate, hidden], down_proj [hidden, intermediate]; forward(x [..., hidden]).
class SwiGLUMlpImpl : public nn::ModuleBase<SwiGLUMlpImpl> {
 public:
  SwiGLUMlpImpl(int64_t hidden_size, int64_t intermediate_size);
  at::Tensor forward(const at::Tensor& x);
  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
HP_MODULE(SwiGLUMlp);

}  // namespace models
}  // namespace hyper_parallel
