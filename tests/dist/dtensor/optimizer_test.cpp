// torch::optim on DTensor parameters: the same steps as on plain parameters.
#include "../../common/test_util.h"

#include <torch/optim.h>

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_optimizer_test {
namespace {

struct Mlp {
  std::vector<at::Tensor> params;  // w1, b1, w2, b2
  at::Tensor forward(const at::Tensor& x) const {
    return at::linear(at::relu(at::linear(x, params[0], params[1])), params[2], params[3]);
  }
};

// Colwise + Rowwise placements of a two-layer MLP, and the plain twin with the same values.
std::pair<Mlp, Mlp> make_mlps(const hp::DeviceMesh& mesh) {
  const int64_t n = mesh.size();
  std::vector<at::Tensor> full{random({4 * n, 6}, 1), random({4 * n}, 2), random({5, 4 * n}, 3), random({5}, 4)};
  const hp::Placements pl[] = {{hp::Shard(0)}, {hp::Shard(0)}, {hp::Shard(1)}, {hp::Replicate()}};
  Mlp dist, plain;
  for (size_t k = 0; k < full.size(); ++k) {
    plain.params.push_back(full[k].clone().requires_grad_(true));
    auto d = hp::distribute_tensor(full[k], mesh, pl[k], c10::nullopt);
    d.set_requires_grad(true);
    dist.params.push_back(d);
  }
  return {dist, plain};
}

template <class MakeOptimizer>
void run_steps(const char* name, MakeOptimizer make) {
  auto mesh = world_mesh();
  auto [dist, plain] = make_mlps(mesh);
  auto opt_d = make(dist.params);
  auto opt_p = make(plain.params);
  at::Tensor x = random({3, 6}, 9);
  auto xd = hp::distribute_tensor(x, mesh, {hp::Replicate()});
  for (int step = 0; step < 3; ++step) {
    opt_d.zero_grad();
    opt_p.zero_grad();
    at::Tensor w = values({3, 5}, step);
    (hp::DTensor(dist.forward(xd)).full_tensor() * w).sum().backward();
    (plain.forward(x) * w).sum().backward();
    opt_d.step();
    opt_p.step();
    for (size_t k = 0; k < plain.params.size(); ++k) {
      ASSERT_TRUE(hp::is_dtensor(dist.params[k])) << name;
      ASSERT_TRUE(close(dist.params[k], plain.params[k])) << name << " step " << step << " param " << k;
    }
  }
  // The parameters kept their layout and their local shards stayed 1/n of the sharded ones.
  EXPECT_EQ(hp::DTensor(dist.params[0]).placements(), hp::Placements{hp::Shard(0)});
  EXPECT_EQ(hp::DTensor(dist.params[0]).to_local().size(0), 4);
}

}  // namespace

TEST(OptimizerDist, SgdWithMomentumAndWeightDecay) {
  run_steps("sgd", [](std::vector<at::Tensor> p) {
    return torch::optim::SGD(p, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
  });
}

TEST(OptimizerDist, Adam) {
  run_steps("adam", [](std::vector<at::Tensor> p) { return torch::optim::Adam(p, torch::optim::AdamOptions(0.01)); });
}

TEST(OptimizerDist, AdamW) {
  run_steps("adamw", [](std::vector<at::Tensor> p) {
    return torch::optim::AdamW(p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  });
}

// torch's _foreach_ ops (torch.optim's foreach path, clip_grad_norm_'s _foreach_norm) on lists of
// Shard and Replicate DTensors: each element as the per-tensor op gives it, equal to the same
// foreach op on plain tensors; maximum_ (which has no in-place per-tensor op) too.
TEST(OptimizerDist, ForeachOpsOnDTensorListsEqualPlain) {
  auto mesh = world_mesh();
  auto [dist, plain] = make_mlps(mesh);
  std::vector<at::Tensor> d, p, dg, pg;
  for (size_t k = 0; k < dist.params.size(); ++k) {
    d.push_back(dist.params[k].detach());
    p.push_back(plain.params[k].detach());
    at::Tensor g = random(plain.params[k].sizes(), 20 + static_cast<int>(k));
    pg.push_back(g);
    dg.push_back(hp::distribute_tensor(g, mesh, hp::DTensor(dist.params[k]).placements()));
  }
  at::_foreach_mul_(d, 0.5);
  at::_foreach_mul_(p, 0.5);
  at::_foreach_add_(d, dg, 2.0);
  at::_foreach_add_(p, pg, 2.0);
  at::_foreach_addcmul_(d, dg, dg, 0.25);
  at::_foreach_addcmul_(p, pg, pg, 0.25);
  at::_foreach_maximum_(d, dg);
  at::_foreach_maximum_(p, pg);
  at::_foreach_abs_(d);
  at::_foreach_abs_(p);
  const std::vector<at::Tensor> ds = at::_foreach_sqrt(d), ps = at::_foreach_sqrt(p);
  const std::vector<at::Tensor> dn = at::_foreach_norm(dg), pn = at::_foreach_norm(pg);
  for (size_t k = 0; k < d.size(); ++k) {
    EXPECT_TRUE(hp::is_dtensor(d[k]) && hp::is_dtensor(ds[k]) && hp::is_dtensor(dn[k])) << k;
    EXPECT_EQ(hp::DTensor(ds[k]).placements(), hp::DTensor(d[k]).placements()) << k;
    EXPECT_TRUE(close(d[k], p[k])) << k;
    EXPECT_TRUE(close(ds[k], ps[k])) << k;
    EXPECT_TRUE(close(dn[k], pn[k])) << k;
  }
}

}  // namespace t_dist_dtensor_optimizer_test
