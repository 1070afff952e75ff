#pragma once
// What the training-at-scale tests share: a small Qwen3 model and the rows of a global batch a
// data-parallel rank trains on.
#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

#include "../../common/test_util.h"

namespace training_test {
namespace hp = hyper_parallel;
namespace qwen3 = hyper_parallel::qwen3;

/// 2 layers, hidden 32, 4 heads over 2 KV heads: every split the tests use divides it.
inline qwen3::Config small_config(double dropout = 0.0, bool tied = false) {
  qwen3::Config c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.attention_dropout = dropout;
  c.tie_word_embeddings = tied;
  return c;
}

/// small_config with a sparse second layer: 4 experts, top-2, normalised, the aux loss weighted
/// enough that its gradient shows.
inline qwen3::Config small_moe_config() {
  qwen3::Config c = small_config();
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {0};
  c.router_aux_loss_coef = 0.05;
  return c;
}

/// The rows of `global` (dim 0) that data-parallel rank `rank` of `size` trains on.
inline at::Tensor dp_rows(const at::Tensor& global, int64_t rank, int64_t size) {
  return global.chunk(size, 0)[rank].contiguous();
}

/// Token ids [batch, seq + 1] from a fixed seed (inputs: the first seq, targets: the last seq).
inline at::Tensor token_batch(int64_t vocab, int64_t batch, int64_t seq, uint64_t seed) {
  return at::randint(vocab, {batch, seq + 1}, at::detail::createCPUGenerator(seed), at::kLong);
}

/// A Qwen3 layer's shape for the activation formulas below: batch, sequence, hidden, query heads,
/// KV heads, head_dim, MLP width.
struct Shape {
  int64_t b = 2, s = 32, h = 64, a = 4, g = 2, d = 16, i = 128;
};

// Bytes one layer keeps (float32: 4 bytes an element), E = b·s tokens:
// - input RMSNorm: the layer input x (kept by x.pow(2) and x * rsqrt), the rsqrt [E, 1], x * rsqrt
//   (kept by the weight's product) and the normed output (kept by q/k/v_proj): E(3h + 1);
// - q: q_proj's output (kept by q_norm), its rsqrt [E·a] and x * rsqrt: E(2ad + a); k likewise:
//   E(2gd + g). The rotary products keep only cos and sin (the tables need no gradient), so
//   q_norm's output and rotate_half's concatenation are temporaries;
// - the rotated q made contiguous for the batched matmul, and k and v repeated to the a query
//   heads (repeat_kv's copies), each kept by a matmul: 3Ead;
// - the float32 softmax output [b, a, s, s] (kept by softmax's backward and by · V): E·a·s;
// - the attention output made contiguous for o_proj: Ead;
// - the residual sum h and the second RMSNorm like the first: E(3h + 1);
// - SwiGLU: gate_proj's output (kept by silu), silu's output and up_proj's output (kept by their
//   product), the product (kept by down_proj): 4EI.
// Scores before softmax, the masked scores and o_proj's and down_proj's outputs are temporaries.
inline int64_t layer_bytes_none(const Shape& m) {
  const int64_t e = m.b * m.s, ad = m.a * m.d, gd = m.g * m.d;
  return 4 * e * ((3 * m.h + 1) + (2 * ad + m.a) + (2 * gd + m.g) + 3 * ad + m.a * m.s + ad + (3 * m.h + 1) + 4 * m.i);
}
// A checkpointed layer also keeps a copy of torch's CPU generator state for its recompute
// (PyTorch's checkpoint keeps the same): 5 KB, nothing at real sizes, visible at these. A plan on
// meta does not count it (the state is a CPU tensor): pass cpu_rng_state = false there.
inline int64_t rng_state_bytes() { return at::detail::getDefaultCPUGenerator().get_state().nbytes(); }
// Full recompute keeps the layer's input only (its parameters are no copies): E·h.
inline int64_t layer_bytes_full(const Shape& m, bool cpu_rng_state = true) {
  return 4 * m.b * m.s * m.h + (cpu_rng_state ? rng_state_bytes() : 0);
}
// Selective (the projections' matmul outputs kept, the rest recomputed): the input, q, k, v,
// o_proj's, gate's, up's and down's outputs: E(h + ad + 2gd + h + 2I + h).
inline int64_t layer_bytes_selective(const Shape& m, bool cpu_rng_state = true) {
  return 4 * m.b * m.s * (3 * m.h + m.a * m.d + 2 * m.g * m.d + 2 * m.i) + (cpu_rng_state ? rng_state_bytes() : 0);
}

/// The config of `m` with `layers` layers and a 64-token vocabulary.
inline qwen3::Config layer_config(const Shape& m, int64_t layers) {
  qwen3::Config c;
  c.vocab_size = 64;
  c.hidden_size = m.h;
  c.intermediate_size = m.i;
  c.num_layers = layers;
  c.num_heads = m.a;
  c.num_kv_heads = m.g;
  c.head_dim = m.d;
  return c;
}

/// The ranks that hold different tokens at this rank's tp coordinate of a [dp, ep, tp] mesh (dp x ep).
inline hp::Group data_group(const hp::DeviceMesh& mesh) {
  std::vector<int64_t> ranks;
  const int64_t t = mesh.get_local_rank(2);
  for (int64_t d = 0; d < mesh.size(0); ++d)
    for (int64_t e = 0; e < mesh.size(1); ++e) ranks.push_back((d * mesh.size(1) + e) * mesh.size(2) + t);
  return hp::new_group(ranks);
}

/// A DTensor's whole value, or a plain tensor.
inline at::Tensor whole(const at::Tensor& t) { return hp::is_dtensor(t) ? hp::DTensor(t).full_tensor() : t; }

}  // namespace training_test
