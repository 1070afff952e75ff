// Every redistribution transition, forward and backward, on even and uneven shapes, against the
// single-process values; plus distribute_tensor's src_data_rank paths.
#include "../../common/test_util.h"

#include <hyper_parallel/runtime/comm_debug_mode.h>

#include <random>

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_redistribute_test {
namespace {

// A leaf DTensor holding `full` laid out by `src` (Partial: pieces that sum to `full`).
hp::DTensor make_input(const at::Tensor& full, const hp::DeviceMesh& mesh, const hp::Placements& src) {
  bool partial = false;
  for (const auto& p : src) partial = partial || p.is_partial();
  if (!partial) {
    auto x = hp::distribute_tensor(full, mesh, src, c10::nullopt);
    x.set_requires_grad(true);
    return x;
  }
  // Partial on mesh dim 0 of a 1-D mesh only in these tests.
  const auto& g = mesh.get_group(0);
  at::Tensor local = partial_piece(full, g.rank(), g.size()).requires_grad_(true);
  auto x = hp::DTensor::from_local(local, mesh, src);
  return x;
}

std::vector<std::vector<int64_t>> shapes(int64_t ws) {
  return {{ws * 3, 3}, {ws * 3 + 1, 3}, {ws * 3 + 2, 3}, {3, ws * 3 + 1}, {3, ws * 3 + 2}, {1, 3}};
}

}  // namespace

TEST(RedistributeDist, EveryTransitionForwardAndBackward) {
  auto mesh = world_mesh();
  const hp::Placements all[] = {{hp::Shard(0)}, {hp::Shard(1)}, {hp::Replicate()}, {hp::Partial()}};
  for (const auto& shape : shapes(mesh.size()))
    for (const auto& src : all)
      for (const auto& dst : all) {
        const std::string what = hp::to_string(src) + " -> " + hp::to_string(dst) + " shape " +
                                 c10::str(c10::IntArrayRef(shape));
        at::Tensor full = values(shape, 3);
        at::Tensor weight = values(shape, 7) + 1;  // the upstream gradient
        hp::DTensor x = make_input(full, mesh, src);
        if (dst[0].is_partial() && !src[0].is_partial()) {
          // PyTorch parity: Partial is produced by ops, never asked for (internally the ops'
          // Replicate -> Partial step stays: RedistributePlan tests cover it).
          EXPECT_THROW(x.redistribute(mesh, dst), c10::ValueError) << what;
          continue;
        }
        hp::DTensor y = x.redistribute(mesh, dst);
        ASSERT_EQ(y.placements(), hp::normalize_placements(dst, 2)) << what;
        ASSERT_EQ(y.sizes(), full.sizes()) << what;
        ASSERT_TRUE(close(y, full)) << what;
        if (!dst[0].is_partial()) {
          auto expect = hp::distribute_tensor(full, mesh, dst, c10::nullopt);
          ASSERT_TRUE(at::equal(y.to_local(), expect.to_local())) << what;
        }
        // Backward: the values pass through unchanged, so d(sum(y * w))/dx = w. (A Partial
        // source is not a leaf; PartialInputGradientReachesEveryLocal covers it.)
        (y.full_tensor() * weight).sum().backward();
        if (src[0].is_partial()) continue;
        at::Tensor g = x.grad();
        ASSERT_TRUE(hp::is_dtensor(g)) << what;
        EXPECT_EQ(hp::DTensor(g).placements(), hp::normalize_placements(src, 2)) << what;
        ASSERT_TRUE(close(g, weight)) << what;
      }
}

TEST(RedistributeDist, PartialInputGradientReachesEveryLocal) {
  auto mesh = world_mesh();
  const auto& g = mesh.get_group(0);
  at::Tensor full = values({4, 3});
  at::Tensor weight = values({4, 3}, 5);
  for (const auto& dst : {hp::Placements{hp::Replicate()}, hp::Placements{hp::Shard(0)}}) {
    at::Tensor local = partial_piece(full, g.rank(), g.size()).requires_grad_(true);
    auto x = hp::DTensor::from_local(local, mesh, {hp::Partial()});
    auto y = x.redistribute(dst);
    (y.full_tensor() * weight).sum().backward();
    EXPECT_TRUE(close(local.grad(), weight)) << hp::to_string(dst);
  }
}

TEST(RedistributeDist, CollectivesPerTransition) {
  auto mesh = world_mesh();
  at::Tensor full = values({mesh.size() * 2, 4});
  struct Case { hp::Placements src, dst; const char* kind; };
  const Case cases[] = {
      {{hp::Shard(0)}, {hp::Replicate()}, "all_gather"},
      {{hp::Partial()}, {hp::Replicate()}, "all_reduce"},
      {{hp::Partial()}, {hp::Shard(0)}, "reduce_scatter"},
      {{hp::Shard(0)}, {hp::Shard(1)}, "all_to_all"},
  };
  for (const auto& c : cases) {
    auto x = make_input(full, mesh, c.src);
    hp::CommDebugMode comm;
    auto y = x.redistribute(c.dst);
    EXPECT_EQ(comm.get_total_counts(), 1) << comm.summary();
    EXPECT_EQ(comm.get_comm_count(c.kind), 1) << comm.summary();
  }
  auto x = make_input(full, mesh, {hp::Replicate()});
  hp::CommDebugMode comm;
  x.redistribute({hp::Shard(1)});  // a local chunk
  EXPECT_EQ(comm.get_total_counts(), 0);
  // PyTorch parity: Partial is not a layout to ask for.
  EXPECT_THROW(x.redistribute({hp::Partial()}), c10::ValueError);
}

// 4 ranks as a 2x2 mesh: transitions on each mesh dim and on both at once.
TEST(Redistribute2DDist, TwoDimensionalMesh) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const hp::Placements all[] = {
      {hp::Shard(0), hp::Shard(1)}, {hp::Shard(0), hp::Shard(0)}, {hp::Replicate(), hp::Shard(0)},
      {hp::Shard(1), hp::Replicate()}, {hp::Replicate(), hp::Replicate()}, {hp::Shard(1), hp::Shard(0)},
      {hp::Shard(1), hp::Shard(1)}};
  for (const auto& shape : std::vector<std::vector<int64_t>>{{8, 4}, {7, 5}, {3, 6}})
    for (const auto& src : all)
      for (const auto& dst : all) {
        const std::string what = hp::to_string(src) + " -> " + hp::to_string(dst) + " shape " +
                                 c10::str(c10::IntArrayRef(shape));
        at::Tensor full = values(shape, 1);
        at::Tensor weight = values(shape, 4);
        auto x = hp::distribute_tensor(full, mesh, src, c10::nullopt);
        x.set_requires_grad(true);
        auto y = x.redistribute(dst);
        auto expect = hp::distribute_tensor(full, mesh, dst, c10::nullopt);
        ASSERT_TRUE(at::equal(y.to_local(), expect.to_local())) << what;
        (y.full_tensor() * weight).sum().backward();
        ASSERT_TRUE(close(x.grad(), weight)) << what;
        EXPECT_EQ(hp::DTensor(x.grad()).placements(), src) << what;
      }
  // Partial on one mesh dim, Shard on the other.
  at::Tensor full = values({4, 4});
  const auto& tp = mesh.get_group("tp");
  auto local = partial_piece(full, tp.rank(), tp.size()).narrow(0, mesh.get_local_rank(0) * 2, 2).contiguous();
  auto x = hp::DTensor::from_local(local, mesh, {hp::Shard(0), hp::Partial()});
  EXPECT_TRUE(close(x.redistribute({hp::Replicate(), hp::Replicate()}), full));
  EXPECT_TRUE(close(x.redistribute({hp::Shard(0), hp::Shard(1)}), full));
}

