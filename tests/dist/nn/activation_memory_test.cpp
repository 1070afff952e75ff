// The activation memory of one Qwen3 decoder layer, counted as Korthikanti et al. (2022) count it
// for GPT (the bytes of the tensors autograd keeps from a layer's forward for its backward), for
// our layer (the formulas and their derivation: training_util.h), against MemoryTracker's peak.
// The per-layer figure is the slope of the step's transient peak over the number of layers
// (measured at 2 and 6 layers), which removes what does not scale with depth: the logits, the
// loss, and backward's working set.
#include <gtest/gtest.h>

#include "training_util.h"

using namespace training_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_nn_activation_memory_test {
namespace {

int64_t step_peak(const Shape& m, int64_t layers, const hp::ActivationCheckpointPolicy& policy) {
  const qwen3::Config c = layer_config(m, layers);
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

}  // namespace t_dist_nn_activation_memory_test
