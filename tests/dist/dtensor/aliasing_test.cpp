// DTensor results alias and stride as plain tensors do. Each test is a chain of ops that gave a
// silently wrong value (or an error on one rank only) when a result aliased its source where the
// plain result does not, or reported contiguous strides where the plain op keeps its input's
// layout, so a later contiguous()/reshape()/in-place op decided differently.
#include "../../common/test_util.h"

using namespace hp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_aliasing_test {
namespace {
int64_t ws() { return hp::get_world_size(); }

hp::DeviceMesh mesh_2x2() { return hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}); }

at::Tensor eight() { return at::arange(1, 9, at::kFloat).reshape({4, 2}); }

// The global strides a DTensor reports equal the plain tensor's on every dim of size > 1 (the
// stride of a dim of size 1 is read by no view decision; libtorch's own kernels differ there),
// and its values.
::testing::AssertionResult same_layout_and_values(const at::Tensor& d, const at::Tensor& plain) {
  bool same = d.sizes() == plain.sizes();
  for (int64_t k = 0; same && k < d.dim(); ++k) same = plain.size(k) <= 1 || d.stride(k) == plain.stride(k);
  if (!same)
    return ::testing::AssertionFailure() << "strides " << d.strides() << " != plain " << plain.strides() << " (sizes "
                                         << plain.sizes() << ")";
  return close(d, plain);
}
}  // namespace

// Replicate -> Shard takes a copy of the local chunk, never a view of the source's data.
TEST(AliasingDist, ReplicateToShardDoesNotAliasTheSource) {
  if (ws() < 2) GTEST_SKIP();
  auto mesh = world_mesh();
  for (int64_t dim : {0, 1}) {
    for (bool write_target : {true, false}) {
      auto x = hp::distribute_tensor(eight(), mesh, {hp::Replicate()});
      auto y = x.redistribute({hp::Shard(dim)});
      if (write_target) y.mul_(10);
      else x.add_(100);
      EXPECT_TRUE(close(x, write_target ? eight() : eight() + 100)) << "Shard(" << dim << ")";
      EXPECT_TRUE(close(y, write_target ? eight() * 10 : eight())) << "Shard(" << dim << ")";
      EXPECT_FALSE(hp::DTensor(y).to_local().is_alias_of(hp::DTensor(x).to_local()));
    }
  }
  // A dim preceded only by size-1 dims is a contiguous chunk too.
  auto x = hp::distribute_tensor(eight().reshape({1, 4, 2}), mesh, {hp::Replicate()});
  auto y = x.redistribute({hp::Shard(1)});
  y.mul_(10);
  EXPECT_TRUE(close(x, eight().reshape({1, 4, 2})));
}

TEST(AliasingDist, ReplicateToShardOnEitherDimOfA2x2MeshDoesNotAlias) {
  if (ws() != 4) GTEST_SKIP();
  auto mesh = mesh_2x2();
  for (const P& target : {P{hp::Shard(0), hp::Replicate()}, P{hp::Replicate(), hp::Shard(0)},
                          P{hp::Shard(0), hp::Shard(1)}}) {
    auto x = hp::distribute_tensor(eight(), mesh, {hp::Replicate(), hp::Replicate()});
    auto y = x.redistribute(target);
    y.mul_(10);
    EXPECT_TRUE(close(x, eight())) << hp::to_string(target);
    EXPECT_TRUE(close(y, eight() * 10)) << hp::to_string(target);
  }
}

// distribute_tensor never hands out a view of the caller's tensor either.
TEST(AliasingDist, DistributeTensorCopies) {
  auto mesh = world_mesh();
  for (const P& p : {P{hp::Shard(0)}, P{hp::Replicate()}}) {
    for (c10::optional<int64_t> src : {c10::optional<int64_t>{}, c10::optional<int64_t>{0}}) {
      at::Tensor whole = eight();
      auto d = hp::distribute_tensor(whole, mesh, p, src);
      d.mul_(10);
      EXPECT_TRUE(at::equal(whole, eight())) << hp::to_string(p);
    }
  }
}

