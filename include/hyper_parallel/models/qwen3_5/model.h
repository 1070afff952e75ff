#pragma once
// Qwen3.5 (transformers' Qwen3_5ForCausalLM): a hybrid decoder whose layers mix the sequence either
// by Gated DeltaNet linear attention (nn::GatedDeltaNet between the q/k/v/z/a/b projections and a
// gated RMSNorm) or by gated full attention (q_proj emits each head's query and a sigmoid gate,
// zero-centred q/k norms, rotary embedding on part of each head), three of the first to one of the
// second in the published schedule; every layer a SwiGLU MLP; zero-centred (1 + w) RMSNorms.
#include <hyper_parallel/nn/attention.h>
#include <hyper_parallel/nn/gated_delta_net.h>
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/nn/moe.h>
#include <hyper_parallel/models/generate.h>
#include <hyper_parallel/models/stage_span.h>
#include <hyper_parallel/nn/swiglu_mlp.h>

#include <c10/util/Optional.h>

#include <vector>

namespace hyper_parallel {
namespace qwen3_5 {
namespace hnn = hyper_parallel::nn;

/// The text model's shape; config.h reads it from HF's config.json.
struct Config {
  int64_t vocab_size = 128;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 96;
  int64_t num_layers = 4;        // num_hidden_layers
  int64_t num_heads = 4;         // num_attention_heads (full attention)
  int64_t num_kv_heads = 2;      // num_key_value_heads
  int64_t head_dim = 32;
  int64_t linear_num_key_heads = 2;
  int64_t linear_num_value_heads = 4;
  int64_t linear_key_head_dim = 16;
  int64_t linear_value_head_dim = 16;
  int64_t linear_conv_kernel_dim = 4;
  /// Per layer: full attention (true) or linear attention (false).
  std::vector<bool> full_attention{false, false, false, true};
  /// Qwen3.5-MoE (model_type "qwen3_5_moe_text"): every layer's MLP is a sparse block of
  /// num_experts routed experts (top num_experts_per_tok, the top-k probabilities always
  /// renormalised) beside a shared expert behind a sigmoid gate. num_experts == 0: dense.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;  // transformers adds the aux loss to its loss when true
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.25;  // the share of each head's dims that rotate
  /// mRoPE's frequencies per position axis (rope_parameters.mrope_section), kept for the config
  /// written back; text positions are alike on every axis, so it does not change the rotation.
  std::vector<int64_t> mrope_section;
  int64_t max_position_embeddings = 32768;
  bool tie_word_embeddings = false;
  bool vision_language = false;  // read from a "qwen3_5" config: checkpoint keys under model.language_model.
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> eos_token_ids;
  c10::optional<int64_t> bos_token_id, pad_token_id;

  bool is_moe() const { return num_experts > 0; }
  /// The rotated dims of each full-attention head: head_dim · partial_rotary_factor.
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
};

/// Generation state of one model, per layer: a full-attention layer's cached keys and values
/// [B, kv_heads, capacity, head_dim] (this rank's KV heads), a linear-attention layer's conv and
/// recurrent state (nn::GatedDeltaNetState); `length` positions filled.
struct Cache {
  std::vector<at::Tensor> keys, values;  // undefined at linear-attention layers
  std::vector<hnn::GatedDeltaNetState> linear;
  int64_t length = 0;
};

/// A forward pass of generation over the hybrid cache (models/generate.h): padded positions' keys
/// are false in key_mask; linear attention zeroes their inputs, as transformers'
/// apply_mask_to_padding_states, and full attention masks them.
using ForwardContext = hyper_parallel::models::ForwardContext<Cache>;

/// Gated full attention (transformers' Qwen3_5Attention). q_proj [nh·2·hd, H] holds per head its
/// query rows then its gate rows; the output of the heads is scaled by sigmoid(gate) before o_proj.
/// forward(hidden [B, S, H], kwargs): the call's inputs as keywords, so that a checkpointed
/// layer's recompute replays them: "cos", "sin" (rotary tables [B or 1, 1, S, rotary_dim];
/// absent: positions 0..S-1), "blocked" ([B, 1, S, cached + S], true at keys full attention may
/// not see: a cache or padding) and "cache" (generation).
class GatedAttentionImpl : public hnn::ModuleBase<GatedAttentionImpl> {
 public:
  GatedAttentionImpl(const Config& c, int64_t layer_idx);
  at::Tensor forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs);
  Config config;
  int64_t layer_idx;
  hnn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  hnn::RMSNorm q_norm{nullptr}, k_norm{nullptr};
  hnn::ScaledDotProductAttention sdpa{nullptr};
};
HP_MODULE(GatedAttention);

/// Gated DeltaNet linear attention (transformers' Qwen3_5GatedDeltaNet): in_proj_q/k/v (HF's fused
/// in_proj_qkv in three sections), in_proj_z/b/a, the sequence mixing `gdn`, the gated norm over
/// each value head, out_proj. forward(hidden [B, S, H]) -> [B, S, H]; forward(hidden, kwargs)
/// with the call's "keep" ([B, S, 1], 0 at padding, whose inputs enter as zeros as transformers'
/// apply_mask_to_padding_states) and "cache" (generation) as keywords.
class LinearAttentionImpl : public hnn::ModuleBase<LinearAttentionImpl> {
 public:
  LinearAttentionImpl(const Config& c, int64_t layer_idx);
  at::Tensor forward(const at::Tensor& hidden);
  at::Tensor forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs);
  Config config;
  int64_t layer_idx;
  hnn::Linear in_proj_q{nullptr}, in_proj_k{nullptr}, in_proj_v{nullptr}, in_proj_z{nullptr}, in_proj_b{nullptr}, in_proj_a{nullptr},
      out_proj{nullptr};
  hnn::GatedDeltaNet gdn{nullptr};
  hnn::RMSNormGated norm{nullptr};
};
HP_MODULE(LinearAttention);

