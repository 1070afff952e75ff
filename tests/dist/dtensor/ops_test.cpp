// Each sharding-rule family, forward and backward, against the same computation on plain
// tensors in this process.
#include "../../common/test_util.h"

#include <hyper_parallel/dtensor/loss_parallel.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>

using namespace hp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_ops_test {
namespace {
const P R{hp::Replicate()};
const P S0{hp::Shard(0)};
const P S1{hp::Shard(1)};
const P S2{hp::Shard(2)};
const P Sm1{hp::Shard(-1)};
const P Part{hp::Partial()};
int64_t ws() { return hp::get_world_size(); }
}  // namespace

TEST(OpsDist, LinearTwoAndThreeDimensionalInputs) {
  const int64_t n = ws();
  at::Tensor w = random({4 * n, 6}, 1), b = random({4 * n}, 2);
  at::Tensor wr = random({5, 2 * n}, 3), br = random({5}, 4);
  for (auto shape : {std::vector<int64_t>{3, 6}, std::vector<int64_t>{2, 3, 6}}) {
    at::Tensor x = random(shape, 5);
    // Colwise: weight and bias Shard(0), input replicated.
    check_same_as_plain("colwise linear", {x, w, b}, {R, S0, S0}, [](const std::vector<at::Tensor>& a) {
      return at::linear(a[0], a[1], a[2]);
    });
    // Rowwise: weight Shard(1), input Shard(-1), bias replicated; output Partial.
    auto xr_shape = shape;
    xr_shape.back() = 2 * n;
    at::Tensor xr = random(xr_shape, 6);
    check_same_as_plain("rowwise linear", {xr, wr, br}, {Sm1, S1, R}, [](const std::vector<at::Tensor>& a) {
      return at::linear(a[0], a[1], a[2]);
    });
    // Sequence-sharded input through a replicated weight.
    check_same_as_plain("replicated linear", {x, w}, {S0, R}, [](const std::vector<at::Tensor>& a) {
      return at::linear(a[0], a[1]);
    });
  }
  // bmm / matmul of batched operands.
  check_same_as_plain("bmm", {random({n, 3, 4}, 7), random({n, 4, 2}, 8)}, {S0, R}, [](const std::vector<at::Tensor>& a) {
    return at::matmul(a[0], a[1]);
  });
  check_same_as_plain("matmul 4d", {random({2, n, 3, 4}, 7), random({2, n, 4, 5}, 8)}, {S1, S1}, [](const std::vector<at::Tensor>& a) {
    return at::matmul(a[0], a[1]);
  });
}

TEST(OpsDist, LinearOutputPlacements) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  auto x = hp::distribute_tensor(random({3, 2 * n}, 1), mesh, Sm1);
  auto w = hp::distribute_tensor(random({4, 2 * n}, 2), mesh, S1);
  hp::CommDebugMode comm;
  hp::DTensor y(at::linear(x, w));
  EXPECT_EQ(y.placements(), Part);
  EXPECT_EQ(comm.get_total_counts(), 0);
  auto wc = hp::distribute_tensor(random({2 * n, 4}, 3), mesh, S0);
  hp::DTensor yc(at::linear(y.redistribute(R), wc));
  EXPECT_EQ(yc.placements(), S1);
  EXPECT_EQ(comm.get_comm_count("all_reduce"), 1);
}

TEST(OpsDist, EmbeddingReplicatedColwiseAndRowwise) {
  const int64_t n = ws();
  at::Tensor table = random({4 * n, 2 * n}, 1);
  at::Tensor ids = at::tensor(std::vector<int64_t>{0, 3, 4 * n - 1, 1, 2, 4 * n - 2}, at::kLong).reshape({2, 3});
  auto f = [](const std::vector<at::Tensor>& a) { return at::embedding(a[0], a[1]); };
  check_same_as_plain("embedding replicated", {table, ids}, {R, R}, f);
  check_same_as_plain("embedding batch-sharded ids", {table, at::arange(2 * n, at::kLong).reshape({n, 2})}, {R, S0}, f);
  check_same_as_plain("embedding colwise", {table, ids}, {S1, R}, f);
  check_same_as_plain("embedding rowwise (masked, exact)", {table, ids}, {S0, R}, f, true, 0, 0);
}

