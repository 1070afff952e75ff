// Repros of DTensor results that were silently wrong off the models' paths (scalars on Partial
// values, casts, in-place writes through views, empty local pieces, non-contiguous locals, mesh
// dims of size 1). Each compares with plain tensors in this process, or expects the error that
// every rank raises.
#include "../../common/test_util.h"

#include <hyper_parallel/runtime/comm_debug_mode.h>

using namespace hp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_off_path_test {
namespace {
const P R{hp::Replicate()};
const P S0{hp::Shard(0)};
const P Part{hp::Partial()};
int64_t ws() { return hp::get_world_size(); }

// A Partial(sum) DTensor of `full` whose addends are not integers (so truncation shows).
hp::DTensor partial_of(const at::Tensor& full, const hp::DeviceMesh& mesh) {
  const auto& g = mesh.get_group(0);
  at::Tensor piece = g.rank() == 0 ? full - 0.375 * (g.size() - 1) : at::full_like(full, 0.375);
  return hp::DTensor::from_local(piece, mesh, Part);
}
}  // namespace

// Item 1: a scalar operand of an additive op is added once, not once per rank.
TEST(OffPathDist, PartialPlusScalarIsAddedOnce) {
  auto mesh = world_mesh();
  at::Tensor full = values({3, 4});
  auto x = [&] { return partial_of(full, mesh); };
  EXPECT_TRUE(close(x() + 2.5, full + 2.5));
  EXPECT_TRUE(close(x() - 2.5, full - 2.5));
  EXPECT_TRUE(close(2.5 - x(), 2.5 - full));
  EXPECT_TRUE(close(x() + at::scalar_tensor(2.5), full + 2.5));
  EXPECT_TRUE(close(at::scalar_tensor(2.5) + x(), full + 2.5));
  EXPECT_TRUE(close(at::add(x(), 2.5, /*alpha=*/3), full + 7.5));
  EXPECT_TRUE(close(at::sub(x(), at::scalar_tensor(1.0), 2), full - 2.0));
  {
    auto y = x();
    y.add_(2.5);
    EXPECT_TRUE(close(y, full + 2.5));
    y.sub_(at::scalar_tensor(1.0));
    EXPECT_TRUE(close(y, full + 1.5));
  }
  {
    // copy_ of a scalar into a Partial tensor: the value once.
    auto y = x();
    y.copy_(at::scalar_tensor(4.0));
    EXPECT_TRUE(close(y, at::full_like(full, 4.0)));
  }
  // Multiplicative and numerator-linear ops keep the Partial exact.
  EXPECT_TRUE(close(x() * 3.0, full * 3.0));
  EXPECT_TRUE(close(x() / 4.0, full / 4.0));
  EXPECT_EQ(hp::DTensor(x() * 3.0).placements(), Part);
  // div with a rounding mode is not linear: reduced first.
  EXPECT_TRUE(close(at::div(x(), 0.5, "floor"), at::div(full, 0.5, "floor")));
}

// Item 1 through autograd: pow's backward computes exponent - 1 on a Partial exponent.
TEST(OffPathDist, PowWithPartialExponentHasTheRightGradient) {
  auto mesh = world_mesh();
  at::Tensor base = values({2, 3}).abs() + 1.0, e = values({2, 3}, 4);
  at::Tensor pb = base.clone().requires_grad_(true);
  at::pow(pb, e).sum().backward();
  auto db = hp::distribute_tensor(base, mesh, R, c10::nullopt);
  db.set_requires_grad(true);
  auto de = partial_of(e, mesh);
  at::Tensor y = at::pow(db, de);
  EXPECT_TRUE(close(y, at::pow(base, e)));
  y.sum().backward();
  EXPECT_TRUE(close(db.grad(), pb.grad()));
}

// Item 2: casts that do not commute with the sum reduce first; float-to-float stays Partial.
TEST(OffPathDist, PartialCastsToIntegersReduceFirst) {
  auto mesh = world_mesh();
  at::Tensor full = values({3, 4}) * 4 + 0.5;
  auto x = partial_of(full, mesh);
  EXPECT_TRUE(close(x.to(at::kLong), full.to(at::kLong)));
  EXPECT_TRUE(close(x.to(at::kBool), full.to(at::kBool)));
  EXPECT_TRUE(close(x.to(at::kInt), full.to(at::kInt)));
  hp::DTensor d(x.to(at::kDouble));
  EXPECT_EQ(d.placements(), Part);  // float -> float: its rounding is of the reduction's order
  EXPECT_TRUE(close(d, full.to(at::kDouble)));
  // copy_ of a Partial float into a Partial integer tensor would truncate each addend.
  auto ints = hp::DTensor::from_local(at::zeros({3, 4}, at::kLong), mesh, Part);
  EXPECT_THROW(ints.copy_(x), c10::ValueError);
}

// Item 3: an in-place write into a view that needed communication is refused on every rank,
// and the base is unchanged; views that are real local views write through.
TEST(OffPathDist, InPlaceThroughViewsOfShardedDTensors) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  at::Tensor full = values({2 * n, 3});
  auto x = hp::distribute_tensor(full, mesh, S0);
  EXPECT_THROW(x.narrow(0, 1, 2).mul_(2), c10::NotImplementedError);
  EXPECT_THROW(x[0].zero_(), c10::NotImplementedError);
  EXPECT_THROW(x.select(0, 1).fill_(1.0), c10::NotImplementedError);
  EXPECT_THROW(x.slice(0, 0, 2 * n, 2).mul_(2), c10::NotImplementedError);
  EXPECT_THROW(x.chunk(2, 0)[1].add_(1.0), c10::NotImplementedError);
  EXPECT_THROW(x.split(1, 0)[0].sub_(1.0), c10::NotImplementedError);
  EXPECT_THROW(x.narrow(0, 1, 2).copy_(hp::distribute_tensor(at::ones({2, 3}), mesh, R)), c10::NotImplementedError);
  EXPECT_THROW(x.narrow(0, 1, 2).view({6}).mul_(2), c10::NotImplementedError);  // a view of a copy
  EXPECT_TRUE(close(x, full));  // nothing was written anywhere
  // Views along dims that are not sharded are views of the local shard: the write reaches x.
  at::Tensor ref = full.clone();
  x.select(1, 2).mul_(3);
  ref.select(1, 2).mul_(3);
  x.narrow(1, 0, 2).add_(1.0);
  ref.narrow(1, 0, 2).add_(1.0);
  x.t()[1].zero_();
  ref.t()[1].zero_();
  EXPECT_TRUE(close(x, ref));
  // A view that needs communication is a copy (as in PyTorch): it cannot follow later writes, so
  // reading it after one raises (tests/dist/dtensor/stale_view_test.cpp).
  auto v = x.narrow(0, 1, 2);
  EXPECT_TRUE(close(v, ref.narrow(0, 1, 2)));
  x.mul_(2);
  if (n > 1) EXPECT_THROW(hp::DTensor(v).full_tensor(), c10::Error);
}

