// The activation memory of one Qwen3 decoder layer, counted as Korthikanti et al. (2022) count it
// for GPT (the bytes of the tensors autograd keeps from a layer's forward for its backward), for
// our layer, against MemoryTracker's peak. The per-layer figure is the slope of the step's
// transient peak over the number of layers (measured at 2 and 6 layers), which removes what does
// not scale with depth: the logits, the loss, and backward's working set.
#include <gtest/gtest.h>

#include "training_util.h"

using namespace training_test;

namespace {

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
int64_t layer_bytes_none(const Shape& m) {
  const int64_t e = m.b * m.s, ad = m.a * m.d, gd = m.g * m.d;
  return 4 * e * ((3 * m.h + 1) + (2 * ad + m.a) + (2 * gd + m.g) + 3 * ad + m.a * m.s + ad + (3 * m.h + 1) + 4 * m.i);
}
// A checkpointed layer also keeps a copy of torch's CPU generator state for its recompute
// (PyTorch's checkpoint keeps the same): 5 KB, nothing at real sizes, visible at these.
int64_t rng_state_bytes() { return at::detail::getDefaultCPUGenerator().get_state().nbytes(); }
// Full recompute keeps the layer's input only (its parameters are no copies): E·h.
int64_t layer_bytes_full(const Shape& m) { return 4 * m.b * m.s * m.h + rng_state_bytes(); }
// Selective (the projections' matmul outputs kept, the rest recomputed): the input, q, k, v,
// o_proj's, gate's, up's and down's outputs: E(h + ad + 2gd + h + 2I + h).
int64_t layer_bytes_selective(const Shape& m) {
  return 4 * m.b * m.s * (3 * m.h + m.a * m.d + 2 * m.g * m.d + 2 * m.i) + rng_state_bytes();
}

int64_t step_peak(const Shape& m, int64_t layers, const hp::ActivationCheckpointPolicy& policy) {
  qwen3::Config c;
  c.vocab_size = 64;
  c.hidden_size = m.h;
  c.intermediate_size = m.i;
  c.num_layers = layers;
  c.num_heads = m.a;
  c.num_kv_heads = m.g;
  c.head_dim = m.d;
  hp_test::manual_seed(1);
  qwen3::CausalLM model(c);
  hp::apply_activation_checkpointing(*model, policy);
  const at::Tensor ids = token_batch(c.vocab_size, m.b, m.s, 3);
  const at::Tensor x = ids.narrow(1, 0, m.s), y = ids.narrow(1, 1, m.s);
  for (int warm = 0; warm < 2; ++warm) {  // the second step allocates what a steady step does
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    const auto mem = warm == 1 ? std::make_unique<hp::MemoryTracker>("cpu") : nullptr;
    qwen3::causal_lm_loss(model(x), y).backward();
    if (mem) return mem->transient_peak_bytes();
  }
  return 0;
}

void expect_per_layer(const hp::ActivationCheckpointPolicy& policy, int64_t formula) {
  const Shape m;
  const int64_t slope = (step_peak(m, 6, policy) - step_peak(m, 2, policy)) / 4;
  EXPECT_NEAR(static_cast<double>(slope), static_cast<double>(formula), 0.10 * static_cast<double>(formula))
      << policy.to_string() << ": measured " << slope << " bytes per layer, formula " << formula;
}

}  // namespace

TEST(ActivationMemory, NoCheckpointingMatchesTheLayerFormula) {
  expect_per_layer(hp::ActivationCheckpointPolicy::none(), layer_bytes_none(Shape{}));
}

TEST(ActivationMemory, FullCheckpointingKeepsOnlyLayerInputs) {
  expect_per_layer(hp::ActivationCheckpointPolicy::full(), layer_bytes_full(Shape{}));
}

TEST(ActivationMemory, SelectiveCheckpointingKeepsTheProjections) {
  expect_per_layer(hp::ActivationCheckpointPolicy::selective(), layer_bytes_selective(Shape{}));
}

// Every second block: half the layers as with none, half as with full.
TEST(ActivationMemory, EverySecondBlockAveragesNoneAndFull) {
  const Shape m;
  expect_per_layer(hp::ActivationCheckpointPolicy::full(2), (layer_bytes_none(m) + layer_bytes_full(m)) / 2);
}