TEST(OpsDist, LayerNormAndRmsNorm) {
  const int64_t n = ws();
  at::Tensor x = random({2, 2 * n, 8}, 1), w = random({8}, 2), b = random({8}, 3);
  auto ln = [](const std::vector<at::Tensor>& a) { return at::layer_norm(a[0], {8}, a[1], a[2], 1e-5); };
  check_same_as_plain("layer_norm sequence-sharded", {x, w, b}, {S1, R, R}, ln);
  check_same_as_plain("layer_norm replicated", {x, w, b}, {R, R, R}, ln);
  check_same_as_plain("layer_norm hidden-sharded (gathers)", {x, w, b}, {S2, R, R}, ln);
  check_same_as_plain("layer_norm no affine", {x}, {S0}, [](const std::vector<at::Tensor>& a) {
    return at::layer_norm(a[0], {8});
  });
  auto rms = [](const std::vector<at::Tensor>& a) {
    at::Tensor var = a[0].pow(2).mean(-1, /*keepdim=*/true);
    return a[0] * at::rsqrt(var + 1e-6) * a[1];
  };
  check_same_as_plain("rms_norm sequence-sharded", {x, w}, {S1, R}, rms);
  check_same_as_plain("rms_norm hidden-sharded", {x, w}, {S2, S0}, rms);
}

TEST(OpsDist, ActivationsAndPointwise) {
  const int64_t n = ws();
  at::Tensor x = random({2 * n, 5}, 1), y = random({2 * n, 5}, 2), row = random({5}, 3);
  using F = std::function<at::Tensor(const at::Tensor&)>;
  const std::pair<const char*, F> unary[] = {
      {"relu", [](const at::Tensor& t) { return at::relu(t); }},
      {"gelu", [](const at::Tensor& t) { return at::gelu(t); }},
      {"gelu tanh", [](const at::Tensor& t) { return at::gelu(t, "tanh"); }},
      {"silu", [](const at::Tensor& t) { return at::silu(t); }},
      {"sigmoid", [](const at::Tensor& t) { return at::sigmoid(t); }},
      {"tanh", [](const at::Tensor& t) { return at::tanh(t); }},
      {"exp/neg/abs", [](const at::Tensor& t) { return at::exp(-t.abs()); }},
      {"scalar ops", [](const at::Tensor& t) { return (t * 2.5 + 1).div(3) - 0.5; }},
      {"pow/sqrt", [](const at::Tensor& t) { return (t.pow(2) + 1).sqrt(); }},
  };
  for (const auto& [name, fn] : unary)
    for (const auto& pl : {S0, S1, R})
      check_same_as_plain(name, {x}, {pl}, [fn = fn](const std::vector<at::Tensor>& a) { return fn(a[0]); });
  auto binary = [](const std::vector<at::Tensor>& a) { return a[0] * a[1] + a[0] / (a[1].abs() + 1) - a[1]; };
  check_same_as_plain("binary same sharding", {x, y}, {S0, S0}, binary);
  check_same_as_plain("binary mixed sharding", {x, y}, {S0, S1}, binary);
  check_same_as_plain("binary shard + replicate", {x, y}, {S1, R}, binary);
  check_same_as_plain("broadcast row", {x, row}, {S0, R}, [](const std::vector<at::Tensor>& a) { return a[0] + a[1]; });
  check_same_as_plain("broadcast sharded row", {x, row}, {R, S0}, [](const std::vector<at::Tensor>& a) { return a[0] * a[1]; });
  check_same_as_plain("partial + partial", {x, y}, {Part, Part}, [](const std::vector<at::Tensor>& a) { return a[0] + a[1]; });
  check_same_as_plain("partial * scalar", {x}, {Part}, [](const std::vector<at::Tensor>& a) { return a[0] * 3 - a[0] / 2; });
  check_same_as_plain("relu(partial) reduces first", {x}, {Part}, [](const std::vector<at::Tensor>& a) { return at::relu(a[0]); });
  check_same_as_plain("where/masked_fill", {x, y}, {S0, S0}, [](const std::vector<at::Tensor>& a) {
    return at::where(a[0] > 0, a[0], a[1]).masked_fill(a[1] < -1, 0.5);
  }, false);
  check_same_as_plain("addcmul/addcdiv/lerp", {x, y}, {S0, S0}, [](const std::vector<at::Tensor>& a) {
    return at::lerp(at::addcdiv(at::addcmul(a[0], a[0], a[1], 0.5), a[0], a[1].abs() + 1, 0.1), a[1], 0.3);
  });
}