// A pointwise result keeps its input's layout, as the plain op does.
TEST(AliasingDist, PointwiseResultsKeepTheInputLayout) {
  auto mesh = world_mesh();
  at::Tensor plain = eight();
  auto x = hp::distribute_tensor(plain, mesh, {hp::Shard(0)});
  EXPECT_TRUE(same_layout_and_values(x.t().neg(), plain.t().neg()));
  EXPECT_TRUE(same_layout_and_values(x.t() - 4.5, plain.t() - 4.5));
  EXPECT_TRUE(same_layout_and_values(x.t() * x.t(), plain.t() * plain.t()));
  EXPECT_TRUE(same_layout_and_values(x.t().exp(), plain.t().exp()));
  EXPECT_TRUE(same_layout_and_values(x.t().relu(), plain.t().relu()));
  // The local data is laid out as the global strides say: views decide alike on every rank.
  at::Tensor local = hp::DTensor(x.t().neg()).to_local();
  if (local.size(0) > 1 && local.size(1) > 1) EXPECT_FALSE(local.is_contiguous());
}

// contiguous() of a non-contiguous result copies, as on plain tensors.
TEST(AliasingDist, ContiguousOfATransposedResultCopies) {
  auto mesh = world_mesh();
  at::Tensor plain = eight();
  auto x = hp::distribute_tensor(plain, mesh, {hp::Shard(0)});
  at::Tensor src_p = plain.t().neg(), c_p = src_p.contiguous();
  at::Tensor src_d = x.t().neg(), c_d = src_d.contiguous();
  c_p.mul_(10);
  c_d.mul_(10);
  EXPECT_TRUE(close(src_d, src_p));
  EXPECT_TRUE(same_layout_and_values(c_d, c_p));
}

// contiguous() / reshape() of a result whose transpose is contiguous are views, as on plain.
TEST(AliasingDist, ViewsOfAContiguousTransposeShareData) {
  auto mesh = world_mesh();
  at::Tensor plain = eight();
  auto x = hp::distribute_tensor(plain, mesh, {hp::Shard(0)});
  {
    at::Tensor z_p = plain.t().neg(), z_d = x.t().neg();
    at::Tensor c_p = z_p.t().contiguous(), c_d = z_d.t().contiguous();
    c_p.mul_(10);
    c_d.mul_(10);
    EXPECT_TRUE(close(z_d, z_p));
    EXPECT_TRUE(same_layout_and_values(c_d, c_p));
  }
  {
    at::Tensor z_p = plain.neg(), z_d = x.neg();
    at::Tensor c_p = z_p.reshape({8}), c_d = z_d.reshape({8});
    c_p.mul_(10);
    c_d.mul_(10);
    EXPECT_TRUE(close(z_d, z_p));
    EXPECT_TRUE(close(c_d, c_p));
  }
}

// A reshape that copies on plain tensors copies on DTensors, so a later in-place op on the
// source does not reach it, and the gradient is the plain one (2x2 mesh, x a Shard(0) leaf).
TEST(AliasingDist, GradientThroughAReshapeCopyIsThePlainOne) {
  const bool two_d = ws() == 4;
  auto mesh = two_d ? mesh_2x2() : world_mesh();
  const P pl = two_d ? P{hp::Shard(0), hp::Replicate()} : P{hp::Shard(0)};
  at::Tensor w = at::arange(8, at::kFloat) - 3;
  auto run = [&](const at::Tensor& x) {
    at::Tensor z = x.t() - 4.5;
    at::Tensor v = z.reshape(-1);
    z.relu_();
    at::Tensor vf = hp::is_dtensor(v) ? hp::DTensor(v).full_tensor() : v;
    (vf * w).sum().backward();
    return vf.detach();
  };
  at::Tensor xp = eight().requires_grad_(true);
  at::Tensor ref = run(xp);
  auto xd = hp::distribute_tensor(eight(), mesh, pl);
  xd.set_requires_grad(true);
  at::Tensor out = run(xd);
  EXPECT_TRUE(close(out, ref));
  ASSERT_TRUE(xd.grad().defined());
  EXPECT_TRUE(close(xd.grad(), xp.grad()));
}

// An in-place op on contiguous() of an op's result leaves the result (saved for backward)
// alone when the plain contiguous() copies.
TEST(AliasingDist, InPlaceOnAContiguousCopyKeepsSavedTensors) {
  auto mesh = world_mesh();
  at::Tensor w = at::arange(8, at::kFloat).reshape({2, 4}) - 3;
  auto run = [&](const at::Tensor& x) {
    at::Tensor c = x.t().exp().contiguous();
    c.relu_();
    at::Tensor cf = hp::is_dtensor(c) ? hp::DTensor(c).full_tensor() : c;
    (cf * w).sum().backward();
    return cf.detach();
  };
  at::Tensor xp = (eight() / 8).requires_grad_(true);
  at::Tensor ref = run(xp);
  auto xd = hp::distribute_tensor(eight() / 8, mesh, {hp::Shard(0)});
  xd.set_requires_grad(true);
  at::Tensor out = run(xd);
  EXPECT_TRUE(close(out, ref));
  EXPECT_TRUE(close(xd.grad(), xp.grad()));
}

