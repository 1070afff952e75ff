#include <hyper_parallel/nn/attention.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/runtime/errors.h>

#include <cmath>

namespace hyper_parallel {
namespace nn {
namespace functional {

at::Tensor repeat_kv(const at::Tensor& x, int64_t heads) {
  const auto s = x.sizes();
  HP_CHECK_T(c10::ValueError, x.dim() == 4 && s[1] > 0 && heads % s[1] == 0, "hyper_parallel::nn::functional::repeat_kv: ",
             heads, " query heads cannot share key heads of shape ", x.sizes(), " ([B, Hk, T, D] with Hk dividing the heads)");
  const int64_t groups = heads / s[1];
  if (groups == 1) return x;
  return x.unsqueeze(2).expand({s[0], s[1], groups, s[2], s[3]}).reshape({s[0], heads, s[2], s[3]});
}

at::Tensor causal_mask(const at::Tensor& q_positions, const at::Tensor& k_positions) {
  return k_positions.view({1, -1}).gt(q_positions.view({-1, 1}));
}

at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& blocked, c10::optional<double> scale,
                                        const std::function<at::Tensor(const at::Tensor&)>& dropout) {
  HP_CHECK_T(c10::ValueError, query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && key.sizes() == value.sizes() &&
                                  query.size(0) == key.size(0) && query.size(3) == key.size(3),
             "hyper_parallel::nn::functional::scaled_dot_product_attention: query ", query.sizes(), ", key ", key.sizes(),
             " and value ", value.sizes(), " are not [B, H, S, D], [B, Hk, T, D], [B, Hk, T, D]");
  const int64_t heads = query.size(1);
  const at::Tensor k = repeat_kv(key, heads), v = repeat_kv(value, heads);
  at::Tensor scores = query.matmul(k.transpose(-2, -1));
  scores = scale ? scores * *scale : scores / std::sqrt(static_cast<double>(query.size(3)));
  // A large finite fill rather than -inf: a row with every key blocked (padding) stays finite.
  if (blocked.defined()) scores = scores.masked_fill(blocked, -1e9);
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(query.scalar_type());
  if (dropout) probs = dropout(probs);
  return probs.matmul(v);
}

}  // namespace functional

at::Tensor ScaledDotProductAttentionImpl::forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  at::Tensor blocked;
  if (options.is_causal()) {
    HP_CHECK_T(c10::ValueError, query.dim() == 4 && key.dim() == 4 && query.size(2) == key.size(2),
               "hyper_parallel::nn::ScaledDotProductAttention::forward: is_causal needs as many queries as keys, got query ",
               query.sizes(), " and key ", key.sizes());
    const int64_t s = query.size(2);
    blocked = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(query.device())).triu(1);
  }
  return forward(query, key, value, blocked);
}

at::Tensor ScaledDotProductAttentionImpl::forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                                  const at::Tensor& blocked) {
  std::function<at::Tensor(const at::Tensor&)> drop;
  if (options.dropout_p() > 0.0 && is_training()) {
    const double p = options.dropout_p();
    drop = dropout_fn ? dropout_fn : [p](const at::Tensor& probs) { return hyper_parallel::dropout(probs, p, true); };
  }
  return functional::scaled_dot_product_attention(query, key, value, blocked, options.scale(), drop);
}

}  // namespace nn
}  // namespace hyper_parallel