TEST(OpsDist, InPlaceOps) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  at::Tensor x = random({2 * n, 3}, 1), y = random({2 * n, 3}, 2);
  auto dx = hp::distribute_tensor(x, mesh, S0), dy = hp::distribute_tensor(y, mesh, R);
  at::Tensor ref = x.clone();
  ref.mul_(2).add_(y, 0.5).addcmul_(y, y, 0.1).clamp_(-1, 1);
  at::Tensor& same = dx.mul_(2).add_(dy, 0.5).addcmul_(dy, dy, 0.1).clamp_(-1, 1);
  EXPECT_EQ(same.unsafeGetTensorImpl(), dx.unsafeGetTensorImpl());
  EXPECT_EQ(dx.placements(), S0);
  EXPECT_TRUE(close(dx, ref));
  // A Partial accumulator stays exact under additive updates with replicated addends.
  auto acc = hp::DTensor::from_local(partial_piece(x, mesh.get_local_rank(), n), mesh, Part);
  acc.add_(dy);
  EXPECT_TRUE(close(acc, x + y));
  // A non-linear in-place op on a Partial tensor keeps its placements and is exact (reduced
  // first, PyTorch refuses it).
  auto r = hp::distribute_tensor(x, mesh, R);
  auto p = hp::DTensor::from_local(partial_piece(y, mesh.get_local_rank(), n), mesh, Part);
  p.relu_();
  EXPECT_EQ(p.placements(), Part);
  EXPECT_TRUE(close(p, y.relu()));
  r.add_(p);  // Partial other is reduced first
  EXPECT_TRUE(close(r, x + y.relu()));
  // The in-place bitwise ops (only .Tensor and .Scalar overloads: torch.testing.assert_close runs
  // them on DTensors), every placement of each side, an uneven dim of 2n + 1.
  const at::Tensor bx = random({2 * n + 1, 3}, 3).gt(0), by = random({2 * n + 1, 3}, 4).gt(0);
  for (const auto& pa : {R, S0, S1})
    for (const auto& pb : {R, S0, S1}) {
      const auto run = [&](at::Tensor a, const at::Tensor& b) {
        return std::vector<at::Tensor>{a.clone().bitwise_and_(b), a.clone().bitwise_or_(b), a.clone().bitwise_xor_(b)};
      };
      const auto ours = run(hp::distribute_tensor(bx, mesh, pa), hp::distribute_tensor(by, mesh, pb));
      const auto ref = run(bx, by);
      for (size_t k = 0; k < ours.size(); ++k) {
        EXPECT_EQ(hp::DTensor(ours[k]).placements(), pa) << k;
        EXPECT_TRUE(at::equal(hp::DTensor(ours[k]).full_tensor(), ref[k])) << k << " " << hp::to_string(pa) << hp::to_string(pb);
      }
    }
}

