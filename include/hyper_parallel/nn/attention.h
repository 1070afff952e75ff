#pragma once
// Scaled dot-product attention as a module (torchtitan's ScaledDotProductAttention): the part of
// an attention layer that mixes positions, with no parameters. Keeping it a module of its own
// gives the styles that split the sequence (context_parallel/) one place to take over, while
// the projections around it stay Linear layers for the tensor-parallel styles.
#include <hyper_parallel/nn/module.h>

#include <c10/util/Optional.h>

#include <functional>

namespace hyper_parallel {
namespace nn {

/// is_causal: query i sees keys 0..i (of a self-attention over the same positions). scale: the
/// scores' divisor is sqrt(head_dim) when unset, else scores are multiplied by it. dropout_p:
/// dropout on the probabilities while training, drawn by `dropout_fn` when set (a model that
/// draws per global head), else by hyper_parallel::dropout.
struct ScaledDotProductAttentionOptions {
  TORCH_ARG(bool, is_causal) = false;
  TORCH_ARG(c10::optional<double>, scale) = c10::nullopt;
  TORCH_ARG(double, dropout_p) = 0.0;
};

/// query [B, H, S, D], key and value [B, Hk, T, D] with H a multiple of Hk (grouped-query
/// attention: query head h reads key head h / (H / Hk)) -> [B, H, S, D], in the query's dtype.
/// Scores are computed in the inputs' dtype and the softmax in float32, as transformers' eager
/// attention does. e.g.
/// `hnn::ScaledDotProductAttention sdpa(hnn::ScaledDotProductAttentionOptions().is_causal(true)); auto o = sdpa(q, k, v);`
class ScaledDotProductAttentionImpl : public ModuleBase<ScaledDotProductAttentionImpl> {
 public:
  explicit ScaledDotProductAttentionImpl(const ScaledDotProductAttentionOptions& options = {}) : options(options) {}
  at::Tensor forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value);
  /// With an explicit mask: `blocked` (bool, broadcastable to [B, H, S, T]) is true where a query
  /// may not see a key; is_causal is not applied on top.
  at::Tensor forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& blocked);
  ScaledDotProductAttentionOptions options;
  /// Draws the dropout of the probabilities [B, H, S, T] (set by a model; optional).
  std::function<at::Tensor(const at::Tensor&)> dropout_fn;
};
HP_MODULE(ScaledDotProductAttention);

namespace functional {
/// The attention of ScaledDotProductAttention on plain tensors: `blocked` (bool, broadcastable
/// to the scores [B, H, S, T]; undefined: none) is true where a query may not see a key.
/// Context parallelism builds it with causal_mask from positions, since a load-balanced
/// sequence is permuted. `dropout` may be null.
at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& blocked, c10::optional<double> scale,
                                        const std::function<at::Tensor(const at::Tensor&)>& dropout = nullptr);
/// The mask of queries at `q_positions` over keys at `k_positions` ([S, T], true: blocked), for
/// causal attention.
at::Tensor causal_mask(const at::Tensor& q_positions, const at::Tensor& k_positions);
/// Key heads repeated to match `heads` query heads ([B, Hk, T, D] -> [B, heads, T, D]), each key
/// head serving heads / Hk consecutive query heads.
at::Tensor repeat_kv(const at::Tensor& x, int64_t heads);
}  // namespace functional

}  // namespace nn
}  // namespace hyper_parallel
