// torch::manual_seed seeds hyper_parallel's generator too, as PyTorch users seed: layers built
// after the same torch seed are the same, whichever of torch's and our seedings came last decides.
#include <gtest/gtest.h>

#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/nn/layers.h>

#include <ATen/ATen.h>
#include <torch/utils.h>

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_dtensor_torch_seed_test {
namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

bool same_layer(hnn::Linear& a, hnn::Linear& b) { return at::equal(a->weight(), b->weight()) && at::equal(a->bias(), b->bias()); }

TEST(TorchSeed, TorchManualSeedMakesLayersAndDropoutReproducible) {
  torch::manual_seed(1);
  hnn::Linear a(16, 16);
  const at::Tensor mask_a = hp::dropout(at::ones({64}), 0.5, true);
  torch::manual_seed(1);
  hnn::Linear b(16, 16);
  const at::Tensor mask_b = hp::dropout(at::ones({64}), 0.5, true);
  EXPECT_TRUE(same_layer(a, b));
  EXPECT_TRUE(at::equal(mask_a, mask_b));
  EXPECT_EQ(hp::initial_seed(), 1u);
  // Another seed, other values: the comparison above can fail.
  torch::manual_seed(2);
  hnn::Linear c(16, 16);
  EXPECT_FALSE(same_layer(a, c));
  // Without a new seeding the stream goes on: the next layer differs from the first.
  hnn::Linear d(16, 16);
  EXPECT_FALSE(same_layer(c, d));
}

// torch's own draws between the seeding and ours do not break the repetition: our keys are
// torch's next draws, so the same seeding and the same torch calls give the same layer.
TEST(TorchSeed, TorchDrawsBetweenSeedingAndLayerRepeat) {
  torch::manual_seed(7);
  torch::rand({1});
  hnn::Linear a(16, 16);
  torch::manual_seed(7);
  torch::rand({1});
  hnn::Linear b(16, 16);
  EXPECT_TRUE(same_layer(a, b));
  // Without the torch draw the layer is another one: the draw really moved the stream.
  torch::manual_seed(7);
  hnn::Linear c(16, 16);
  EXPECT_FALSE(same_layer(a, c));
}

TEST(TorchSeed, TheLastSeedingDecides) {
  hp::manual_seed(7);
  hnn::Linear ours(8, 8);
  // hp::manual_seed after torch::manual_seed: ours decides.
  torch::manual_seed(3);
  hp::manual_seed(7);
  hnn::Linear after(8, 8);
  EXPECT_TRUE(same_layer(ours, after));
  // torch::manual_seed after hp::manual_seed: torch's decides.
  torch::manual_seed(3);
  hnn::Linear t1(8, 8);
  hp::manual_seed(7);
  torch::manual_seed(3);
  hnn::Linear t2(8, 8);
  EXPECT_TRUE(same_layer(t1, t2));
  EXPECT_FALSE(same_layer(t1, ours));
  // torch's own stream stays reproducible under the same seedings.
  torch::manual_seed(4);
  hnn::Linear e(4, 4);
  const at::Tensor r1 = at::rand({8});
  torch::manual_seed(4);
  hnn::Linear f(4, 4);
  const at::Tensor r2 = at::rand({8});
  EXPECT_TRUE(at::equal(r1, r2));
}

}  // namespace t_unit_dtensor_torch_seed_test