TEST(OpsDist, Reductions) {
  const int64_t n = ws();
  at::Tensor x = random({2 * n, 3, 4}, 1);
  for (const auto& pl : {S0, S1, R, Part}) {
    const std::string s = hp::to_string(pl);
    check_same_as_plain("sum " + s, {x}, {pl}, [](const std::vector<at::Tensor>& a) { return a[0].sum(); });
    check_same_as_plain("sum dim0 " + s, {x}, {pl}, [](const std::vector<at::Tensor>& a) { return a[0].sum(0); });
    check_same_as_plain("sum dims keepdim " + s, {x}, {pl}, [](const std::vector<at::Tensor>& a) { return a[0].sum(at::IntArrayRef{0, 2}, true); });
    check_same_as_plain("mean " + s, {x}, {pl}, [](const std::vector<at::Tensor>& a) { return a[0].mean(); });
    check_same_as_plain("mean dim -1 " + s, {x}, {pl}, [](const std::vector<at::Tensor>& a) { return a[0].mean(-1); });
    check_same_as_plain("amax " + s, {x}, {pl}, [](const std::vector<at::Tensor>& a) { return at::amax(a[0], {0}); });
  }
  // Over a sharded dim the result is Partial until someone needs it.
  auto mesh = world_mesh();
  hp::DTensor d(hp::distribute_tensor(x, mesh, S0).sum(0));
  EXPECT_EQ(d.placements(), Part);
  hp::DTensor m(at::amax(hp::distribute_tensor(x, mesh, S0), {0}));
  EXPECT_EQ(m.placements(), P{hp::Partial(hp::ReduceOp::MAX)});
  // Uneven mean over the sharded dim is still exact.
  check_same_as_plain("uneven mean", {random({2 * n + 1, 3}, 4)}, {S0}, [](const std::vector<at::Tensor>& a) { return a[0].mean(0); });
}

TEST(OpsDist, SoftmaxAndLosses) {
  const int64_t n = ws();
  at::Tensor x = random({2 * n, 3, 5}, 1);
  for (const auto& pl : {S0, S1, S2, R, Part}) {
    check_same_as_plain("softmax " + hp::to_string(pl), {x}, {pl}, [](const std::vector<at::Tensor>& a) { return at::softmax(a[0], -1); });
    check_same_as_plain("log_softmax " + hp::to_string(pl), {x}, {pl}, [](const std::vector<at::Tensor>& a) { return at::log_softmax(a[0], 1); });
  }
  at::Tensor logits = random({2 * n, 7}, 2);
  at::Tensor target = at::arange(2 * n, at::kLong).remainder(7);
  for (const auto& pl : {R, S0, S1})
    check_same_as_plain("cross_entropy " + hp::to_string(pl), {logits, target}, {pl, R}, [](const std::vector<at::Tensor>& a) {
      return at::cross_entropy_loss(a[0], a[1]);
    });
  // Class weights and an ignored target, every reduction: nll_loss on [N, C] and nll_loss2d on
  // [N, C, L] (7 classes: uneven over the ranks; L = 3 leaves a rank empty at 4 ranks), each
  // placement, and the classes sharded under loss_parallel (its fused backward).
  auto mesh = world_mesh();
  const at::Tensor weight = values({7}, 5) + 1;
  at::Tensor ignored = target.clone();
  ignored[1] = -100;
  at::Tensor logits3 = random({2 * n, 7, 3}, 6);
  at::Tensor target3 = at::arange(6 * n, at::kLong).remainder(7).view({2 * n, 3});
  target3[0][1] = -100;
  for (int64_t reduction : {at::Reduction::None, at::Reduction::Sum, at::Reduction::Mean}) {
    const auto loss = [&, reduction](const std::vector<at::Tensor>& a) {
      const at::Tensor w = hp::is_dtensor(a[0]) ? hp::distribute_tensor(weight, mesh, R) : weight;
      return at::cross_entropy_loss(a[0], a[1], w, reduction);
    };
    const std::string r = " reduction " + std::to_string(reduction);
    for (const auto& pl : {R, S0, S1, Part}) check_same_as_plain("weighted cross_entropy " + hp::to_string(pl) + r, {logits, ignored}, {pl, R}, loss);
    for (const auto& pl : {R, S0, S1, S2}) check_same_as_plain("weighted 3-d cross_entropy " + hp::to_string(pl) + r, {logits3, target3}, {pl, R}, loss);
    hp::LossParallelGuard guard;
    check_same_as_plain("loss_parallel cross_entropy" + r, {logits, ignored}, {S1, R}, loss);
    check_same_as_plain("loss_parallel 3-d cross_entropy" + r, {logits3, target3}, {S1, R}, loss);
  }
}

