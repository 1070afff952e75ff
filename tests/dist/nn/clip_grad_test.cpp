// hp::clip_grad_norm_ over DTensor gradients on any mesh against libtorch's clip_grad_norm_ on
// one process's gradients, and unique_parameters for optimizers.
#include <gtest/gtest.h>

#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <limits>

#include "training_util.h"

using namespace training_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_nn_clip_grad_test {
namespace {

// One forward and backward of `model` on this dp rank's rows of a fixed batch.
void backward_on(qwen3::CausalLM& model, int64_t dp_rank, int64_t dp_size) {
  const at::Tensor ids = token_batch(64, 4, 8, 5);
  const at::Tensor x = ids.narrow(1, 0, 8), y = ids.narrow(1, 1, 8);
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  qwen3::causal_lm_loss(model(dp_rows(x, dp_rank, dp_size)), dp_rows(y, dp_rank, dp_size)).backward();
}

// For each norm type: the norm equals libtorch's on the one-process gradients, and the clipped
// gradients equal libtorch's clipped ones.
void expect_clip_matches_one_process(qwen3::CausalLM& model, int64_t dp_rank, int64_t dp_size) {
  hp_test::manual_seed(7);
  qwen3::CausalLM ref(small_config());
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity(), 3.0}) {
    SCOPED_TRACE("norm_type " + std::to_string(norm_type));
    backward_on(model, dp_rank, dp_size);
    backward_on(ref, 0, 1);
    const double max_norm = 0.05;  // below every norm here: the gradients are scaled
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm, norm_type);
    const double norm = hp::clip_grad_norm_(hp::unique_parameters(*model), max_norm, norm_type).item<double>();
    ASSERT_GT(ref_norm, max_norm);
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm);
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters())
      EXPECT_TRUE(hp_test::close(whole(p.value().grad()), ref_params[p.key()].grad())) << p.key();
  }
}

}  // namespace

TEST(ClipGradNormDist, TensorParallelEqualsOneProcess) {
  auto tp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  hp_test::manual_seed(7);
  qwen3::CausalLM model(small_config());
  qwen3::parallelize_qwen3_tp(*model, tp, /*sequence_parallel=*/true);
  expect_clip_matches_one_process(model, 0, 1);
}

TEST(ClipGradNormDist, FullyShardOnDpTimesTpEqualsOneProcess) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  hp_test::manual_seed(7);
  qwen3::CausalLM model(small_config());
  qwen3::parallelize_qwen3_tp(*model, mesh["tp"], /*sequence_parallel=*/true);
  for (const auto& layer : *model->layers) hp::fully_shard(*layer, mesh["dp"]);
  hp::fully_shard(*model, mesh["dp"]);
  expect_clip_matches_one_process(model, mesh["dp"].get_local_rank(), 2);
}

// A Partial gradient's norm is the norm of the sum of its pieces, and scaling it scales the sum.
TEST(ClipGradNormDist, PartialShardedAndPlainGradientsTogether) {
  auto mesh = hp_test::world_mesh();
  const int64_t n = hp::get_world_size(), r = hp::get_rank();
  const at::Tensor g_partial = hp_test::random({5, 3}, 1), g_shard = hp_test::random({2 * n + 1, 4}, 2),
                   g_plain = hp_test::random({6}, 3);
  auto leaf = [](const at::Tensor& t) { return t.detach().requires_grad_(true); };
  at::Tensor a = leaf(hp::DTensor(hp::distribute_tensor(at::zeros({5, 3}), mesh, {hp::Replicate()})));
  a.mutable_grad() = hp::DTensor::from_local(hp_test::partial_piece(g_partial, r, n), mesh, {hp::Partial()});
  at::Tensor b = leaf(hp::DTensor(hp::distribute_tensor(at::zeros({2 * n + 1, 4}), mesh, {hp::Shard(0)})));
  b.mutable_grad() = hp::distribute_tensor(g_shard, mesh, {hp::Shard(0)});
  at::Tensor c = leaf(at::zeros({6}));
  c.mutable_grad() = g_plain.clone();
  for (const double norm_type : {2.0, 1.5, std::numeric_limits<double>::infinity()}) {
    std::vector<at::Tensor> ref{leaf(at::zeros({5, 3})), leaf(at::zeros({2 * n + 1, 4})), leaf(at::zeros({6}))};
    ref[0].mutable_grad() = g_partial.clone();
    ref[1].mutable_grad() = g_shard.clone();
    ref[2].mutable_grad() = g_plain.clone();
    a.mutable_grad() = hp::DTensor::from_local(hp_test::partial_piece(g_partial, r, n), mesh, {hp::Partial()});
    b.mutable_grad() = hp::distribute_tensor(g_shard, mesh, {hp::Shard(0)});
    c.mutable_grad() = g_plain.clone();
    const double expected = torch::nn::utils::clip_grad_norm_(ref, 0.5, norm_type);
    const double got = hp::clip_grad_norm_({a, b, c}, 0.5, norm_type).item<double>();
    EXPECT_NEAR(got, expected, 1e-5 * expected) << "norm_type " << norm_type;
    EXPECT_TRUE(hp_test::close(whole(a.grad()), ref[0].grad())) << norm_type;
    EXPECT_TRUE(hp_test::close(whole(b.grad()), ref[1].grad())) << norm_type;
    EXPECT_TRUE(hp_test::close(c.grad(), ref[2].grad())) << norm_type;
  }
}

// A NaN on one rank makes the norm NaN on every rank: all of them raise (none hangs).
TEST(ClipGradNormDist, NonFiniteNormRaisesOnEveryRank) {
  auto mesh = hp_test::world_mesh();
  at::Tensor w = hp::DTensor(hp::distribute_tensor(at::zeros({4, 2}), mesh, {hp::Shard(0)})).detach().requires_grad_(true);
  at::Tensor local = at::ones({4 / hp::get_world_size(), 2});
  if (hp::get_rank() == 0) local[0][0] = std::numeric_limits<float>::quiet_NaN();
  w.mutable_grad() = hp::DTensor::from_local(local, mesh, {hp::Shard(0)});
  try {
    hp::clip_grad_norm_({w}, 1.0, 2.0, /*error_if_nonfinite=*/true);
    ADD_FAILURE() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("hyper_parallel::clip_grad_norm_: the total norm of order 2"), std::string::npos) << e.what();
  }
  // Without the check the gradients are scaled by a NaN coefficient, as PyTorch does.
  EXPECT_TRUE(std::isnan(hp::clip_grad_norm_({w}, 1.0).item<double>()));
  EXPECT_THROW(hp::clip_grad_norm_({w}, 1.0, -1.0), c10::ValueError);
}

// A tied weight is one parameter: listed once, so an optimizer steps it once.
TEST(ClipGradNormDist, UniqueParametersListsATiedWeightOnce) {
  hp_test::manual_seed(3);
  qwen3::CausalLM model(small_config(0.0, /*tied=*/true));
  const auto all = model->parameters(), unique = hp::unique_parameters(*model);
  EXPECT_EQ(unique.size() + 1, all.size());
  EXPECT_TRUE(std::any_of(unique.begin(), unique.end(), [&](const at::Tensor& p) { return p.is_same(model->lm_head->weight()); }));
}

}  // namespace t_dist_nn_clip_grad_test
