#include <hyper_parallel/models/qwen3_5/model.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>

#include "../attention_mask.h"
#include "../keywords.h"
#include "../layer_kwargs.h"
#include "../load_balancing.h"
#include "../replicated_kv_heads.h"
#include "../rotary.h"

namespace hyper_parallel {
namespace qwen3_5 {
namespace hp = hyper_parallel;

namespace {

using Kw = models::LayerKwargs<Cache>;

hnn::LinearOptions projection(int64_t in, int64_t out) { return hnn::LinearOptions(in, out).bias(false); }

hnn::RMSNorm zero_centered_norm(int64_t dim, double eps) {
  return hnn::RMSNorm(hnn::RMSNormOptions(dim).eps(eps).zero_centered(true));
}

// x with its padded positions zeroed (`keep` [B, S, 1]), a plain tensor or a replicated DTensor.
at::Tensor zero_padding(const at::Tensor& x, const at::Tensor& keep) {
  if (!hp::is_dtensor(x)) return x * keep;
  const hp::DTensor d(x);
  for (const auto& p : d.placements())
    HP_CHECK_T(c10::ValueError, p.is_replicate(), "hyper_parallel::qwen3_5::LinearAttentionImpl::forward: padded generation needs the ",
               "layer's input replicated, got ", hp::to_string(d.placements()), " (sequence parallelism does not generate)");
  return hp::DTensor::from_local(d.to_local() * keep, d.device_mesh(), d.placements());
}

}  // namespace

GatedAttentionImpl::GatedAttentionImpl(const Config& c, int64_t layer) : config(c), layer_idx(layer) {
  const int64_t width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
  q_proj = register_module("q_proj", hnn::Linear(projection(c.hidden_size, 2 * width)));
  k_proj = register_module("k_proj", hnn::Linear(projection(c.hidden_size, kv_width)));
  v_proj = register_module("v_proj", hnn::Linear(projection(c.hidden_size, kv_width)));
  o_proj = register_module("o_proj", hnn::Linear(projection(width, c.hidden_size)));
  q_norm = register_module("q_norm", zero_centered_norm(c.head_dim, c.rms_norm_eps));
  k_norm = register_module("k_norm", zero_centered_norm(c.head_dim, c.rms_norm_eps));
  sdpa = register_module("sdpa", hnn::ScaledDotProductAttention(hnn::ScaledDotProductAttentionOptions().is_causal(true)));
}

at::Tensor GatedAttentionImpl::forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs) {
  const Kw in = Kw::parse(kwargs, {"cos", "sin", "blocked", "cache"}, "qwen3_5::GatedAttentionImpl::forward");
  at::Tensor cos = in.cos, sin = in.sin;
  const int64_t d = config.head_dim;
  // Local tensors under tensor parallelism: this rank's heads. Per head: its query rows, then its
  // gate rows ([q_0 | g_0 | q_1 | g_1 | ...]).
  const at::Tensor qg_rows = q_proj(hidden);
  const int64_t b = qg_rows.size(0), s = qg_rows.size(1);
  if (!cos.defined() || !sin.defined()) {
    const at::Tensor positions = at::arange(s, at::TensorOptions().dtype(at::kLong).device(qg_rows.device())).unsqueeze(0);
    std::tie(cos, sin) = models::rotary_tables(positions, config.rotary_dim(), config.rope_theta, qg_rows.scalar_type());
  }
  const auto qg = qg_rows.view({b, s, -1, 2 * d}).chunk(2, -1);
  const int64_t heads = qg[0].size(2);
  const at::Tensor gate = qg[1].reshape({b, s, heads * d});
  at::Tensor q = q_norm(qg[0]).transpose(1, 2);
  at::Tensor k = k_norm(models::kv_projection(k_proj, hidden).view({b, s, -1, d})).transpose(1, 2);
  at::Tensor v = models::kv_projection(v_proj, hidden).view({b, s, -1, d}).transpose(1, 2);
  q = models::apply_rotary(q, cos, sin);
  k = models::apply_rotary(k, cos, sin);
  if (in.cache) {
    const int64_t past = in.past;
    at::Tensor& keys = in.cache->keys.at(static_cast<size_t>(layer_idx));
    at::Tensor& values = in.cache->values.at(static_cast<size_t>(layer_idx));
    HP_CHECK_T(c10::ValueError, past + s <= keys.size(2), "hyper_parallel::qwen3_5::GatedAttentionImpl::forward: the cache holds ", keys.size(2),
               " positions; ", past, " are filled and ", s, " more were given");
    keys.narrow(2, past, s).copy_(k);
    values.narrow(2, past, s).copy_(v);
    k = keys.narrow(2, 0, past + s);
    v = values.narrow(2, 0, past + s);
  }
  // Training on whole sequences is plain causal attention; generation and padded batches mask the
  // cache and the padding.
  const at::Tensor out = (in.blocked.defined() ? sdpa(q, k, v, in.blocked) : sdpa(q, k, v)).transpose(1, 2).reshape({b, s, heads * d});
  return o_proj(out * at::sigmoid(gate));
}

LinearAttentionImpl::LinearAttentionImpl(const Config& c, int64_t layer) : config(c), layer_idx(layer) {
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

at::Tensor LinearAttentionImpl::forward(const at::Tensor& hidden) { return forward(hidden, hnn::Kwargs{}); }

at::Tensor LinearAttentionImpl::forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs) {
  const Kw in = Kw::parse(kwargs, {"keep", "cache"}, "qwen3_5::LinearAttentionImpl::forward");
  const int64_t b = hidden.size(0), s = hidden.size(1), dv = config.linear_value_head_dim;
  // Padding enters as zeros, which leave the conv and recurrent states as they were.
  const at::Tensor x = in.keep.defined() ? zero_padding(hidden, in.keep) : hidden;
  hnn::GatedDeltaNetState* state = in.cache ? &in.cache->linear.at(static_cast<size_t>(layer_idx)) : nullptr;
  // Training and whole-sequence forwards go through the module's hooks, where a context-parallel
  // style takes the sequence mixing over; generation carries its state and runs it here.
  HP_CHECK_T(c10::ValueError, state == nullptr || gdn->forward_wrapper() == nullptr, "hyper_parallel::qwen3_5::LinearAttentionImpl::forward: ",
             "layer ", layer_idx, "'s linear attention runs under a context-parallel style or activation checkpointing, which does not ",
             "carry a generation cache; generate with a model without them");
  const at::Tensor o = state ? gdn->forward(in_proj_q(x), in_proj_k(x), in_proj_v(x), in_proj_a(x), in_proj_b(x), state)
                             : gdn(in_proj_q(x), in_proj_k(x), in_proj_v(x), in_proj_a(x), in_proj_b(x));
  at::Tensor z = in_proj_z(x).view({b, s, -1, dv});
  // Under tensor parallelism the norm's weight is a Replicate DTensor over this rank's value heads
  // (its style lays out `o`, the first input); the gate joins it alike.
  const at::Tensor& w = norm->parameter("weight");
  if (hp::is_dtensor(w) && !hp::is_dtensor(z)) z = hp::DTensor::from_local(z, hp::DTensor(w).device_mesh(), {hp::Shard(2)});
  return out_proj(norm(o, z).reshape({b, s, -1}));
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c, int64_t layer_idx) {
  input_layernorm = register_module("input_layernorm", zero_centered_norm(c.hidden_size, c.rms_norm_eps));
  if (c.full_attention.at(static_cast<size_t>(layer_idx))) self_attn = register_module("self_attn", GatedAttention(c, layer_idx));
  else linear_attn = register_module("linear_attn", LinearAttention(c, layer_idx));
  post_attention_layernorm = register_module("post_attention_layernorm", zero_centered_norm(c.hidden_size, c.rms_norm_eps));
  if (c.is_moe())
    moe = register_module("mlp", hnn::SparseMoeBlock(hnn::MoEOptions(c.hidden_size, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok)
                                                         .norm_topk_prob(true)
                                                         .shared_expert_intermediate_size(c.shared_expert_intermediate_size)));
  else
    mlp = register_module("mlp", Mlp(c.hidden_size, c.intermediate_size));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs) {
  const Kw in = Kw::parse(kwargs, {"cos", "sin", "blocked", "keep", "cache"}, "qwen3_5::DecoderLayerImpl::forward");
  const at::Tensor x = input_layernorm(hidden);
  const at::Tensor h = hidden + (self_attn ? self_attn(x, in.select({"cos", "sin", "blocked", "cache"})) : linear_attn(x, in.select({"keep", "cache"})));
  const at::Tensor y = post_attention_layernorm(h);
  // The sparse block leaves padded tokens out of its router statistics.
  return h + (moe ? moe(y, in.select({"keep"})) : mlp(y));
}

StageSpan pipeline_stage_span(const Config& c, int64_t stage, int64_t num_stages) {
  return models::pipeline_stage_span(c.num_layers, c.tie_word_embeddings, stage, num_stages, "qwen3_5::pipeline_stage_span");
}

CausalLMImpl::CausalLMImpl(const Config& c, const StageSpan& stage) : config(c), span(stage) {
  HP_CHECK_T(c10::ValueError, static_cast<int64_t>(c.full_attention.size()) == c.num_layers, "hyper_parallel::qwen3_5::CausalLM: the layer ",
             "schedule names ", c.full_attention.size(), " layers, the model has ", c.num_layers);
  if (span.end_layer < 0) span.end_layer = c.num_layers;
  HP_CHECK_T(c10::ValueError, span.first_layer >= 0 && span.first_layer <= span.end_layer && span.end_layer <= c.num_layers,
             "hyper_parallel::qwen3_5::CausalLM: layers [", span.first_layer, ", ", span.end_layer, ") are not within the model's ", c.num_layers);
  HP_CHECK_T(c10::ValueError, !c.tie_word_embeddings || span.embedding == span.head, "hyper_parallel::qwen3_5::CausalLM: a stage with ",
             span.embedding ? "the embedding but not lm_head" : "lm_head but not the embedding", " cannot tie them (tie_word_embeddings)");
  if (span.embedding) embed_tokens = register_module("embed_tokens", hnn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", hnn::ModuleList(span.first_layer));
  for (int64_t i = span.first_layer; i < span.end_layer; ++i) layers->push_back(DecoderLayer(c, i).ptr());
  if (!span.head) return;
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
  if (config.tie_word_embeddings && embed_tokens && lm_head) lm_head->replace_parameter("weight", embed_tokens->weight());
}

std::vector<at::Tensor> CausalLMImpl::router_logits() const {
  std::vector<at::Tensor> out;
  for (const auto& layer : *layers)
    if (const auto& moe = layer->as<DecoderLayerImpl>()->moe) out.push_back(moe->router_logits);
  return out;
}

hnn::RouterStatistics CausalLMImpl::take_router_statistics() {
  return models::take_router_statistics<DecoderLayerImpl>(layers);
}

at::Tensor CausalLMImpl::load_balancing_loss(const hp::Group& data_group) {
  HP_CHECK_T(c10::ValueError, config.is_moe(), "hyper_parallel::qwen3_5::CausalLMImpl::load_balancing_loss: the model has no MoE layer ",
             "(num_experts is 0)");
  models::check_load_balancing_layout(*this, span, config.num_layers, data_group, "qwen3_5::CausalLMImpl::load_balancing_loss");
  return hnn::load_balancing_loss(take_router_statistics(), config.num_experts, data_group);
}

Cache CausalLMImpl::make_cache(int64_t batch, int64_t capacity) const {
  // Indexed by the layers' indices in the whole model.
  Cache cache;
  cache.linear.resize(static_cast<size_t>(config.num_layers));
  cache.keys.resize(static_cast<size_t>(span.first_layer));
  cache.values.resize(static_cast<size_t>(span.first_layer));
  for (const auto& layer : *layers) {
    const auto& attn = layer->as<DecoderLayerImpl>()->self_attn;
    at::Tensor keys, values;
    if (attn) {
      const at::Tensor w = hp::local_tensor(attn->k_proj->weight());
      keys = at::zeros({batch, w.size(0) / config.head_dim, capacity, config.head_dim}, w.options().requires_grad(false));
      values = at::zeros_like(keys);
    }
    cache.keys.push_back(keys);
    cache.values.push_back(values);
  }
  return cache;
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids) { return forward(input_ids, ForwardContext{}); }

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids, const hnn::Kwargs& kwargs) {
  ForwardContext context;
  context.position_ids = models::position_ids_keyword(kwargs, "qwen3_5::CausalLM::forward");
  return forward(input_ids, context);
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids, const ForwardContext& context) {
  // A stage without the embedding takes hidden states.
  at::Tensor h = embed_tokens ? embed_tokens(input_ids) : input_ids;
  const int64_t s = input_ids.size(1);
  const at::Device device = input_ids.device();
  // What every layer of this call shares, computed once and handed to each as its arguments: a
  // checkpointed layer's recompute replays them.
  Kw in;
  in.cache = context.cache;
  in.past = context.cache ? context.cache->length : 0;
  const at::Tensor positions = context.position_ids.defined()
                                   ? context.position_ids.to(device)
                                   : at::arange(in.past, in.past + s, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  std::tie(in.cos, in.sin) = models::rotary_tables(positions, config.rotary_dim(), config.rope_theta, h.scalar_type());
  // Whole sequences from position 0 (training) need nothing more: plain causal attention.
  if (context.cache || context.key_mask.defined()) {
    in.blocked = models::blocked_keys(in.past, s, context.key_mask, device);
    if (context.key_mask.defined()) {
      const at::Tensor new_keys = context.key_mask.narrow(1, in.past, s);
      if (!new_keys.all().item<bool>()) in.keep = new_keys.to(device, h.scalar_type()).unsqueeze(-1);
    }
  }
  const hnn::Kwargs kwargs = in.select({"cos", "sin", "blocked", "keep", "cache"});
  for (const auto& layer : *layers) h = hnn::call_with_hooks(*layer->as<DecoderLayerImpl>(), h, kwargs);
  if (context.cache) context.cache->length += s;
  if (!lm_head) return h;
  if (context.last_position_only) h = h.narrow(1, h.size(1) - 1, 1);
  return lm_head(norm(h));
}

}  // namespace qwen3_5
}  // namespace hyper_parallel