TEST(DistributeTensorDist, B7_SrcDataRankZeroOthersPassZeros) {
  auto mesh = world_mesh();
  at::Tensor full = values({mesh.size() * 2 + 1, 3});
  at::Tensor given = mesh.get_local_rank() == 0 ? full : at::zeros_like(full);
  for (const auto& pl : {hp::Placements{hp::Shard(0)}, hp::Placements{hp::Shard(1)}, hp::Placements{hp::Replicate()}}) {
    auto d = hp::distribute_tensor(given, mesh, pl, 0);
    auto ref = hp::distribute_tensor(full, mesh, pl, c10::nullopt);
    EXPECT_TRUE(at::equal(d.to_local(), ref.to_local())) << hp::to_string(pl);
    EXPECT_TRUE(close(d, full));
  }
}

TEST(DistributeTensorDist, B8_SrcDataRankNoneSlicesLocally) {
  auto mesh = world_mesh();
  at::Tensor full = values({mesh.size() * 3, 2});
  hp::CommDebugMode comm;
  auto d = hp::distribute_tensor(full, mesh, {hp::Shard(0)}, c10::nullopt);
  EXPECT_EQ(comm.get_total_counts(), 0);
  const int64_t r = mesh.get_local_rank();
  EXPECT_TRUE(at::equal(d.to_local(), full.narrow(0, r * 3, 3)));
  EXPECT_EQ(d.sizes(), full.sizes());
}

