#pragma once
// The sequence mixing of a Gated DeltaNet layer (Qwen3.5's linear attention), as plain-tensor
// functions: the causal depthwise convolution with its state, and the gated delta rule in its two
// exact forms, the chunked one for training and prefill and the per-token recurrence for decode.
// Every value head h carries a state S_h [dk, dv]; per token t (g_t <= 0 the log decay, beta_t the
// write strength):
//   S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t   (read after the write)
// with q and k L2-normalised (rsqrt(sum x^2 + 1e-6)) and q scaled by dk^-1/2, all in float32,
// as transformers' torch implementation and the FLA kernels compute it.
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace hyper_parallel {
namespace nn {
namespace functional {

/// The output [B, S, nv, dv] (in the query's dtype) and the state after the last token
/// [B, nv, dk, dv] (float32).
struct GatedDeltaRuleOutput {
  at::Tensor output, final_state;
};

/// The gated delta rule over query, key [B, S, nk, dk], value [B, S, nv, dv], g and beta
/// [B, S, nv], from `initial_state` [B, nv, dk, dv] (undefined: zeros). nv a multiple of nk: value
/// head j reads key head j / (nv / nk). Chunked (the WY/UT form): within each chunk of
/// `chunk_size` tokens the cumulative decay is taken in float32 and masked before exp, the
/// unit-lower-triangular system solved, then one state update per chunk; the sequence is padded to a
/// chunk multiple with g = beta = 0 (no decay, no write), so padding changes nothing. Differentiable
/// in every input. e.g. `auto [o, s] = hnn::functional::chunk_gated_delta_rule(q, k, v, g, beta);`
GatedDeltaRuleOutput chunk_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                            const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state = {},
                                            bool use_qk_l2norm = true, int64_t chunk_size = 64);

/// What a run of tokens does to any incoming state, per batch row and value head: the rule's
/// state update is affine in the state, so after the tokens S_out = transition · S_in + state
/// (transition [B, nv, dk, dk], state [B, nv, dk, dv], float32). Context parallelism passes these
/// instead of the tokens: folding rank 0..r-1's summaries gives rank r its incoming state.
struct GatedDeltaStateSummary {
  at::Tensor state, transition;
};

/// transition · state + summary.state (`state` undefined: zeros, giving summary.state).
/// e.g. `S = apply_state_summary(summaries[1], apply_state_summary(summaries[0], {}));`
at::Tensor apply_state_summary(const GatedDeltaStateSummary& summary, const at::Tensor& state);

/// The chunked rule in its two halves: the constructor does the work that depends on these tokens
/// only (normalisation, the per-chunk UT solves, decays); run(initial_state) then scans the chunks
/// from a state, and summary() gives the tokens' affine action on any state. Context parallelism
/// builds one, summarises, learns its incoming state from the ranks before, and runs. Arguments
/// as chunk_gated_delta_rule's; differentiable; copies share the prepared chunks.
class ChunkedGatedDelta {
 public:
  ChunkedGatedDelta(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g, const at::Tensor& beta,
                    bool use_qk_l2norm = true, int64_t chunk_size = 64);
  /// The output [B, S, nv, dv] (query's dtype) and the final state, from `initial_state`
  /// [B, nv, dk, dv] (undefined: zeros): chunk_gated_delta_rule's result.
  GatedDeltaRuleOutput run(const at::Tensor& initial_state = {}) const;
  /// The tokens' (transition, state): one scan of [state | transition] from [0 | I].
  GatedDeltaStateSummary summary() const;

 private:
  struct Chunks;
  at::Tensor scan(at::Tensor state, bool outputs, std::vector<at::Tensor>* out) const;
  std::shared_ptr<const Chunks> chunks_;
};

/// The same rule token by token (decode: one token on a cached state). Equal to the chunked form
/// to float32 rounding.
GatedDeltaRuleOutput recurrent_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                                const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state = {},
                                                bool use_qk_l2norm = true);

/// The rule's gates from in_proj_a/b's outputs a, b [B, S, nv] and the layer's A_log, dt_bias
/// [nv]: beta = sigmoid(b) in b's dtype, g = -exp(A_log) · softplus(a + dt_bias) in float32
/// whatever the compute dtype (exp(A_log) overflows half precision).
struct GatedDeltaGates {
  at::Tensor g, beta;
};
GatedDeltaGates gated_delta_gates(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias);

/// The convolved channels [B, S, C] and the state for the next call [B, C, K] (the last K
/// pre-convolution inputs, zeros where there were fewer: transformers' conv_states).
struct CausalConv1dOutput {
  at::Tensor output, final_state;
};

/// silu of the causal depthwise convolution of x [B, S, C] by weight [C, K] (per channel c and
/// token t: sum_j w[c, j] x[t - (K-1) + j]), continuing from `state` [B, C, K] (undefined: zeros
/// before the first token). Computed in the weight's dtype, returned in x's. Differentiable.
CausalConv1dOutput causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& state = {});

}  // namespace functional
}  // namespace nn
}  // namespace hyper_parallel