TEST(OpsDist, ViewOps) {
  const int64_t n = ws();
  at::Tensor x = random({2 * n, 3, 4}, 1);
  using F = std::function<at::Tensor(const at::Tensor&)>;
  const std::pair<const char*, F> views[] = {
      {"view merge", [](const at::Tensor& t) { return t.view({t.size(0) * 3, 4}); }},
      {"view split", [](const at::Tensor& t) { return t.view({t.size(0), 3, 2, 2}); }},
      {"reshape -1", [](const at::Tensor& t) { return t.reshape({-1, 12}); }},
      {"flatten all", [](const at::Tensor& t) { return t.reshape({-1}); }},
      {"transpose", [](const at::Tensor& t) { return t.transpose(0, 2); }},
      {"transpose+contiguous+view", [](const at::Tensor& t) { return t.transpose(1, 2).contiguous().view({-1, 3}); }},
      {"permute", [](const at::Tensor& t) { return t.permute({2, 0, 1}); }},
      {"t", [](const at::Tensor& t) { return t.select(2, 1).t(); }},
      {"unsqueeze/squeeze", [](const at::Tensor& t) { return t.unsqueeze(1).unsqueeze(-1).squeeze(1).squeeze(); }},
      {"expand", [](const at::Tensor& t) { return t.unsqueeze(0).expand({2, -1, -1, -1}); }},
      {"slice", [](const at::Tensor& t) { return t.narrow(2, 1, 2); }},
      {"slice sharded dim", [](const at::Tensor& t) { return t.narrow(0, 1, 2); }},
      {"select", [](const at::Tensor& t) { return t.select(1, 2); }},
      {"split/chunk/cat", [](const at::Tensor& t) { auto c = t.chunk(2, 2); return at::cat({c[1], c[0]}, 2); }},
      {"split sharded dim", [](const at::Tensor& t) { auto c = t.split(1, 0); std::reverse(c.begin(), c.end()); return at::cat(c, 1); }},
      {"stack", [](const at::Tensor& t) { return at::stack({t, t * 2}, 1); }},
      {"clone/detach/alias", [](const at::Tensor& t) { return t.clone() + t.detach() * t.alias(); }},
  };
  for (const auto& [name, fn] : views)
    for (const auto& pl : {S0, S1, S2, R})
      check_same_as_plain(std::string(name) + " " + hp::to_string(pl), {x}, {pl},
                          [fn = fn](const std::vector<at::Tensor>& a) { return fn(a[0]); });
  // Uneven shards through views that keep the sharded dim whole.
  check_same_as_plain("uneven transpose", {random({2 * n + 1, 3}, 2)}, {S0}, [](const std::vector<at::Tensor>& a) {
    return a[0].t().unsqueeze(0) * 2;
  });
}

