#pragma once
// A Qwen3-style dense decoder in hyper_parallel::nn: token embedding; decoder layers of RMSNorm,
// grouped-query attention with q/k RMSNorm over head_dim, rotary embeddings and a causal mask,
// and a SwiGLU MLP; a final norm; lm_head. The same code runs on one process and, after
// parallelize_qwen3_tp, with heads and MLP columns split over a tensor-parallel mesh (the head
// counts are read off the projections' local widths).
#include <hyper_parallel/nn/layers.h>

namespace qwen3 {
namespace hnn = hyper_parallel::nn;

struct Config {
  int64_t vocab_size = 256;  // byte-level tokens
  int64_t hidden_size = 64;
  int64_t intermediate_size = 128;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 16;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
};

class AttentionImpl : public hnn::ModuleBase<AttentionImpl> {
 public:
  explicit AttentionImpl(const Config& c);
  at::Tensor forward(const at::Tensor& hidden);
  Config config;
  hnn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  hnn::RMSNorm q_norm{nullptr}, k_norm{nullptr};
};
HP_MODULE(Attention);

class MlpImpl : public hnn::ModuleBase<MlpImpl> {
 public:
  explicit MlpImpl(const Config& c);
  at::Tensor forward(const at::Tensor& x);
  hnn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
HP_MODULE(Mlp);

class DecoderLayerImpl : public hnn::ModuleBase<DecoderLayerImpl> {
 public:
  explicit DecoderLayerImpl(const Config& c);
  at::Tensor forward(const at::Tensor& hidden);
  hnn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
};
HP_MODULE(DecoderLayer);

/// Token ids [B, S] -> logits [B, S, vocab].
class CausalLMImpl : public hnn::ModuleBase<CausalLMImpl> {
 public:
  explicit CausalLMImpl(const Config& c);
  at::Tensor forward(const at::Tensor& input_ids);
  Config config;
  hnn::Embedding embed_tokens{nullptr};
  hnn::ModuleList layers;
  hnn::RMSNorm norm{nullptr};
  hnn::Linear lm_head{nullptr};
};
HP_MODULE(CausalLM);

/// Mean next-token cross-entropy of logits [B, S, V] against targets [B, S] (plain or DTensor).
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace qwen3