TEST(DistributeTensorDist, B9_MetaTensorsNeverCommunicate) {
  auto mesh = world_mesh();
  at::Tensor meta = at::empty({mesh.size() * 4, 6}, at::TensorOptions().device(at::kMeta));
  hp::CommDebugMode comm;
  auto d = hp::distribute_tensor(meta, mesh, {hp::Shard(0)}, 0);
  EXPECT_EQ(comm.get_total_counts(), 0);
  EXPECT_TRUE(d.to_local().is_meta());
  EXPECT_EQ(d.to_local().sizes(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(d.sizes(), meta.sizes());
}

TEST(DistributeTensorDist, FromLocalRunCheckAndErrors) {
  auto mesh = world_mesh();
  const int64_t r = mesh.get_local_rank(), n = mesh.size();
  // Uneven pieces: run_check finds the global size.
  at::Tensor full = values({n * 2 + 1, 3});
  auto mine = hp::distribute_tensor(full, mesh, {hp::Shard(0)}, c10::nullopt).to_local();
  auto x = hp::DTensor::from_local(mine, mesh, {hp::Shard(0)}, /*run_check=*/true);
  EXPECT_EQ(x.size(0), n * 2 + 1);
  EXPECT_TRUE(close(x, full));
  // Replicate with differing values: coordinate 0 wins.
  at::Tensor differing = at::full({2}, static_cast<double>(r));
  auto rep = hp::DTensor::from_local(differing, mesh, {hp::Replicate()}, true);
  EXPECT_TRUE(at::equal(rep.to_local(), at::zeros({2})));
  EXPECT_THROW(hp::DTensor::from_local(mine, mesh, {hp::Shard(0), hp::Shard(1)}), c10::ValueError);
  EXPECT_THROW(hp::DTensor(at::ones({2})), c10::TypeError);
  std::ostringstream os;
  os << x;
  EXPECT_NE(os.str().find("Shard(dim=0)"), std::string::npos);
}

namespace {
// Random chains of three redistributions over random shapes (dims smaller than the mesh, empty
// ones included) and random placements of every mesh dim; values and gradients must pass through.
void random_chains(const hp::DeviceMesh& mesh, uint64_t seed, int trials) {
  std::mt19937_64 rng(seed);  // the same stream on every rank
  auto random_placements = [&](int64_t ndim, bool partial_ok) {
    hp::Placements p;
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      const uint64_t k = rng() % (ndim + (partial_ok ? 2 : 1));
      if (k < static_cast<uint64_t>(ndim)) p.push_back(hp::Shard(static_cast<int64_t>(k)));
      else if (k == static_cast<uint64_t>(ndim)) p.push_back(hp::Replicate());
      else p.push_back(hp::Partial());
    }
    return p;
  };
  for (int t = 0; t < trials; ++t) {
    const int64_t ndim = 1 + static_cast<int64_t>(rng() % 3);
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < ndim; ++d) shape.push_back(static_cast<int64_t>(rng() % 8));
    const at::Tensor full = values(shape, t);
    const hp::Placements src = random_placements(ndim, false);
    hp::Placements chain[3];
    for (auto& c : chain) c = random_placements(ndim, false);
    std::string what = "trial " + std::to_string(t) + " shape " + c10::str(c10::IntArrayRef(shape)) + ": " + hp::to_string(src);
    for (auto& c : chain) what += " -> " + hp::to_string(c);
    auto x = hp::distribute_tensor(full, mesh, src, c10::nullopt);
    x.set_requires_grad(true);
    hp::DTensor y = x;
    for (auto& c : chain) y = y.redistribute(c);
    ASSERT_EQ(y.placements(), hp::normalize_placements(chain[2], ndim)) << what;
    ASSERT_TRUE(at::equal(y.full_tensor(), full)) << what;
    ASSERT_TRUE(at::equal(y.to_local(), hp::distribute_tensor(full, mesh, chain[2], c10::nullopt).to_local())) << what;
    const at::Tensor w = values(shape, t + 7) + 1;
    (y.full_tensor() * w).sum().backward();
    ASSERT_TRUE(x.grad().defined()) << what;
    ASSERT_EQ(hp::DTensor(x.grad()).placements(), hp::normalize_placements(src, ndim)) << what;
    ASSERT_TRUE(at::equal(hp::DTensor(x.grad()).full_tensor(), w)) << what;
  }
}
}  // namespace

TEST(RedistributeDist, RandomChainsOfThree) { random_chains(world_mesh(), 11, 150); }

TEST(Redistribute2DDist, RandomChainsOfThree) {
  ASSERT_EQ(hp::get_world_size(), 4);
  random_chains(hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}), 12, 150);
}

}  // namespace t_dist_dtensor_redistribute_test