TEST(OpsDist, FactoriesCopyAndConversions) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  at::Tensor x = random({2 * n, 3}, 1);
  auto d = hp::distribute_tensor(x, mesh, S0);
  for (auto t : {at::zeros_like(d), at::ones_like(d), at::full_like(d, 2.5), at::empty_like(d)}) {
    ASSERT_TRUE(hp::is_dtensor(t));
    EXPECT_EQ(hp::DTensor(t).placements(), S0);
    EXPECT_EQ(t.sizes(), x.sizes());
  }
  EXPECT_TRUE(close(at::full_like(d, 2.5), at::full_like(x, 2.5)));
  hp::DTensor nz(d.new_zeros({4, 5}));
  EXPECT_EQ(nz.placements(), R);
  EXPECT_TRUE(close(nz, at::zeros({4, 5})));
  hp::DTensor same(d.new_ones(x.sizes()));
  EXPECT_EQ(same.placements(), S0);
  EXPECT_TRUE(close(same, at::ones_like(x)));
  // Uninitialised values keep a Partial layout (AccumulateGrad's new_empty_strided(...).copy_ of a
  // Partial gradient then stays Partial); values that are defined reduce it first.
  auto partial = hp::DTensor::from_local(partial_piece(x, mesh.get_local_rank(), n), mesh, Part);
  EXPECT_EQ(hp::DTensor(partial.new_empty(x.sizes())).placements(), Part);
  hp::DTensor buffer(partial.new_empty_strided(x.sizes(), x.strides()));
  EXPECT_EQ(buffer.placements(), Part);
  buffer.copy_(partial);
  EXPECT_EQ(buffer.placements(), Part);
  EXPECT_TRUE(close(buffer, x));
  EXPECT_EQ(hp::DTensor(partial.new_zeros(x.sizes())).placements(), R);
  hp::DTensor ones(partial.new_ones(x.sizes()));
  EXPECT_EQ(ones.placements(), R);
  EXPECT_TRUE(close(ones, at::ones_like(x)));
  // copy_ redistributes the source into self's layout.
  auto dst = hp::distribute_tensor(at::zeros_like(x), mesh, S0);
  dst.copy_(hp::distribute_tensor(x, mesh, R));
  EXPECT_TRUE(close(dst, x));
  dst.zero_();
  EXPECT_TRUE(close(dst, at::zeros_like(x)));
  dst.fill_(1.5);
  EXPECT_TRUE(close(dst, at::full_like(x, 1.5)));
  hp::DTensor half(d.to(at::kBFloat16));
  EXPECT_EQ(half.scalar_type(), at::kBFloat16);
  EXPECT_EQ(half.placements(), S0);
  EXPECT_TRUE(close(half, x.to(at::kBFloat16), 1e-2, 1e-2));
  check_same_as_plain("to(double) and back", {x}, {S1}, [](const std::vector<at::Tensor>& a) {
    return a[0].to(at::kDouble).mul(2).to(at::kFloat);
  });
  check_same_as_plain("triu/cumsum", {random({n * 2, n * 2}, 3)}, {S0}, [](const std::vector<at::Tensor>& a) {
    return at::triu(a[0]).cumsum(0);
  });
  // Leaving DTensor land: item, equal, allclose on replicated (or any) values.
  auto s = hp::distribute_tensor(x, mesh, S0).sum();
  EXPECT_NEAR(s.item<float>(), x.sum().item<float>(), 1e-4);
  EXPECT_TRUE(at::equal(d, hp::distribute_tensor(x, mesh, R)));
  EXPECT_TRUE(at::allclose(d, hp::distribute_tensor(x + 1e-9, mesh, R)));
  EXPECT_FALSE(at::equal(d, hp::distribute_tensor(x + 1, mesh, R)));
}

TEST(OpsDist, DropoutIsExactAtZeroAndAgreesOnReplicatedInputs) {
  auto mesh = world_mesh();
  // One key on every rank: seeded alike (a process's torch generator starts from a seed of its own).
  hp_test::manual_seed(5);
  const int64_t n = ws();
  at::Tensor x = random({2 * n, 16}, 1);
  check_same_as_plain("dropout p=0", {x}, {S0}, [](const std::vector<at::Tensor>& a) { return at::dropout(a[0], 0.0, true); });
  check_same_as_plain("native_dropout p=0", {x}, {S0}, [](const std::vector<at::Tensor>& a) {
    return std::get<0>(at::native_dropout(a[0], 0.0, true));
  });
  for (bool native : {false, true}) {
    auto d = hp::distribute_tensor(x, mesh, R);
    hp::DTensor y(native ? std::get<0>(at::native_dropout(d, 0.5, true)) : at::dropout(d, 0.5, true));
    EXPECT_EQ(y.placements(), R);
    // Every rank drew the same mask: the local results agree.
    at::Tensor mine = y.to_local().unsqueeze(0);
    at::Tensor all = hp::all_gather(mine, 0, mesh.get_group());
    for (int64_t r = 1; r < n; ++r) EXPECT_TRUE(at::equal(all[r], all[0]));
    const double kept = (y.to_local() != 0).to(at::kFloat).mean().item<double>();
    EXPECT_GT(kept, 0.2);
    EXPECT_LT(kept, 0.8);
  }
}