/// The SwiGLU MLP (gate_proj, up_proj, down_proj), as Qwen3's.
using MlpImpl = hyper_parallel::nn::SwiGLUMlpImpl;
using Mlp = hyper_parallel::nn::SwiGLUMlp;

/// Pre-norm residual layer: `self_attn` (full attention) or `linear_attn`, then the MLP (`mlp`, or
/// in a MoE model the sparse block `moe`, named `mlp` in the checkpoint as in transformers).
class DecoderLayerImpl : public hnn::ModuleBase<DecoderLayerImpl> {
 public:
  DecoderLayerImpl(const Config& c, int64_t layer_idx);
  /// `kwargs`: the call's inputs ("cos", "sin", "blocked", "keep", "cache"), each passed on to the
  /// mixer that takes it.
  at::Tensor forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs);
  hnn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  GatedAttention self_attn{nullptr};
  LinearAttention linear_attn{nullptr};
  Mlp mlp{nullptr};
  hnn::SparseMoeBlock moe{nullptr};
};
HP_MODULE(DecoderLayer);

using StageSpan = hyper_parallel::models::StageSpan;

/// Stage `stage` of `num_stages` (models::pipeline_stage_span over num_layers).
/// e.g. `qwen3_5::CausalLM stage(config, qwen3_5::pipeline_stage_span(config, pp_rank, pp));`
StageSpan pipeline_stage_span(const Config& c, int64_t stage, int64_t num_stages);

/// Token ids [B, S] -> logits [B, S, vocab], causal; with a context, the next tokens of a
/// generation (positions, padding, the cache). Built with a StageSpan it is one pipeline stage:
/// without the embedding it takes hidden states [B, S, hidden]; without the head it returns them;
/// its layers keep their indices in the whole model (`layers.<i>`).
class CausalLMImpl : public hnn::ModuleBase<CausalLMImpl> {
 public:
  explicit CausalLMImpl(const Config& c, const StageSpan& span = {});
  at::Tensor forward(const at::Tensor& input_ids);
  at::Tensor forward(const at::Tensor& input_ids, const ForwardContext& context);
  /// HF's keyword form, through the module's hooks: `model(ids, hnn::Kwargs{{"position_ids", p}})`
  /// with positions [B or 1, S] for the rotary angles of shards of sequences. Other names are refused.
  at::Tensor forward(const at::Tensor& input_ids, const hnn::Kwargs& kwargs);
  /// An empty cache for `batch` sequences of up to `capacity` positions, sized from this rank's
  /// k_proj (its local KV heads).
  Cache make_cache(int64_t batch, int64_t capacity) const;
  /// With tie_word_embeddings, makes lm_head's weight embed_tokens' weight (one tensor).
  void tie_weights();
  /// The router logits [T, E] of every MoE layer of the last forward, in layer order (empty for a
  /// dense model): what transformers returns with output_router_logits.
  std::vector<at::Tensor> router_logits() const;
  /// The router statistics every MoE layer gathered since they were last taken (the forwards that
  /// recorded gradients: one step's microbatches), summed over the layers, and a fresh start.
  hnn::RouterStatistics take_router_statistics();
  /// transformers' load_balancing_loss_func (with its attention_mask: padding left out) of this
  /// step, over the statistics take_router_statistics() takes, and over `data_group`'s whole batch
  /// when given (hyper_parallel::nn::load_balancing_loss); add config.router_aux_loss_coef times
  /// it to the loss. Under context parallelism `data_group` must hold this rank's cp ranks; a
  /// pipeline stage is refused (the loss pools every layer's statistics). c10::ValueError.
  at::Tensor load_balancing_loss(const hyper_parallel::Group& data_group = {});
  Config config;
  StageSpan span;  // end_layer resolved
  hnn::Embedding embed_tokens{nullptr};  // empty on a stage without the embedding
  hnn::ModuleList layers;
  hnn::RMSNorm norm{nullptr};    // empty on a stage without the head
  hnn::Linear lm_head{nullptr};  // empty on a stage without the head
};
HP_MODULE(CausalLM);

}  // namespace qwen3_5
}  // namespace hyper_parallel