// Item 4: gradients through an in-place op on a view of a Replicate or Partial DTensor.
TEST(OffPathDist, GradientThroughInPlaceOnAViewMatchesPlain) {
  auto mesh = world_mesh();
  at::Tensor w0 = values({4, 3}), W = values({4, 3}, 5);
  at::Tensor pw = w0.clone().requires_grad_(true);
  {
    at::Tensor y = pw * 1;
    y.narrow(0, 1, 2).mul_(2);
    y.select(1, 2).add_(y.select(1, 0));
    (y * W).sum().backward();
  }
  for (const P& pl : {R, Part}) {
    hp::DTensor w = pl[0].is_partial() ? partial_of(w0, mesh) : hp::distribute_tensor(w0, mesh, R, c10::nullopt);
    w = hp::DTensor(w.detach());
    w.set_requires_grad(true);
    at::Tensor y = w * 1;
    y.narrow(0, 1, 2).mul_(2);
    y.select(1, 2).add_(y.select(1, 0));
    auto dW = hp::distribute_tensor(W, mesh, R, c10::nullopt);
    EXPECT_TRUE(close(y, [&] { at::Tensor r = w0 * 1; r.narrow(0, 1, 2).mul_(2); r.select(1, 2).add_(r.select(1, 0)); return r; }()));
    (y * dW).sum().backward();
    ASSERT_TRUE(w.grad().defined());
    EXPECT_TRUE(close(w.grad(), pw.grad())) << hp::to_string(pl);
  }
  // On a sharded DTensor autograd replays the view on the shard: right, or refused; never wrong.
  at::Tensor s0 = values({2 * ws(), 3});
  at::Tensor ps = s0.clone().requires_grad_(true);
  {
    at::Tensor y = ps * 1;
    y.select(1, 0).mul_(2);
    (y * W.narrow(0, 0, 1)).sum().backward();
  }
  auto ds = hp::distribute_tensor(s0, mesh, S0);
  ds.set_requires_grad(true);
  at::Tensor y = ds * 1;
  y.select(1, 0).mul_(2);  // a real local view: the forward is right
  EXPECT_TRUE(close(y, [&] { at::Tensor r = s0.clone(); r.select(1, 0).mul_(2); return r; }()));
  bool refused = false;
  try {
    (y * hp::distribute_tensor(W.narrow(0, 0, 1), mesh, R)).sum().backward();
  } catch (const c10::NotImplementedError&) {
    refused = true;
  }
  if (!refused) EXPECT_TRUE(close(ds.grad(), ps.grad()));
}

