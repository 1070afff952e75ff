#pragma once
// A Qwen3-style dense decoder in hyper_parallel::nn: token embedding; decoder layers of RMSNorm,
// grouped-query attention with q/k RMSNorm over head_dim, rotary embeddings and a causal mask,
// and a SwiGLU MLP; a final norm; lm_head. The same code runs on one process and, after
// parallelize_qwen3_tp, with heads and MLP columns split over a tensor-parallel mesh (the head
// counts are read off the projections' local widths).
#include <hyper_parallel/nn/attention.h>
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/nn/moe.h>
#include <hyper_parallel/models/generate.h>
#include <hyper_parallel/models/stage_span.h>
#include <hyper_parallel/nn/swiglu_mlp.h>

#include <c10/util/Optional.h>

#include <vector>

namespace hyper_parallel {
namespace qwen3 {
namespace hnn = hyper_parallel::nn;

/// The model's shape; config.h reads and writes it as HF's Qwen3 config.json.
struct Config {
  int64_t vocab_size = 256;  // byte-level tokens
  int64_t hidden_size = 64;
  int64_t intermediate_size = 128;
  int64_t num_layers = 2;      // num_hidden_layers
  int64_t num_heads = 4;       // num_attention_heads
  int64_t num_kv_heads = 2;    // num_key_value_heads
  int64_t head_dim = 16;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 32768;
  // Dropout on the attention probabilities while training (transformers' eager attention). Drawn
  // with hyper_parallel's layout-independent generator: the same mask at every TP degree.
  double attention_dropout = 0.0;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight
  at::ScalarType dtype = at::kFloat;  // torch_dtype: what the checkpoint holds
  std::vector<int64_t> eos_token_ids;
  c10::optional<int64_t> bos_token_id, pad_token_id;

