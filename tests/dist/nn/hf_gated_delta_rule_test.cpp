// The Gated DeltaNet's kernels against transformers' own torch implementation (the functions
// Qwen3.5 runs on CPU: torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule,
// causal_conv1d_fn and causal_conv1d_update; tests/tools/hf_reference.py writes their values for
// 70 tokens, two chunks with padding, 2 key heads serving 4 value heads, from a random state).
// One process (models_hf_np1): the kernels have no parallel part.
#include <gtest/gtest.h>

#include <hyper_parallel/nn/gated_delta_rule.h>

#include "../../common/hf_reference.h"

namespace fn = hyper_parallel::nn::functional;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_nn_hf_gated_delta_rule_test {
TEST(HFGatedDeltaRule, ChunkedRuleMatchesTransformersOutputStateAndGradients) {
  HP_REQUIRE_HF_REFERENCE(ref, "gated_delta_rule");
  const std::string d = ref + "/gated_delta_rule";
  auto t = [&](const char* name) { return hp_test::hf_expected(d, name); };
  const char* names[] = {"query", "key", "value", "g", "beta", "initial_state"};
  std::vector<at::Tensor> leaves;
  for (const char* n : names) leaves.push_back(t(n).requires_grad_());
  const auto r = fn::chunk_gated_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5]);
  EXPECT_TRUE(hp_test::near_relative(r.output, t("chunk_output"), 1e-5));
  EXPECT_TRUE(hp_test::near_relative(r.final_state, t("chunk_state"), 1e-5));
  ((r.output * t("wo")).sum() + (r.final_state * t("ws")).sum()).backward();
  for (size_t i = 0; i < leaves.size(); ++i) EXPECT_TRUE(hp_test::near_relative(leaves[i].grad(), t((std::string("grad_") + names[i]).c_str()), 1e-5)) << names[i];
}

TEST(HFGatedDeltaRule, RecurrenceMatchesTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, "gated_delta_rule");
  const std::string d = ref + "/gated_delta_rule";
  auto t = [&](const char* name) { return hp_test::hf_expected(d, name); };
  const auto r = fn::recurrent_gated_delta_rule(t("query"), t("key"), t("value"), t("g"), t("beta"), t("initial_state"));
  EXPECT_TRUE(hp_test::near_relative(r.output, t("recurrent_output"), 1e-5));
  EXPECT_TRUE(hp_test::near_relative(r.final_state, t("recurrent_state"), 1e-5));
}

TEST(HFGatedDeltaRule, CausalConvMatchesTransformersPrefillAndDecode) {
  HP_REQUIRE_HF_REFERENCE(ref, "gated_delta_rule");
  const std::string d = ref + "/gated_delta_rule";
  auto t = [&](const char* name) { return hp_test::hf_expected(d, name); };
  const auto prefill = fn::causal_conv1d(t("conv_x"), t("conv_weight"));
  EXPECT_TRUE(hp_test::near_relative(prefill.output, t("conv_output"), 1e-6));
  EXPECT_TRUE(at::equal(prefill.final_state, t("conv_prefill_state"))) << "the cached pre-conv inputs";
  const auto step = fn::causal_conv1d(t("conv_next_x"), t("conv_weight"), prefill.final_state);
  EXPECT_TRUE(hp_test::near_relative(step.output, t("conv_next_output"), 1e-6));
  EXPECT_TRUE(at::equal(step.final_state, t("conv_next_state")));
}

}  // namespace t_dist_nn_hf_gated_delta_rule_test
