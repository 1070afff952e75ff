// The Linear's small-batch rule: which products take (W @ x^T)^T, and that they give linear's values.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <hyper_parallel/nn/layers.h>

namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_nn_linear_test {

TEST(Linear, SmallBatchInferenceTakesTheTransposedProductAndMatchesLinear) {
  at::manual_seed(3);
  hnn::Linear lin(hnn::LinearOptions(64, 48).bias(true));
  c10::InferenceMode inference;
  // {input shape, whether the rule applies}: 2 to 32 rows, counted over all leading dims.
  const std::vector<std::pair<std::vector<int64_t>, bool>> cases = {
      {{1, 64}, false}, {{2, 64}, true}, {{8, 64}, true}, {{32, 64}, true}, {{33, 64}, false},
      {{2, 4, 64}, true}, {{4, 8, 64}, true}, {{1, 1, 64}, false}, {{3, 11, 64}, false}};
  for (const auto& [shape, applies] : cases) {
    const at::Tensor x = at::randn(shape);
    EXPECT_EQ(hnn::small_batch_transposed_product(x, lin->weight()), applies) << x.sizes();
    const at::Tensor want = at::linear(x, lin->weight(), lin->bias());
    const at::Tensor got = lin(x);
    EXPECT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << x.sizes() << " max diff " << (got - want).abs().max().item<float>();
  }
}

TEST(Linear, TrainingAndOtherDtypesKeepLinearBitwise) {
  at::manual_seed(4);
  hnn::Linear lin(hnn::LinearOptions(32, 16).bias(false));
  const at::Tensor x = at::randn({8, 32});
  // With autograd on (training), and under a NoGradGuard (activation checkpointing's first
  // forward, which backward recomputes with autograd on), the product is linear's.
  EXPECT_FALSE(hnn::small_batch_transposed_product(x, lin->weight()));
  EXPECT_TRUE(at::equal(lin(x), at::linear(x, lin->weight())));
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(hnn::small_batch_transposed_product(x, lin->weight()));
    EXPECT_TRUE(at::equal(lin(x), at::linear(x, lin->weight())));
  }
  c10::InferenceMode inference;
  hnn::Linear half(hnn::LinearOptions(32, 16).bias(false));
  half->to(at::kBFloat16);
  const at::Tensor xb = x.to(at::kBFloat16);
  EXPECT_FALSE(hnn::small_batch_transposed_product(xb, half->weight()));
  EXPECT_TRUE(at::equal(half(xb), at::linear(xb, half->weight())));
}

}  // namespace t_unit_nn_linear_test