  // Qwen3-MoE (model_type "qwen3_moe"; transformers' Qwen3MoeConfig). num_experts == 0: dense.
  int64_t num_experts = 0;             // num_experts (transformers 5 writes num_local_experts)
  int64_t num_experts_per_tok = 0;     // top-k
  int64_t moe_intermediate_size = 0;   // each expert's intermediate size
  bool norm_topk_prob = false;         // renormalise the top-k router probabilities
  int64_t decoder_sparse_step = 1;     // every decoder_sparse_step-th layer is sparse ...
  std::vector<int64_t> mlp_only_layers;  // ... except these, which keep a dense MLP
  double router_aux_loss_coef = 0.001;   // weight of the load-balancing loss in training
  bool output_router_logits = false;     // transformers adds the aux loss to its loss when true
  /// Whether layer `layer` has a sparse MoE block (transformers' rule).
  bool is_moe_layer(int64_t layer) const;
  bool is_moe() const { return num_experts > 0; }
};

/// Generation state of one model: each layer's cached keys and values (this rank's KV heads under
/// tensor parallelism), [batch, kv_heads, capacity, head_dim], filled up to `length` positions.
struct KVCache {
  std::vector<at::Tensor> keys, values;
  int64_t length = 0;
};

/// A forward pass of generation over the KV cache (models/generate.h).
using ForwardContext = hyper_parallel::models::ForwardContext<KVCache>;

/// What every layer of one forward pass shares, computed once per call and handed to each layer
/// as its keyword arguments (so that a checkpointed layer's recompute replays them): the rotary
/// tables [B or 1, 1, S, D], the keys the queries may not see with a cache or padding ([S, T], or
/// [B, 1, S, T]; undefined otherwise: plain causal attention, which the attention's sdpa module
/// masks itself) and the generation cache.
struct LayerInputs {
  at::Tensor cos, sin, blocked;
  at::Tensor keep;  // [B, S, 1]: 0 at padding (left out of the router statistics); undefined without padding
  KVCache* cache = nullptr;
  int64_t past = 0;  // positions already in the cache
  /// The layers' keyword arguments: "cos", "sin", and "blocked", "keep" and "cache" when set.
  hnn::Kwargs kwargs() const;
};

/// The LayerInputs of `s` new tokens (context may be null: positions 0..s-1, no explicit mask).
LayerInputs layer_inputs(const Config& c, const ForwardContext* context, int64_t batch, int64_t s, at::ScalarType dtype,
                         const at::Device& device);

class AttentionImpl : public hnn::ModuleBase<AttentionImpl> {
 public:
  AttentionImpl(const Config& c, int64_t layer_idx = 0);
  at::Tensor forward(const at::Tensor& hidden);
  /// With this call's inputs as keywords (LayerInputs::kwargs: "cos", "sin" [B or 1, 1, S, D],
  /// "blocked", "cache"), so that activation checkpointing's recompute, which replays a module's
  /// arguments, sees the forward's positions and mask. Without "cos"/"sin": positions 0..S-1.
  at::Tensor forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs);
  /// Dropout on the attention probabilities while training (config.attention_dropout).
  at::Tensor attention_dropout(const at::Tensor& probs);
  Config config;
  int64_t layer_idx;
  hnn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  hnn::RMSNorm q_norm{nullptr}, k_norm{nullptr};
  // Causal attention over the heads (no parameters): what ContextParallel takes over.
  hnn::ScaledDotProductAttention sdpa{nullptr};
};
HP_MODULE(Attention);

/// The SwiGLU MLP (gate_proj, up_proj, down_proj).
using MlpImpl = hyper_parallel::nn::SwiGLUMlpImpl;
using Mlp = hyper_parallel::nn::SwiGLUMlp;

class DecoderLayerImpl : public hnn::ModuleBase<DecoderLayerImpl> {
 public:
  DecoderLayerImpl(const Config& c, int64_t layer_idx = 0);
  at::Tensor forward(const at::Tensor& hidden);
  /// This call's inputs (LayerInputs::kwargs) passed on to the attention (AttentionImpl::forward).
  at::Tensor forward(const at::Tensor& hidden, const hnn::Kwargs& kwargs);
  hnn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  // One of the two, registered as "mlp" (HF's name for both): a dense MLP or a sparse MoE block.
  Mlp mlp{nullptr};
  hnn::SparseMoeBlock moe{nullptr};
};
HP_MODULE(DecoderLayer);

/// The part of the model one pipeline stage holds (models/stage_span.h).
using StageSpan = hyper_parallel::models::StageSpan;

/// Stage `stage` of `num_stages`: the layers split into contiguous runs as evenly as possible
/// (the earlier stages take one more), the embedding on stage 0, norm and lm_head on the last.
/// c10::ValueError when a stage would get no layer or the model ties lm_head to the embedding
/// (the two would live on different stages).
/// e.g. `qwen3::CausalLM stage(config, qwen3::pipeline_stage_span(config, pp_rank, pp));`
StageSpan pipeline_stage_span(const Config& c, int64_t stage, int64_t num_stages);

/// Token ids [B, S] -> logits [B, S, vocab] (a causal mask over the sequence), or with a context
/// the next tokens of a generation (positions, padding, the KV cache). Built with a StageSpan it
/// is one pipeline stage: without the embedding it takes hidden states [B, S, hidden]; without
/// the head it returns them; its layers keep their indices in the whole model (`layers.<i>`).
class CausalLMImpl : public hnn::ModuleBase<CausalLMImpl> {
 public:
  explicit CausalLMImpl(const Config& c, const StageSpan& span = {});
  at::Tensor forward(const at::Tensor& input_ids);
  at::Tensor forward(const at::Tensor& input_ids, const ForwardContext& context);
  /// HF's keyword form, through the module's hooks (fully_shard's among them), for training on
  /// shards of sequences: `model(ids, hnn::Kwargs{{"position_ids", positions}})` with positions
  /// [B or 1, S] (context_parallel_positions); causal attention by position. Other names are refused.
  at::Tensor forward(const at::Tensor& input_ids, const hnn::Kwargs& kwargs);
  /// With tie_word_embeddings, makes lm_head's weight embed_tokens' weight (one tensor). Done at
  /// construction; again after parallelize_qwen3_tp, which distributes the two separately.
  void tie_weights();
  /// An empty cache for `batch` sequences of up to `capacity` positions, sized from this rank's
  /// k_proj (its local KV heads).
  KVCache make_cache(int64_t batch, int64_t capacity) const;
  /// The router logits [T, E] of every MoE layer from the last forward, in layer order (empty
  /// for a dense model): what transformers returns with output_router_logits.
  std::vector<at::Tensor> router_logits() const;
  /// The router statistics every MoE layer gathered since they were last taken (the forwards that
  /// recorded gradients: one step's microbatches), summed over the layers, and a fresh start.
  hnn::RouterStatistics take_router_statistics();
  /// transformers' load-balancing loss (aux_loss, padding left out) of this step: over the
  /// statistics take_router_statistics() takes, and over `data_group`'s whole batch when given
  /// (see hyper_parallel::nn::load_balancing_loss). Under context parallelism `data_group` must
  /// hold this rank's cp ranks (their tokens are the same sequences' others); a pipeline stage is
  /// refused (transformers pools every layer's statistics, which no stage holds). c10::ValueError.
  at::Tensor aux_loss(const hyper_parallel::Group& data_group = hyper_parallel::Group());
  Config config;
  StageSpan span;  // end_layer resolved
  hnn::Embedding embed_tokens{nullptr};  // empty on a stage without the embedding
  hnn::ModuleList layers;
  hnn::RMSNorm norm{nullptr};      // empty on a stage without the head
  hnn::Linear lm_head{nullptr};    // empty on a stage without the head
};
HP_MODULE(CausalLM);

/// Mean next-token cross-entropy of logits [B, S, V] against targets [B, S] (plain or DTensor).
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace qwen3
}  // namespace hyper_parallel
