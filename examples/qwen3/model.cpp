#include "model.h"

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>

#include <cmath>

namespace qwen3 {

namespace {
// cos/sin tables [S, head_dim] of the rotary embedding.
std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t seq, int64_t head_dim, double theta, const at::TensorOptions& opts) {
  at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, head_dim, 2, at::kFloat) / static_cast<double>(head_dim));
  at::Tensor freqs = at::outer(at::arange(seq, at::kFloat), inv_freq);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(opts.dtype()), emb.sin().to(opts.dtype())};
}

at::Tensor rotate_half(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::cat({-halves[1], halves[0]}, -1);
}

// [B, kv, S, D] -> [B, kv * groups, S, D]
at::Tensor repeat_kv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto s = x.sizes();
  return x.unsqueeze(2).expand({s[0], s[1], groups, s[2], s[3]}).reshape({s[0], s[1] * groups, s[2], s[3]});
}
}  // namespace

AttentionImpl::AttentionImpl(const Config& c) : config(c) {
  const int64_t q_width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
  q_proj = register_module("q_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, q_width).bias(false)));
  k_proj = register_module("k_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, kv_width).bias(false)));
  v_proj = register_module("v_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, kv_width).bias(false)));
  o_proj = register_module("o_proj", hnn::Linear(hnn::LinearOptions(q_width, c.hidden_size).bias(false)));
  q_norm = register_module("q_norm", hnn::RMSNorm(hnn::RMSNormOptions(c.head_dim).eps(c.rms_norm_eps)));
  k_norm = register_module("k_norm", hnn::RMSNorm(hnn::RMSNormOptions(c.head_dim).eps(c.rms_norm_eps)));
}

at::Tensor AttentionImpl::forward(const at::Tensor& hidden) {
  const int64_t d = config.head_dim;
  // Local tensors under tensor parallelism: this rank's heads.
  at::Tensor q = q_proj(hidden), k = k_proj(hidden), v = v_proj(hidden);
  const int64_t b = q.size(0), s = q.size(1);
  // (B, S, heads, D): the q/k norms act per head over D.
  q = q_norm(q.view({b, s, -1, d})).transpose(1, 2);
  k = k_norm(k.view({b, s, -1, d})).transpose(1, 2);
  v = v.view({b, s, -1, d}).transpose(1, 2);
  auto [cos, sin] = rotary_tables(s, d, config.rope_theta, q.options());
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  const int64_t heads = q.size(1);
  k = repeat_kv(k, heads / k.size(1));
  v = repeat_kv(v, heads / v.size(1));
  at::Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  at::Tensor causal = at::ones({s, s}, at::TensorOptions().dtype(at::kBool)).triu(1);
  at::Tensor probs = at::softmax(scores.masked_fill(causal, -1e9), -1);
  at::Tensor out = probs.matmul(v).transpose(1, 2).reshape({b, s, heads * d});
  return o_proj(out);
}

MlpImpl::MlpImpl(const Config& c) {
  gate_proj = register_module("gate_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, c.intermediate_size).bias(false)));
  up_proj = register_module("up_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, c.intermediate_size).bias(false)));
  down_proj = register_module("down_proj", hnn::Linear(hnn::LinearOptions(c.intermediate_size, c.hidden_size).bias(false)));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }

DecoderLayerImpl::DecoderLayerImpl(const Config& c) {
  input_layernorm = register_module("input_layernorm", hnn::RMSNorm(hnn::RMSNormOptions(c.hidden_size).eps(c.rms_norm_eps)));
  self_attn = register_module("self_attn", Attention(c));
  post_attention_layernorm =
      register_module("post_attention_layernorm", hnn::RMSNorm(hnn::RMSNormOptions(c.hidden_size).eps(c.rms_norm_eps)));
  mlp = register_module("mlp", Mlp(c));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& hidden) {
  at::Tensor h = hidden + self_attn(input_layernorm(hidden));
  return h + mlp(post_attention_layernorm(h));
}

CausalLMImpl::CausalLMImpl(const Config& c) : config(c) {
  embed_tokens = register_module("embed_tokens", hnn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", hnn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) layers->push_back(DecoderLayer(c).ptr());
  norm = register_module("norm", hnn::RMSNorm(hnn::RMSNormOptions(c.hidden_size).eps(c.rms_norm_eps)));
  lm_head = register_module("lm_head", hnn::Linear(hnn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids) {
  at::Tensor h = embed_tokens(input_ids);
  for (const auto& layer : *layers) h = layer->as<DecoderLayerImpl>()->call_tensor(h);
  return lm_head(norm(h));
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  at::Tensor t = targets.reshape({-1});
  if (hyper_parallel::is_dtensor(logits) && !hyper_parallel::is_dtensor(t)) {
    // Loss parallel: the logits stay a DTensor; the (replicated) targets join them.
    const auto& mesh = hyper_parallel::DTensor(logits).device_mesh();
    t = hyper_parallel::DTensor::from_local(t, mesh, hyper_parallel::Placements(static_cast<size_t>(mesh.ndim()), hyper_parallel::Replicate()));
  }
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), t);
}

}  // namespace qwen3