// Item 5: empty local pieces behave identically on every rank.
TEST(OffPathDist, EmptyLocalPieces) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  // n + 1 rows over n ranks... and fewer rows than ranks: trailing ranks hold nothing.
  for (int64_t rows : {int64_t{1}, n - 1, n + 1}) {
    if (rows <= 0) continue;
    at::Tensor full = values({rows, 3}, rows);
    auto x = hp::distribute_tensor(full, mesh, S0);
    EXPECT_TRUE(close(at::amax(x, {0}), at::amax(full, {0}))) << rows;
    EXPECT_TRUE(close(at::amin(x, {0}, true), at::amin(full, {0}, true))) << rows;
    EXPECT_TRUE(close(x.sum(0), full.sum(0))) << rows;
    EXPECT_TRUE(close(x * 2 + 1, full * 2 + 1)) << rows;
    EXPECT_TRUE(close(x.redistribute({hp::Shard(1)}), full)) << rows;
    auto xi = hp::distribute_tensor(full.to(at::kInt), mesh, S0);
    EXPECT_TRUE(close(at::amax(xi, {0}), at::amax(full.to(at::kInt), {0}))) << rows;
  }
  // A tensor with no elements at all.
  at::Tensor empty = at::zeros({0, 3});
  auto e = hp::distribute_tensor(empty, mesh, S0);
  EXPECT_EQ(hp::DTensor(e).full_tensor().sizes(), empty.sizes());
  auto e1 = hp::distribute_tensor(at::zeros({4, 0}), mesh, S0);
  EXPECT_EQ(hp::DTensor(e1).full_tensor().sizes(), (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(hp::DTensor(e1.redistribute({hp::Shard(1)})).full_tensor().sizes(), (std::vector<int64_t>{4, 0}));
}

// Item 5 on a 2x2 mesh: a whole group of ranks holds empty pieces.
TEST(OffPath2x2Dist, WholeGroupOfEmptyPieces) {
  ASSERT_EQ(ws(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  at::Tensor t = values({1, 3});
  auto x = hp::distribute_tensor(t, mesh, {hp::Shard(0), hp::Shard(1)});
  EXPECT_TRUE(close(x, t));
  EXPECT_TRUE(close(x.redistribute({hp::Replicate(), hp::Shard(1)}), t));
  EXPECT_TRUE(close(at::amax(x, {0}), at::amax(t, {0})));
}

// Item 6: heads-sharded attention shapes: the gathered local is not contiguous.
TEST(OffPathDist, ViewsOfNonContiguousGatheredLocals) {
  auto mesh = world_mesh();
  at::Tensor full = random({8, 8, 16}, 3);
  auto x = hp::distribute_tensor(full, mesh, {hp::Shard(2)});
  auto f = [](const at::Tensor& t) { return t.view({8, 8, 4, 4}).transpose(1, 2).reshape({32, 8, 4}); };
  EXPECT_TRUE(close(f(x), f(full)));
  at::Tensor w = random({4, 5}, 4);
  EXPECT_TRUE(close(at::matmul(f(x), hp::distribute_tensor(w, mesh, R)), at::matmul(f(full), w)));
}

// Item 7: PyTorch's test_one_chunk_mesh: a mesh dim of size 1 never communicates.
TEST(OffPathDist, MeshDimOfSizeOneNeverCommunicates) {
  auto mesh = hp::init_device_mesh("cpu", {ws(), 1}, {"dp", "tp"});
  at::Tensor full = values({4, 6});
  auto x = hp::distribute_tensor(full, mesh, {hp::Replicate(), hp::Shard(0)});
  hp::CommDebugMode comm;
  auto y = x.redistribute({hp::Replicate(), hp::Replicate()});
  auto z = y.redistribute({hp::Replicate(), hp::Shard(1)});
  auto p = hp::DTensor::from_local(full, mesh, {hp::Replicate(), hp::Partial()});
  auto q = p.redistribute({hp::Replicate(), hp::Replicate()});
  EXPECT_EQ(comm.get_total_counts(), 0) << comm.summary();
  EXPECT_TRUE(close(y, full));
  EXPECT_TRUE(close(z, full));
  EXPECT_TRUE(close(q, full));
}

// The ops libtorch registers as CompositeExplicitAutograd for every backend key (clone, add,
// ones_like, expand, _to_copy, new_empty_strided) reach our key and not those kernels: each result
// is a DTensor with the placements the op's rule gives and the values plain tensors give. A key
// for which such kernels won would return plain tensors here (the reason the DTensor borrows a
// functionality key rather than a backend key).
TEST(OffPathDist, CompositeExplicitOpsReturnDTensors) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  const at::Tensor full = values({4 * n, 3});
  for (const P& pl : {S0, R}) {
    SCOPED_TRACE(hp::to_string(pl));
    const hp::DTensor x = hp::distribute_tensor(full, mesh, pl);
    auto check = [&](const std::string& op, const at::Tensor& out, const P& placements, const at::Tensor& expected) {
      ASSERT_TRUE(hp::is_dtensor(out)) << op << " returned a plain tensor";
      EXPECT_EQ(hp::DTensor(out).placements(), placements) << op;
      EXPECT_EQ(out.sizes(), expected.sizes()) << op;
      EXPECT_EQ(out.scalar_type(), expected.scalar_type()) << op;
      EXPECT_TRUE(at::equal(hp::DTensor(out).full_tensor(), expected)) << op;
    };
    check("clone", x.clone(), pl, full);
    check("add", at::add(x, x), pl, full + full);
    check("ones_like", at::ones_like(x), pl, at::ones_like(full));
    const P expanded = pl == S0 ? P{hp::Shard(1)} : R;
    check("expand", x.expand({2, 4 * n, 3}), expanded, full.expand({2, 4 * n, 3}));
    check("_to_copy", x.to(at::kDouble), pl, full.to(at::kDouble));
    // new_empty_strided's values are uninitialised: its spec and geometry are what it fixes.
    const at::Tensor e = x.new_empty_strided({4 * n, 3}, {3, 1});
    ASSERT_TRUE(hp::is_dtensor(e)) << "new_empty_strided returned a plain tensor";
    EXPECT_EQ(hp::DTensor(e).placements(), pl);
    EXPECT_EQ(e.sizes(), full.sizes());
    EXPECT_EQ(e.strides(), full.strides());
    EXPECT_EQ(hp::DTensor(e).to_local().sizes(), x.to_local().sizes());
  }
}

// c10::InferenceMode: composite ops (linear, ...) reach DTensors undecomposed there; they run and
// match plain tensors.
TEST(OffPathDist, InferenceModeRunsCompositeOps) {
  auto mesh = world_mesh();
  const int64_t n = ws();
  at::Tensor w1 = random({4 * n, 6}, 1), b1 = random({4 * n}, 2), w2 = random({5, 4 * n}, 3), x = random({3, 6}, 4);
  auto dw1 = hp::distribute_tensor(w1, mesh, S0), db1 = hp::distribute_tensor(b1, mesh, S0);
  auto dw2 = hp::distribute_tensor(w2, mesh, {hp::Shard(1)});
  auto dx = hp::distribute_tensor(x, mesh, R);
  c10::InferenceMode guard;
  at::Tensor y = at::linear(at::gelu(at::linear(dx, dw1, db1)), dw2);
  EXPECT_TRUE(close(y, at::linear(at::gelu(at::linear(x, w1, b1)), w2)));
  EXPECT_TRUE(close(at::matmul(dx, dw1.t()).softmax(-1), at::matmul(x, w1.t()).softmax(-1)));
}

// Scaled dot-product attention on heads-sharded q/k/v: local per rank, no collective, forward and
// backward equal to plain tensors (causal and with an explicit mask).
TEST(OffPathDist, ScaledDotProductAttentionOnShardedHeads) {
  auto mesh = world_mesh();
  const int64_t h = 2 * ws();
  at::Tensor q = random({2, h, 5, 8}, 3), k = random({2, h, 5, 8}, 4), v = random({2, h, 5, 8}, 5);
  at::Tensor mask = at::ones({5, 5}, at::kBool).tril();
  for (bool causal : {true, false}) {
    std::vector<at::Tensor> plain{q.clone().requires_grad_(true), k.clone().requires_grad_(true), v.clone().requires_grad_(true)};
    std::vector<at::Tensor> dist;
    for (const auto& t : {q, k, v}) {
      auto d = hp::distribute_tensor(t, mesh, {hp::Shard(1)});
      d.set_requires_grad(true);
      dist.push_back(d);
    }
    const c10::optional<at::Tensor> m = causal ? c10::nullopt : c10::optional<at::Tensor>(mask);
    at::Tensor ref = at::scaled_dot_product_attention(plain[0], plain[1], plain[2], m, 0.0, causal);
    hp::CommDebugMode comm;
    at::Tensor out = at::scaled_dot_product_attention(dist[0], dist[1], dist[2], m, 0.0, causal);
    EXPECT_EQ(comm.get_total_counts(), 0) << comm.summary();
    EXPECT_EQ(hp::DTensor(out).placements(), (P{hp::Shard(1)}));
    EXPECT_TRUE(close(out, ref));
    at::Tensor w = values(ref.sizes(), 2);
    (ref * w).sum().backward();
    (out * hp::distribute_tensor(w, mesh, {hp::Shard(1)})).sum().backward();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(close(dist[static_cast<size_t>(i)].grad(), plain[static_cast<size_t>(i)].grad())) << i;
  }
}

// Vector products with every placement of the operands: matmul with a 1-D operand (it
// decomposes into squeeze_ of a product), dot, mv and outer, forward and gradients.
TEST(OffPathDist, VectorProductsMatchPlain) {
  const int64_t n = 5;  // uneven (and empty pieces on 4 ranks... not for 5 > 4)
  const std::vector<P> pls{S0, R, Part};
  for (const P& pa : pls)
    for (const P& pb : pls) {
      const std::string tag = hp::to_string(pa) + " x " + hp::to_string(pb);
      check_same_as_plain("dot " + tag, {values({n}), values({n}, 3)}, {pa, pb},
                          [](const std::vector<at::Tensor>& a) { return at::dot(a[0], a[1]); });
      check_same_as_plain("matmul 1-D @ 1-D " + tag, {values({n}), values({n}, 3)}, {pa, pb},
                          [](const std::vector<at::Tensor>& a) { return at::matmul(a[0], a[1]); });
      check_same_as_plain("matmul 1-D @ 2-D " + tag, {values({n}), values({n, 3}, 3)}, {pa, pb},
                          [](const std::vector<at::Tensor>& a) { return at::matmul(a[0], a[1]); });
      check_same_as_plain("matmul 2-D @ 1-D " + tag, {values({3, n}), values({n}, 3)}, {pa, pb},
                          [](const std::vector<at::Tensor>& a) { return at::matmul(a[0], a[1]); });
      check_same_as_plain("mv " + tag, {values({n, 3}), values({3}, 3)}, {pa, pb},
                          [](const std::vector<at::Tensor>& a) { return at::mv(a[0], a[1]); });
      check_same_as_plain("outer " + tag, {values({n}), values({3}, 3)}, {pa, pb},
                          [](const std::vector<at::Tensor>& a) { return at::outer(a[0], a[1]); });
    }
}

// In-place ops on Partial(avg/max/min/sum) tensors keep the placement and give the exact value:
// without communication where the math allows (linear ops on sum/avg, adding, filling or copying
// a replicated value on avg/max), reduced first otherwise (relu_ on a sum, mul_ by a negative
// number on a max). Views of the tensor see the new values too.
TEST(OffPathDist, InPlaceOnPartialIsExact) {
  auto mesh = world_mesh();
  const auto& g = mesh.get_group(0);
  at::Tensor full = values({3, 4});
  auto partial = [&](hp::ReduceOp op) {
    at::Tensor piece;
    switch (op) {
      case hp::ReduceOp::SUM: piece = g.rank() == 0 ? full - 0.375 * (g.size() - 1) : at::full_like(full, 0.375); break;
      case hp::ReduceOp::AVG: piece = full + (g.rank() == 0 ? 0.5 * (g.size() - 1) : -0.5); break;
      case hp::ReduceOp::MAX: piece = full - 0.25 * g.rank(); break;
      default: piece = full + 0.25 * g.rank(); break;  // MIN
    }
    return hp::DTensor::from_local(piece, mesh, {hp::Partial(op)});
  };
  using F = std::function<at::Tensor(at::Tensor)>;
  const std::vector<std::pair<std::string, F>> ops{
      {"relu_", [](at::Tensor t) { return t.relu_(); }},
      {"mul_(2)", [](at::Tensor t) { return t.mul_(2.0); }},
      {"mul_(-1.5)", [](at::Tensor t) { return t.mul_(-1.5); }},
      {"add_(0.5)", [](at::Tensor t) { return t.add_(0.5); }},
      {"fill_(1.5)", [](at::Tensor t) { return t.fill_(1.5); }},
      {"zero_", [](at::Tensor t) { return t.zero_(); }},
      {"neg_", [](at::Tensor t) { return t.neg_(); }},
      {"exp_", [](at::Tensor t) { return t.exp_(); }},
      {"div_(4)", [](at::Tensor t) { return t.div_(4.0); }},
      {"copy_", [](at::Tensor t) { return t.copy_(t.detach().clone() * 0 + 2.5); }},
  };
  for (hp::ReduceOp op : {hp::ReduceOp::SUM, hp::ReduceOp::AVG, hp::ReduceOp::MAX, hp::ReduceOp::MIN}) {
    for (const auto& [name, f] : ops) {
      if (name == "copy_") continue;  // below, with a replicated source
      hp::DTensor x = partial(op);
      at::Tensor view = x.narrow(1, 1, 2);  // Partial views share the local data
      at::Tensor expect = f(full.clone());
      at::Tensor r = f(x);
      EXPECT_TRUE(r.is_same(x)) << name;
      EXPECT_EQ(x.placements(), P{hp::Partial(op)}) << name;
      EXPECT_TRUE(close(x, expect)) << name << " on " << hp::Partial(op).to_string();
      EXPECT_TRUE(close(view, expect.narrow(1, 1, 2))) << name << " on " << hp::Partial(op).to_string() << " (view)";
    }
    hp::DTensor x = partial(op);
    x.copy_(hp::distribute_tensor(full * 3, mesh, R));
    EXPECT_TRUE(close(x, full * 3)) << "copy_ on " << hp::Partial(op).to_string();
  }
}

// out= variants writing into a Partial tensor: its old value does not matter, the result must be
// the op's value under the out tensor's placements (every rank computes it whole; a sum keeps it
// on coordinate 0 only).
TEST(OffPathDist, OutVariantsIntoPartialAreExact) {
  auto mesh = world_mesh();
  at::Tensor a = values({3, 4}), b = values({3, 4}, 5);
  for (hp::ReduceOp op : {hp::ReduceOp::SUM, hp::ReduceOp::AVG, hp::ReduceOp::MAX}) {
    const P part{hp::Partial(op)};
    auto da = hp::distribute_tensor(a, mesh, R), db = hp::distribute_tensor(b, mesh, R);
    auto fresh = [&] { return hp::DTensor::from_local(at::full({3, 4}, 7.0), mesh, part); };
    hp::DTensor out = fresh();
    at::exp_out(out, da);
    EXPECT_EQ(out.placements(), part);
    EXPECT_TRUE(close(out, a.exp())) << "exp_out into " << hp::to_string(part);
    out = fresh();
    at::mul_out(out, da, db);
    EXPECT_TRUE(close(out, a * b)) << "mul_out into " << hp::to_string(part);
    out = fresh();
    at::add_out(out, da, db);
    EXPECT_TRUE(close(out, a + b)) << "add_out into " << hp::to_string(part);
  }
}

}  // namespace t_dist_dtensor_off_path_test