// A size-1 sharded dim: contiguous() copies on every rank alike, and copy_ into it works on
// every rank (before, only the rank holding the data raised libtorch's overlap error).
TEST(AliasingDist, CopyIntoAContiguousCopyOfASize1ShardedDim) {
  auto mesh = world_mesh();
  at::Tensor plain = at::arange(1, 5, at::kFloat).reshape({1, 4});
  auto x = hp::distribute_tensor(plain, mesh, {hp::Shard(0)});
  at::Tensor t_p = plain.t().neg().contiguous(), t_d = x.t().neg().contiguous();
  at::Tensor other_p = plain.t() * 2, other_d = x.t() * 2;
  t_p.copy_(other_p);
  t_d.copy_(other_d);
  EXPECT_TRUE(close(t_d, t_p));
  EXPECT_TRUE(same_layout_and_values(t_d, t_p));
  EXPECT_TRUE(close(x, plain));
  // The same chain through the size-1 dim's transpose.
  at::Tensor u_p = plain.t().exp().contiguous(), u_d = x.t().exp().contiguous();
  u_p.copy_(plain.t().neg());
  u_d.copy_(x.t().neg());
  EXPECT_TRUE(close(u_d, u_p));
}

// An in-place op on a view of a tensor transposed in place: autograd's CopySlices makes the
// gradient buffer with new_empty_strided(base sizes, base strides) and views it with as_strided.
// The buffer once came out contiguous whatever the strides asked, so the view addressed other
// elements and the gradient was silently wrong (found by the op chains).
TEST(AliasingDist, InPlaceOnAViewOfATransposedTensorHasThePlainGradient) {
  for (const P& p : {P{hp::Replicate()}, P{hp::Partial()}}) {
    check_same_as_plain("t_ / select / unsqueeze / narrow().mul_ on " + hp::to_string(p), {random({3, 3}, 5)}, {p},
                        [](const std::vector<at::Tensor>& x) {
                          at::Tensor a = x[0].clone();
                          a.t_();
                          at::Tensor u = a.select(0, 1).unsqueeze(0);
                          u.narrow(1, 0, 1).mul_(0.5);
                          return at::cat({a.flatten(), u.flatten() * 3});
                        });
  }
}

// In-place ops on views of a sharded tensor, then backward: autograd replays them with
// as_strided on the gradient of the base. A geometry that is a view keeping every sharded dim
// whole (a transpose, a narrow or select of an unsharded dim) maps to the same view of the local
// piece; others are refused on every rank, naming the geometry.
TEST(AliasingDist, InPlaceOnViewsOfAShardedTensorHasThePlainGradient) {
  const std::vector<std::pair<std::string, std::function<void(at::Tensor&)>>> writes{
      {"transpose().add_", [](at::Tensor& a) { a.transpose(0, 1).add_(1.5); }},
      {"narrow(1).mul_", [](at::Tensor& a) { a.narrow(1, 1, 2).mul_(-2.0); }},
      {"select(1).relu_", [](at::Tensor& a) { a.select(1, 2).relu_(); }},
      {"unsqueeze(0).mul_", [](at::Tensor& a) { a.unsqueeze(0).mul_(3.0); }},
  };
  for (const auto& [name, write] : writes) {
    check_same_as_plain(name + " on Shard(0)", {random({5, 4}, 9)}, {P{hp::Shard(0)}},
                        [write = write](const std::vector<at::Tensor>& x) {
                          at::Tensor a = x[0] * 1;
                          write(a);
                          return a * a;
                        });
  }
  // A narrow of the sharded dim needed the other ranks' rows: a copy view, whose write is refused
  // on every rank.
  auto x = hp::distribute_tensor(random({4, 4}, 2), world_mesh(), {hp::Shard(0)});
  x.set_requires_grad(true);
  at::Tensor a = x * 1;
  EXPECT_THROW(
      {
        a.narrow(0, 1, 2).mul_(2.0);
        (a * a).sum().backward();
      },
      c10::Error);
}

}  // namespace t_dist_dtensor_aliasing_test
