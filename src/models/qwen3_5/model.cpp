#include <hyper_parallel/models/qwen3_5/model.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>

#include "../rotary.h"

namespace hyper_parallel {
namespace qwen3_5 {
namespace hp = hyper_parallel;

namespace {

hnn::LinearOptions projection(int64_t in, int64_t out) { return hnn::LinearOptions(in, out).bias(false); }

hnn::RMSNorm zero_centered_norm(int64_t dim, double eps) {
  return hnn::RMSNorm(hnn::RMSNormOptions(dim).eps(eps).zero_centered(true));
}

// cos/sin [1, 1, S, rotary_dim] of positions 0..S-1. Text positions are alike on mRoPE's three
// axes, so this is plain RoPE.
std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t s, int64_t rotary_dim, double theta, at::ScalarType dtype, const at::Device& device) {
  return models::rotary_tables(at::arange(s, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0), rotary_dim, theta, dtype);
}

}  // namespace

GatedAttentionImpl::GatedAttentionImpl(const Config& c) : config(c) {
  const int64_t width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
  q_proj = register_module("q_proj", hnn::Linear(projection(c.hidden_size, 2 * width)));
  k_proj = register_module("k_proj", hnn::Linear(projection(c.hidden_size, kv_width)));
  v_proj = register_module("v_proj", hnn::Linear(projection(c.hidden_size, kv_width)));
  o_proj = register_module("o_proj", hnn::Linear(projection(width, c.hidden_size)));
  q_norm = register_module("q_norm", zero_centered_norm(c.head_dim, c.rms_norm_eps));
  k_norm = register_module("k_norm", zero_centered_norm(c.head_dim, c.rms_norm_eps));
  sdpa = register_module("sdpa", hnn::ScaledDotProductAttention(hnn::ScaledDotProductAttentionOptions().is_causal(true)));
}

at::Tensor GatedAttentionImpl::forward(const at::Tensor& hidden, const hnn::Kwargs& rotary) {
  at::Tensor cos, sin;
  for (const auto& [name, value] : rotary) {
    HP_CHECK_T(c10::ValueError, (name == "cos" || name == "sin") && value.isTensor(), "hyper_parallel::qwen3_5::GatedAttentionImpl::forward: ",
               "takes the rotary tables cos and sin as keywords, got '", name, "'");
    (name == "cos" ? cos : sin) = value.toTensor();
  }
  const int64_t d = config.head_dim, b = hidden.size(0), s = hidden.size(1);
  if (!cos.defined() || !sin.defined())
    std::tie(cos, sin) = rotary_tables(s, config.rotary_dim(), config.rope_theta, hidden.scalar_type(), hidden.device());
  // Per head: its query rows, then its gate rows ([q_0 | g_0 | q_1 | g_1 | ...]).
  const auto qg = q_proj(hidden).view({b, s, -1, 2 * d}).chunk(2, -1);
  const int64_t heads = qg[0].size(2);
  const at::Tensor gate = qg[1].reshape({b, s, heads * d});
  at::Tensor q = q_norm(qg[0]).transpose(1, 2);
  at::Tensor k = k_norm(k_proj(hidden).view({b, s, -1, d})).transpose(1, 2);
  const at::Tensor v = v_proj(hidden).view({b, s, -1, d}).transpose(1, 2);
  q = models::apply_rotary(q, cos, sin);
  k = models::apply_rotary(k, cos, sin);
  const at::Tensor out = sdpa(q, k, v).transpose(1, 2).reshape({b, s, heads * d});
  return o_proj(out * at::sigmoid(gate));
}

LinearAttentionImpl::LinearAttentionImpl(const Config& c) : config(c) {
  const int64_t key_dim = c.linear_num_key_heads * c.linear_key_head_dim, value_dim = c.linear_num_value_heads * c.linear_value_head_dim;
  in_proj_q = register_module("in_proj_q", hnn::Linear(projection(c.hidden_size, key_dim)));
  in_proj_k = register_module("in_proj_k", hnn::Linear(projection(c.hidden_size, key_dim)));
  in_proj_v = register_module("in_proj_v", hnn::Linear(projection(c.hidden_size, value_dim)));
  in_proj_z = register_module("in_proj_z", hnn::Linear(projection(c.hidden_size, value_dim)));
  in_proj_b = register_module("in_proj_b", hnn::Linear(projection(c.hidden_size, c.linear_num_value_heads)));
  in_proj_a = register_module("in_proj_a", hnn::Linear(projection(c.hidden_size, c.linear_num_value_heads)));
  gdn = register_module("gdn", hnn::GatedDeltaNet(hnn::GatedDeltaNetOptions(c.linear_num_key_heads, c.linear_num_value_heads,
                                                                            c.linear_key_head_dim, c.linear_value_head_dim)
                                                      .conv_kernel_size(c.linear_conv_kernel_dim)));
  norm = register_module("norm", hnn::RMSNormGated(c.linear_value_head_dim, c.rms_norm_eps));
  out_proj = register_module("out_proj", hnn::Linear(projection(value_dim, c.hidden_size)));
}

at::Tensor LinearAttentionImpl::forward(const at::Tensor& hidden) {
  const int64_t b = hidden.size(0), s = hidden.size(1), dv = config.linear_value_head_dim;
  const at::Tensor o = gdn->forward(in_proj_q(hidden), in_proj_k(hidden), in_proj_v(hidden), in_proj_a(hidden), in_proj_b(hidden));
  at::Tensor z = in_proj_z(hidden).view({b, s, -1, dv});
  // Under tensor parallelism the norm's weight is a Replicate DTensor over this rank's value heads
  // (its style lays out `o`, the first input); the gate joins it alike.
  const at::Tensor& w = norm->parameter("weight");
  if (hp::is_dtensor(w) && !hp::is_dtensor(z)) z = hp::DTensor::from_local(z, hp::DTensor(w).device_mesh(), {hp::Shard(2)});
  return out_proj(norm(o, z).reshape({b, s, -1}));
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c, int64_t layer_idx) {
  input_layernorm = register_module("input_layernorm", zero_centered_norm(c.hidden_size, c.rms_norm_eps));
  if (c.full_attention.at(static_cast<size_t>(layer_idx))) self_attn = register_module("self_attn", GatedAttention(c));
  else linear_attn = register_module("linear_attn", LinearAttention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", zero_centered_norm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", Mlp(c.hidden_size, c.intermediate_size));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& hidden, const hnn::Kwargs& rotary) {
  const at::Tensor x = input_layernorm(hidden);
  const at::Tensor h = hidden + (self_attn ? self_attn(x, rotary) : linear_attn(x));
  return h + mlp(post_attention_layernorm(h));
}

CausalLMImpl::CausalLMImpl(const Config& c) : config(c) {
  HP_CHECK_T(c10::ValueError, static_cast<int64_t>(c.full_attention.size()) == c.num_layers, "hyper_parallel::qwen3_5::CausalLM: the layer ",
             "schedule names ", c.full_attention.size(), " layers, the model has ", c.num_layers);
  embed_tokens = register_module("embed_tokens", hnn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", hnn::ModuleList(0));
  for (int64_t i = 0; i < c.num_layers; ++i) layers->push_back(DecoderLayer(c, i).ptr());
  norm = register_module("norm", zero_centered_norm(c.hidden_size, c.rms_norm_eps));
  {
    // A tied lm_head is embed_tokens' weight: built on meta, it allocates and draws nothing.
    c10::optional<hnn::ParameterScope> tied;
    if (c.tie_word_embeddings) tied.emplace(hnn::ParameterScope::current().device(at::kMeta));
    lm_head = register_module("lm_head", hnn::Linear(projection(c.hidden_size, c.vocab_size)));
  }
  tie_weights();
}

void CausalLMImpl::tie_weights() {
  if (config.tie_word_embeddings) lm_head->replace_parameter("weight", embed_tokens->weight());
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids) {
  at::Tensor h = embed_tokens(input_ids);
  // The tables travel as arguments, so a checkpointed layer's recompute replays them.
  const auto [cos, sin] = rotary_tables(input_ids.size(1), config.rotary_dim(), config.rope_theta, h.scalar_type(), h.device());
  const hnn::Kwargs rotary{{"cos", cos}, {"sin", sin}};
  for (const auto& layer : *layers) h = hnn::call_with_hooks(*layer->as<DecoderLayerImpl>(), h, rotary);
  return lm_head(norm(h));
}

}  // namespace qwen3_5
}  // namespace hyper_parallel
