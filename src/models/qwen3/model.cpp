#include <hyper_parallel/models/qwen3/model.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/runtime/errors.h>

#include "../attention_mask.h"
#include "../keywords.h"
#include "../layer_kwargs.h"
#include "../load_balancing.h"
#include "../replicated_kv_heads.h"
#include "../rotary.h"

#include <algorithm>
#include <cmath>

namespace hyper_parallel {
namespace qwen3 {
namespace hp = hyper_parallel;

namespace {
// Whether attention needs an explicit mask: keys in a cache, or padding. Otherwise it is causal
// over the new positions, which the sdpa module does itself (and context parallelism takes over).
bool needs_mask(const ForwardContext* context) { return context && (context->cache || context->key_mask.defined()); }

using Kw = models::LayerKwargs<KVCache>;
}  // namespace

hnn::Kwargs LayerInputs::kwargs() const {
  Kw kw;
  kw.cos = cos;
  kw.sin = sin;
  kw.blocked = blocked;
  kw.keep = keep;
  kw.cache = cache;
  kw.past = past;
  return kw.select({"cos", "sin", "blocked", "keep", "cache"});
}

LayerInputs layer_inputs(const Config& c, const ForwardContext* context, int64_t batch, int64_t s, at::ScalarType dtype,
                         const at::Device& device) {
  LayerInputs in;
  in.cache = context ? context->cache : nullptr;
  in.past = context && context->cache ? context->cache->length : 0;
  const at::Tensor positions = context && context->position_ids.defined()
                                   ? context->position_ids.to(device)
                                   : at::arange(s, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  std::tie(in.cos, in.sin) = models::rotary_tables(positions, c.head_dim, c.rope_theta, dtype);
  if (!needs_mask(context)) return in;
  in.blocked = models::blocked_keys(in.past, s, context->key_mask, device);
  if (context->key_mask.defined()) {
    const at::Tensor new_keys = context->key_mask.narrow(1, in.past, s);
    if (!new_keys.all().item<bool>()) in.keep = new_keys.to(device, dtype).unsqueeze(-1);
  }
  return in;
}

AttentionImpl::AttentionImpl(const Config& c, int64_t layer) : config(c), layer_idx(layer) {
  const int64_t q_width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
  q_proj = register_module("q_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, q_width).bias(false)));
  k_proj = register_module("k_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, kv_width).bias(false)));
  v_proj = register_module("v_proj", hnn::Linear(hnn::LinearOptions(c.hidden_size, kv_width).bias(false)));
  o_proj = register_module("o_proj", hnn::Linear(hnn::LinearOptions(q_width, c.hidden_size).bias(false)));
  q_norm = register_module("q_norm", hnn::RMSNorm(hnn::RMSNormOptions(c.head_dim).eps(c.rms_norm_eps)));
  k_norm = register_module("k_norm", hnn::RMSNorm(hnn::RMSNormOptions(c.head_dim).eps(c.rms_norm_eps)));
  sdpa = register_module("sdpa", hnn::ScaledDotProductAttention(
                                     hnn::ScaledDotProductAttentionOptions().is_causal(true).dropout_p(c.attention_dropout)));
  // Owned by this module, so the raw pointer lives as long as the function.
  sdpa->dropout_fn = [this](const at::Tensor& probs) { return attention_dropout(probs); };
}

// The attention probabilities [B, heads, S, T] hold this rank's heads under tensor parallelism
// (q_proj is Colwise: its weight's rows, and so the heads, are split in order). Dropout draws for
// each element's *global* head, so the mask is the one process's at every TP degree.
at::Tensor AttentionImpl::attention_dropout(const at::Tensor& probs) {
  const double p = config.attention_dropout;
  if (p == 0.0 || !is_training()) return probs;
  const at::Tensor& w = q_proj->weight();
  if (!hp::is_dtensor(w)) return hp::dropout(probs, p, true);
  const hp::DTensor weight(w);
  HP_CHECK_T(c10::ValueError, weight.device_mesh().ndim() == 1 && weight.placements()[0].is_shard(0), "hyper_parallel::qwen3::AttentionImpl::attention_dropout: attention dropout ",
             "under tensor parallelism needs q_proj sharded by rows (Colwise), got ", hp::to_string(weight.placements()));
  return hp::DTensor(hp::dropout(hp::DTensor::from_local(probs, weight.device_mesh(), {hp::Shard(1)}), p, true)).to_local();
}

at::Tensor AttentionImpl::forward(const at::Tensor& hidden) { return forward(hidden, hnn::Kwargs{}); }

at::Tensor AttentionImpl::forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs) {
  const Kw in = Kw::parse(kwargs, {"cos", "sin", "blocked", "cache"}, "qwen3::AttentionImpl::forward");
  const int64_t d = config.head_dim;
  // Local tensors under tensor parallelism: this rank's heads.
  at::Tensor q = q_proj(hidden), k = models::kv_projection(k_proj, hidden), v = models::kv_projection(v_proj, hidden);
  const int64_t b = q.size(0), s = q.size(1);
  // (B, S, heads, D): the q/k norms act per head over D.
  q = q_norm(q.view({b, s, -1, d})).transpose(1, 2);
  k = k_norm(k.view({b, s, -1, d})).transpose(1, 2);
  v = v.view({b, s, -1, d}).transpose(1, 2);
  // The rotary tables of the call (CausalLM::forward's), else (a layer called on its own) those
  // of positions 0..s-1.
  at::Tensor cos = in.cos, sin = in.sin;
  if (!cos.defined() || !sin.defined()) std::tie(cos, sin) = models::rotary_tables(
      at::arange(s, at::TensorOptions().dtype(at::kLong).device(q.device())).unsqueeze(0), d, config.rope_theta, q.scalar_type());
  q = models::apply_rotary(q, cos, sin);
  k = models::apply_rotary(k, cos, sin);
  if (in.cache) {
    const int64_t past = in.past;
    at::Tensor& keys = in.cache->keys.at(static_cast<size_t>(layer_idx));
    at::Tensor& values = in.cache->values.at(static_cast<size_t>(layer_idx));
    HP_CHECK_T(c10::ValueError, past + s <= keys.size(2), "hyper_parallel::qwen3::AttentionImpl::forward: the KV cache holds ", keys.size(2), " positions; ", past,
               " are filled and ", s, " more were given");
    keys.narrow(2, past, s).copy_(k);
    values.narrow(2, past, s).copy_(v);
    k = keys.narrow(2, 0, past + s);
    v = values.narrow(2, 0, past + s);
  }
  const int64_t heads = q.size(1);
  // Training on whole sequences is plain causal attention, the part context parallelism takes
  // over; generation and padded batches mask from the cache and the padding.
  const at::Tensor out = in.blocked.defined() ? sdpa(q, k, v, in.blocked) : sdpa(q, k, v);
  return o_proj(out.transpose(1, 2).reshape({b, s, heads * d}));
}

bool Config::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  for (int64_t l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c, int64_t layer_idx) {
  input_layernorm = register_module("input_layernorm", hnn::RMSNorm(hnn::RMSNormOptions(c.hidden_size).eps(c.rms_norm_eps)));
  self_attn = register_module("self_attn", Attention(c, layer_idx));
  post_attention_layernorm =
      register_module("post_attention_layernorm", hnn::RMSNorm(hnn::RMSNormOptions(c.hidden_size).eps(c.rms_norm_eps)));
  if (c.is_moe_layer(layer_idx))
    moe = register_module("mlp", hnn::SparseMoeBlock(hnn::MoEOptions(c.hidden_size, c.moe_intermediate_size, c.num_experts,
                                                                     c.num_experts_per_tok).norm_topk_prob(c.norm_topk_prob)));
  else
    mlp = register_module("mlp", Mlp(c.hidden_size, c.intermediate_size));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& hidden) { return forward(hidden, hnn::Kwargs{}); }

at::Tensor DecoderLayerImpl::forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs) {
  const Kw in = Kw::parse(kwargs, {"cos", "sin", "blocked", "keep", "cache"}, "qwen3::DecoderLayerImpl::forward");
  at::Tensor h = hidden + self_attn(input_layernorm(hidden), in.select({"cos", "sin", "blocked", "cache"}));
  const at::Tensor x = post_attention_layernorm(h);
  // The sparse block leaves padded tokens out of its router statistics.
  return h + (moe ? moe(x, in.select({"keep"})) : mlp(x));
}

StageSpan pipeline_stage_span(const Config& c, int64_t stage, int64_t num_stages) {
  return models::pipeline_stage_span(c.num_layers, c.tie_word_embeddings, stage, num_stages, "qwen3::pipeline_stage_span");
}

CausalLMImpl::CausalLMImpl(const Config& c, const StageSpan& stage) : config(c), span(stage) {
  if (span.end_layer < 0) span.end_layer = c.num_layers;
  HP_CHECK_T(c10::ValueError, span.first_layer >= 0 && span.first_layer <= span.end_layer && span.end_layer <= c.num_layers,
             "hyper_parallel::qwen3::CausalLM: layers [", span.first_layer, ", ", span.end_layer, ") are not within the model's ",
             c.num_layers);
  HP_CHECK_T(c10::ValueError, !c.tie_word_embeddings || span.embedding == span.head, "hyper_parallel::qwen3::CausalLM: a stage with ",
             span.embedding ? "the embedding but not lm_head" : "lm_head but not the embedding", " cannot tie them (tie_word_embeddings)");
  if (span.embedding) embed_tokens = register_module("embed_tokens", hnn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", hnn::ModuleList(span.first_layer));
  for (int64_t i = span.first_layer; i < span.end_layer; ++i) layers->push_back(DecoderLayer(c, i).ptr());
  if (!span.head) return;
  norm = register_module("norm", hnn::RMSNorm(hnn::RMSNormOptions(c.hidden_size).eps(c.rms_norm_eps)));
  {
    // A tied lm_head is embed_tokens' weight: built on meta, it allocates and draws nothing (as
    // init_parameters, which does not draw into a weight another module owns).
    c10::optional<hnn::ParameterScope> tied;
    if (c.tie_word_embeddings) tied.emplace(hnn::ParameterScope::current().device(at::kMeta));
    lm_head = register_module("lm_head", hnn::Linear(hnn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
  }
  tie_weights();
}

void CausalLMImpl::tie_weights() {
  if (config.tie_word_embeddings && embed_tokens && lm_head) lm_head->replace_parameter("weight", embed_tokens->weight());
}

KVCache CausalLMImpl::make_cache(int64_t batch, int64_t capacity) const {
  KVCache cache;
  for (const auto& layer : *layers) {
    const auto& attn = layer->as<DecoderLayerImpl>()->self_attn;
    const at::Tensor w = hp::local_tensor(attn->k_proj->weight());
    const int64_t kv_heads = w.size(0) / config.head_dim;
    for (auto* list : {&cache.keys, &cache.values})
      list->push_back(at::zeros({batch, kv_heads, capacity, config.head_dim}, w.options().requires_grad(false)));
  }
  return cache;
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

at::Tensor CausalLMImpl::aux_loss(const hyper_parallel::Group& data_group) {
  HP_CHECK_T(c10::ValueError, config.is_moe(), "hyper_parallel::qwen3::CausalLMImpl::aux_loss: the model has no MoE layer (num_experts is 0)");
  models::check_load_balancing_layout(*this, span, config.num_layers, data_group, "qwen3::CausalLMImpl::aux_loss");
  return hnn::load_balancing_loss(take_router_statistics(), config.num_experts, data_group);
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids) { return forward(input_ids, ForwardContext{}); }

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids, const hnn::Kwargs& kwargs) {
  ForwardContext context;
  context.position_ids = models::position_ids_keyword(kwargs, "qwen3::CausalLM::forward");
  return forward(input_ids, context);
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids, const ForwardContext& context) {
  // Computed once for every layer, and handed to each as its arguments: a checkpointed layer's
  // recompute replays them. A stage without the embedding takes hidden states, in the dtype the
  // previous stage computed.
  const LayerInputs in = layer_inputs(config, &context, input_ids.size(0), input_ids.size(1),
                                      embed_tokens ? embed_tokens->weight().scalar_type() : input_ids.scalar_type(), input_ids.device());
  at::Tensor h = embed_tokens ? embed_tokens(input_ids) : input_ids;
  const hnn::Kwargs kwargs = in.kwargs();
  for (const auto& layer : *layers) h = hnn::call_with_hooks(*layer->as<DecoderLayerImpl>(), h, kwargs);
  if (context.cache) context.cache->length += input_ids.size(1);
  if (!lm_head) return h;
  if (context.last_position_only) h = h.narrow(1, h.size(1) - 1, 1);
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
}  // namespace hyper_parallel