TEST(OpsDist, OptimizerStepsOnDTensorParameters) {
  // Covered with torch::optim in optimizer_test.cpp; here the raw arithmetic of an Adam step.
  auto mesh = world_mesh();
  const int64_t n = ws();
  at::Tensor p = random({2 * n, 3}, 1), g = random({2 * n, 3}, 2);
  auto dp = hp::distribute_tensor(p, mesh, S0), dg = hp::distribute_tensor(g, mesh, S0);
  auto m = at::zeros_like(dp), v = at::zeros_like(dp);
  at::Tensor rm = at::zeros_like(p), rv = at::zeros_like(p), rp = p.clone();
  for (int step = 1; step <= 3; ++step) {
    for (auto* t : {&m, &rm}) t->mul_(0.9).add_(t == &m ? dg : g, 0.1);
    v.mul_(0.999).addcmul_(dg, dg, 0.001);
    rv.mul_(0.999).addcmul_(g, g, 0.001);
    dp.addcdiv_(m, v.sqrt().add_(1e-8), -0.01);
    rp.addcdiv_(rm, rv.sqrt().add_(1e-8), -0.01);
  }
  EXPECT_TRUE(close(dp, rp));
}

TEST(OpsDist, ErrorsNameTheOpAndPlacements) {
  auto mesh = world_mesh();
  auto d = hp::distribute_tensor(random({2 * ws(), 3}, 1), mesh, S0);
  try {
    d + at::ones({2 * ws(), 3});
    FAIL() << "plain + DTensor accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("aten::add.Tensor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("plain tensor"), std::string::npos);
  }
  // 0-dim tensors are scalars; an ImplicitReplicationGuard treats plain tensors as replicated.
  EXPECT_TRUE(close(d * at::scalar_tensor(2.0), hp::DTensor(d).full_tensor() * 2));
  {
    hp::ImplicitReplicationGuard implicit;
    EXPECT_TRUE(close(d + at::ones({3}), hp::DTensor(d).full_tensor() + 1));
  }
  try {
    at::cholesky_inverse(d);  // (at::cholesky is gone from torch 2.15)
    FAIL() << "an op without a rule ran";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no sharding rule"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("S(0)"), std::string::npos) << e.what();
  }
}

TEST(OpsDist, VocabParallelCrossEntropyNeverGathersTheLogits) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  at::Tensor logits = random({6, 5 * n}, 1);
  at::Tensor target = at::tensor(std::vector<int64_t>{0, 5 * n - 1, 3, -100, 2 * n, 1}, at::kLong);
  for (int64_t reduction : {at::Reduction::Mean, at::Reduction::Sum, at::Reduction::None}) {
    at::Tensor ref_in = logits.clone().requires_grad_(true);
    at::Tensor ref = at::cross_entropy_loss(ref_in, target, {}, reduction);
    auto d = hp::distribute_tensor(logits, mesh, S1);
    d.set_requires_grad(true);
    auto t = hp::distribute_tensor(target, mesh, R);
    hp::CommDebugMode fwd;
    hp::DTensor loss(at::cross_entropy_loss(d, t, {}, reduction));
    // log_softmax's max and sum, then the loss of the targets each rank scored in its range
    // (PyTorch's loss_parallel reduces it in forward too): never the logits.
    EXPECT_EQ(fwd.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 3}})) << fwd.summary();
    EXPECT_EQ(loss.placements(), P{hp::Replicate()});
    ASSERT_TRUE(close(loss, ref)) << reduction;
    at::Tensor w = values(ref.sizes(), 2) + 1;
    (ref * w).sum().backward();
    at::Tensor total = (loss.full_tensor() * w).sum();
    hp::CommDebugMode bwd;
    total.backward();
    EXPECT_EQ(bwd.get_comm_count("all_gather"), 0) << bwd.summary();
    EXPECT_TRUE(close(d.grad(), ref_in.grad())) << reduction;
    EXPECT_EQ(hp::DTensor(d.grad()).placements(), S1);
  }
}

}  // namespace t_dist_dtensor_ops_test
