#pragma once
// The Gated DeltaNet's sequence mixing as a module (Qwen3.5's linear attention), beside
// ScaledDotProductAttention: the causal depthwise convolution of the q/k/v projections with its
// state, the gates, and the gated delta rule (chunked for training and prefill, per token for
// decode) with its recurrent state. The projections around it (in_proj_*, out_proj) and the gated
// output norm stay ordinary layers, so the tensor-parallel styles split them and a
// context-parallel style can take this module over as ContextParallel takes over attention.
#include <hyper_parallel/nn/gated_delta_rule.h>
#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {
namespace nn {

/// Head counts and sizes (transformers' linear_num_key_heads, linear_num_value_heads,
/// linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim).
struct GatedDeltaNetOptions {
  GatedDeltaNetOptions(int64_t num_key_heads, int64_t num_value_heads, int64_t key_head_dim, int64_t value_head_dim)
      : num_key_heads_(num_key_heads), num_value_heads_(num_value_heads), key_head_dim_(key_head_dim), value_head_dim_(value_head_dim) {}
  TORCH_ARG(int64_t, num_key_heads);
  TORCH_ARG(int64_t, num_value_heads);
  TORCH_ARG(int64_t, key_head_dim);
  TORCH_ARG(int64_t, value_head_dim);
  TORCH_ARG(int64_t, conv_kernel_size) = 4;
  TORCH_ARG(int64_t, chunk_size) = 64;
};

/// What generation keeps per layer: the last conv_kernel_size pre-convolution inputs of the q, k
/// and v channels [B, C, K] (in the activations' dtype) and the recurrent state [B, nv, dk, dv]
/// (float32), as transformers' cache does. Undefined before the first call.
struct GatedDeltaNetState {
  at::Tensor conv, recurrent;
};

/// Which heads a call computes: key heads [key_begin, key_begin + key_count) and value heads
/// [value_begin, value_begin + value_count) of those this rank holds (count -1: all of them).
/// Ulysses context parallelism gives each rank some heads of the whole sequence.
struct GatedDeltaNetHeads {
  int64_t key_begin = 0, key_count = -1, value_begin = 0, value_count = -1;
};

/// The rule's inputs, as GatedDeltaNetImpl::prepare makes them: the convolved query and key
/// [B, S, hk, dk] and value [B, S, hv, dv], the gates g (float32) and beta [B, S, hv], and the
/// convolution's state for the next call [B, C, K].
struct GatedDeltaNetPrepared {
  at::Tensor query, key, value, g, beta, conv_state;
};

/// Parameters, named and shaped as transformers' Qwen3_5GatedDeltaNet holds them for this rank's
/// heads: the depthwise conv weights of the q, k and v channels (`conv_q` [nk·dk, 1, K], `conv_k`,
/// `conv_v` [nv·dv, 1, K]: HF's `conv1d.weight` rows in three sections), `A_log` and `dt_bias` [nv].
/// The head counts are read off the local sizes, so the same code runs on head shards.
/// forward(q, k, v, a, b): the q/k/v projections before the convolution [B, S, nk·dk] /
/// [B, S, nv·dv] and in_proj_a/b's outputs [B, S, nv] -> the rule's output [B, S, nv, dv] in q's
/// dtype. beta = sigmoid(b); g = -exp(A_log) · softplus(a + dt_bias) in float32. With `state`, the
/// call continues from it and leaves the new one there: one token on a state takes the per-token
/// recurrence, anything else the chunked rule.
/// e.g. `auto o = gdn->forward(q, k, v, a, b, &cache[layer]);`
class GatedDeltaNetImpl : public ModuleBase<GatedDeltaNetImpl> {
 public:
  explicit GatedDeltaNetImpl(const GatedDeltaNetOptions& options);
  void reset_parameters() override;
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,
                     GatedDeltaNetState* state = nullptr);

  // forward's two halves, for a context-parallel style that adds only the communication.

  /// The key and value heads this rank holds (read off its parameters: tensor parallelism shards them).
  int64_t local_key_heads() const;
  int64_t local_value_heads() const;
  /// Raises c10::ValueError (as forward's) unless q, k [B, S, hk·dk], v [B, S, hv·dv] and a, b
  /// [B, S, hv] fit `heads`.
  void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,
                    const GatedDeltaNetHeads& heads = {}) const;
  /// The first half: silu of the causal convolution of [q ‖ k ‖ v] continuing from `conv_state`
  /// [B, C, K] (a cached state, or the halo of the rank before; undefined: zeros), split into
  /// heads, and the gates. q, k, v, a, b hold the channels of `heads` only.
  GatedDeltaNetPrepared prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                const at::Tensor& b, const at::Tensor& conv_state = {}, const GatedDeltaNetHeads& heads = {}) const;
  /// The second half, chunked and not run yet: summary() gives the tokens' action on any state.
  functional::ChunkedGatedDelta chunked(const GatedDeltaNetPrepared& p) const;
  /// The second half: the gated delta rule from `initial_state` [B, hv, dk, dv] (undefined:
  /// zeros); one token on a state takes the per-token recurrence, anything else the chunked rule.
  functional::GatedDeltaRuleOutput mix(const GatedDeltaNetPrepared& p, const at::Tensor& initial_state = {}) const;

  GatedDeltaNetOptions options;
};
HP_MODULE(GatedDeltaNet);

/// transformers' Qwen3_5RMSNormGated: per vector of the last dim (a value head's dv), the RMS norm
/// of x in float32, times `weight` in x's dtype, times silu(gate) in float32, in x's dtype. The
/// weight starts at ones (not zero-centred). forward(x, gate) with x and gate of the same shape.
class RMSNormGatedImpl : public ModuleBase<RMSNormGatedImpl> {
 public:
  explicit RMSNormGatedImpl(int64_t dim, double eps = 1e-6);
  void reset_parameters() override;
  at::Tensor forward(const at::Tensor& x, const at::Tensor& gate);
  int64_t dim;
  double eps;
};
HP_MODULE(RMSNormGated);

}  // namespace nn
}  // namespace hyper_parallel
