// The unboxed kernels (src/dtensor/unboxed_kernels.cpp): the second call of an op with the same
// specs runs without boxing, and gives what the first call (the boxed fallback) and the plain op
// give: the same values, global sizes, strides, placements and dtype, views of the same local
// data. Every call the fast path must not take (a plain tensor among DTensors, a redistribution,
// a stale copy-view, a normal view under InferenceMode, op tracing) goes to the fallback, which
// the run count shows.
#include "../../common/test_util.h"

#include <hyper_parallel/runtime/comm_debug_mode.h>

#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/silu_backward.h>
#include <c10/core/InferenceMode.h>

#include "../../../src/dtensor/unboxed_kernels.h"

using namespace hp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_unboxed_kernels_test {
namespace {

int64_t ws() { return hp::get_world_size(); }

using Op = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct Case {
  std::string name;
  std::vector<at::Tensor> inputs;  // global values
  std::vector<P> placements;
  Op op;
  int64_t unboxed = 1;  // runs of the unboxed kernels expected in a repeated call
  // Which input each return is a view of (-1: a new tensor).
  std::vector<int64_t> views = {};
};

std::vector<at::Tensor> one(const at::Tensor& t) { return {t}; }
template <class... T>
std::vector<at::Tensor> all(const std::tuple<T...>& t) {
  return std::apply([](const auto&... x) { return std::vector<at::Tensor>{x...}; }, t);
}

// The same global geometry and placements.
::testing::AssertionResult same_spec(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.strides() != b.strides() || a.storage_offset() != b.storage_offset() ||
      a.scalar_type() != b.scalar_type() || a.is_contiguous() != b.is_contiguous())
    return ::testing::AssertionFailure() << "geometry " << a.sizes() << "/" << a.strides() << " vs " << b.sizes() << "/"
                                         << b.strides();
  if (hp::DTensor(a).placements() != hp::DTensor(b).placements())
    return ::testing::AssertionFailure() << "placements " << hp::to_string(hp::DTensor(a).placements()) << " vs "
                                         << hp::to_string(hp::DTensor(b).placements());
  return ::testing::AssertionSuccess();
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  auto mesh = world_mesh();
  std::vector<at::Tensor> dist;
  for (size_t k = 0; k < c.inputs.size(); ++k)
    dist.push_back(c.inputs[k].dim() == 0 ? c.inputs[k] : at::Tensor(hp::distribute_tensor(c.inputs[k], mesh, c.placements[k])));
  const std::vector<at::Tensor> ref = c.op(c.inputs);
  const std::vector<at::Tensor> first = c.op(dist);
  const uint64_t before = hp::unboxed_runs_on_this_thread();
  const std::vector<at::Tensor> second = c.op(dist);
  EXPECT_EQ(static_cast<int64_t>(hp::unboxed_runs_on_this_thread() - before), c.unboxed) << "unboxed runs of the repeated call";
  ASSERT_EQ(first.size(), ref.size());
  ASSERT_EQ(second.size(), ref.size());
  for (size_t r = 0; r < ref.size(); ++r) {
    SCOPED_TRACE("return " + std::to_string(r));
    if (!ref[r].defined()) {
      EXPECT_FALSE(second[r].defined());
      continue;
    }
    ASSERT_TRUE(hp::is_dtensor(first[r]) && hp::is_dtensor(second[r]));
    EXPECT_TRUE(close(second[r], ref[r]));
    EXPECT_TRUE(same_spec(second[r], first[r]));
    const at::Tensor l1 = hp::DTensor(first[r]).to_local(), l2 = hp::DTensor(second[r]).to_local();
    EXPECT_TRUE(at::equal(l1, l2)) << "the local results differ";
    EXPECT_EQ(l1.strides(), l2.strides());
    const int64_t v = r < c.views.size() ? c.views[r] : -1;
    if (v >= 0) {
      const at::Tensor base = hp::DTensor(dist[static_cast<size_t>(v)]).to_local();
      EXPECT_TRUE(l2.is_alias_of(base)) << "a view's local data is its base's";
      EXPECT_TRUE(second[r].is_view()) << "autograd tracks the view";
    } else {
      for (const at::Tensor& in : dist)
        if (hp::is_dtensor(in)) EXPECT_FALSE(l2.is_alias_of(hp::DTensor(in).to_local())) << "a new result aliases an input";
    }
  }
}

}  // namespace

// Every op with an unboxed kernel, once each, its inputs in placements its rule keeps: the second
// call runs unboxed and matches the first and the plain op.
TEST(UnboxedKernelsDist, EveryKernelMatchesTheFallbackAndThePlainOp) {
  at::NoGradGuard no_grad;  // the backward ops are called directly
  const int64_t n = 4 * ws();
  const P S0{hp::Shard(0)}, S1{hp::Shard(1)}, R{hp::Replicate()};
  const at::Tensor a = values({n, 6}), b = values({n, 6}, 3), pos = a.abs() + 1;
  const at::Tensor w6 = values({6, 5}, 1), bias5 = values({5}, 2), ln_w = values({6}, 4) + 2, ln_b = values({6}, 5);
  const at::Tensor a3 = values({2, n, 6}), b3 = values({2, 6, 3}, 1), c3 = values({2, n, 3}, 2);
  using V = const std::vector<at::Tensor>&;
  std::vector<Case> cases = {
      {"add.Tensor", {a, b}, {S0, S0}, [](V x) { return one(at::add(x[0], x[1])); }},
      {"add.Tensor alpha int", {a, b}, {S1, S1}, [](V x) { return one(at::add(x[0], x[1], 2)); }},
      {"sub.Tensor alpha double", {a, b}, {S0, S0}, [](V x) { return one(at::sub(x[0], x[1], 0.5)); }},
      {"mul.Tensor", {a, b}, {R, R}, [](V x) { return one(at::mul(x[0], x[1])); }},
      {"mul.Scalar", {a}, {S0}, [](V x) { return one(at::mul(x[0], c10::Scalar(3.0))); }},
      {"div.Tensor", {a, pos}, {S0, S0}, [](V x) { return one(at::div(x[0], x[1])); }},
      {"neg", {a}, {S1}, [](V x) { return one(at::neg(x[0])); }},
      {"exp", {a}, {S0}, [](V x) { return one(at::exp(x[0])); }},
      {"rsqrt", {pos}, {S0}, [](V x) { return one(at::rsqrt(x[0])); }},
      {"tanh", {a}, {S0}, [](V x) { return one(at::tanh(x[0])); }},
      {"sigmoid", {a}, {S0}, [](V x) { return one(at::sigmoid(x[0])); }},
      {"relu", {a}, {S0}, [](V x) { return one(at::relu(x[0])); }},
      {"silu", {a}, {S0}, [](V x) { return one(at::silu(x[0])); }},
      {"silu_backward", {b, a}, {S0, S0}, [](V x) { return one(at::silu_backward(x[0], x[1])); }},
      {"gelu tanh", {a}, {S0}, [](V x) { return one(at::gelu(x[0], "tanh")); }},
      {"gelu_backward", {b, a}, {S0, S0}, [](V x) { return one(at::gelu_backward(x[0], x[1], "none")); }},
      {"pow.Tensor_Scalar", {a}, {S0}, [](V x) { return one(at::pow(x[0], 2)); }},
      {"where.self", {a.gt(0), a, b}, {S0, S0, S0}, [](V x) { return one(at::where(x[0], x[1], x[2])); }},
      {"_to_copy", {a}, {S0}, [](V x) { return one(x[0].to(at::kDouble)); }},
      {"clone", {a}, {S1}, [](V x) { return one(x[0].clone()); }},
      {"mm", {a, w6}, {S0, R}, [](V x) { return one(at::mm(x[0], x[1])); }},
      {"addmm", {bias5, a, w6}, {R, S0, R}, [](V x) { return one(at::addmm(x[0], x[1], x[2])); }},
      {"bmm", {a3, b3}, {S1, R}, [](V x) { return one(at::bmm(x[0], x[1])); }},
      {"baddbmm", {c3, a3, b3}, {S1, S1, R}, [](V x) { return one(at::baddbmm(x[0], x[1], x[2], 0.5, 2)); }},
      {"native_layer_norm", {a, ln_w, ln_b}, {S0, R, R},
       [](V x) { return all(at::native_layer_norm(x[0], {6}, x[1], x[2], 1e-5)); }},
      {"native_layer_norm_backward", {b, a, ln_w, ln_b}, {S0, S0, R, R},
       [](V x) {
         auto [y, mean, rstd] = at::native_layer_norm(x[1], {6}, x[2], x[3], 1e-5);
         return all(at::native_layer_norm_backward(x[0], x[1], {6}, mean, rstd, x[2], x[3], {true, false, false}));
       },
       2},
      {"_softmax", {a}, {S0}, [](V x) { return one(at::_softmax(x[0], 1, false)); }},
      {"_softmax_backward_data", {b, a}, {S0, S0},
       [](V x) { return one(at::_softmax_backward_data(x[0], at::_softmax(x[1], 1, false), 1, at::kFloat)); }, 2},
      {"mean.dim", {a}, {S0}, [](V x) { return one(at::mean(x[0], {1}, true)); }},
      {"sum.dim_IntList", {a}, {S1}, [](V x) { return one(at::sum(x[0], {0})); }},
      {"t", {a}, {S0}, [](V x) { return one(x[0].t()); }, 1, {0}},
      {"transpose.int", {a3}, {S1}, [](V x) { return one(x[0].transpose(0, 2)); }, 1, {0}},
      {"unsqueeze", {a}, {S1}, [](V x) { return one(x[0].unsqueeze(1)); }, 1, {0}},
      {"permute", {a3}, {S1}, [](V x) { return one(x[0].permute({1, 2, 0})); }, 1, {0}},
      {"select.int", {a}, {S0}, [](V x) { return one(x[0].select(1, 2)); }, 1, {0}},
  };
  for (const Case& c : cases) run_case(c);
}

// Calls the fast path hands to the fallback, which decides, checks and raises as for every op.
TEST(UnboxedKernelsDist, CallsTheFastPathMustNotTakeGoToTheFallback) {
  at::NoGradGuard no_grad;
  const int64_t n = 4 * ws();
  const P S0{hp::Shard(0)}, R{hp::Replicate()};
  const at::Tensor a = values({n, 6}), b = values({n, 6}, 3);
  using V = const std::vector<at::Tensor>&;
  // A 0-dim plain tensor among DTensors is a scalar the key spells out, not a spec.
  run_case({"a 0-dim plain tensor", {a, at::scalar_tensor(2.0)}, {S0, {}}, [](V x) { return one(at::mul(x[0], x[1])); }, 0});
  // A rule that rewrites the arguments (view's global sizes into local ones).
  run_case({"rewritten arguments", {a}, {S0}, [](V x) { return one(x[0].view({-1, 3, 2})); }, 0, {0}});
  // The rule moves an input (Replicate -> Shard(0)): redistribution is the fallback's.
  if (ws() > 1) run_case({"a redistributed input", {a, b}, {S0, R}, [](V x) { return one(at::add(x[0], x[1])); }, 0});

  // Op tracing records every op, repeated or not.
  auto mesh = world_mesh();
  hp::DTensor x = hp::distribute_tensor(a, mesh, S0), y = hp::distribute_tensor(b, mesh, S0);
  (void)(x + y);
  {
    hp::CommDebugMode comm(/*trace=*/true);
    const uint64_t before = hp::unboxed_runs_on_this_thread();
    (void)(x + y);
    EXPECT_EQ(hp::unboxed_runs_on_this_thread(), before);
    const auto trace = comm.get_op_trace();
    bool add_traced = false;
    for (const auto& line : trace) add_traced = add_traced || line.find("aten::add.Tensor") != std::string::npos;
    EXPECT_TRUE(add_traced) << c10::Join("\n", trace);
  }

  // Under InferenceMode a view of a normal DTensor is a normal tensor, as libtorch's own views are.
  for (int k = 0; k < 2; ++k) {
    at::Tensor t;
    {
      c10::InferenceMode guard;
      t = x.t();
    }
    EXPECT_FALSE(t.is_inference());
    EXPECT_TRUE(close(t, a.t()));
  }

  // A stale copy-view is refused on every call, the first and the repeated one alike.
  if (ws() > 1) {
    hp::DTensor base = hp::distribute_tensor(values({4 * ws(), 3}), mesh, S0);
    hp::DTensor v(base.narrow(0, 1, 2));
    ASSERT_TRUE(v.is_copy_view());
    hp::DTensor other = hp::distribute_tensor(values({2, 3}, 1), mesh, R);
    (void)(v + other);
    (void)(v + other);
    base.mul_(2);
    for (int k = 0; k < 2; ++k) {
      try {
        (void)(v + other);
        ADD_FAILURE() << "a stale copy-view was read";
      } catch (const c10::Error& e) {
        const std::string m = e.what_without_backtrace();
        EXPECT_EQ(m.rfind("hyper_parallel::dispatch: aten::add.Tensor", 0), 0u) << m;
        EXPECT_NE(m.find("written in place"), std::string::npos) << m;
      }
    }
  }
}

// A training step run twice on one mesh: forward and backward go through the unboxed kernels the
// second time (the backward ops too), and the gradients are the plain ones both times.
TEST(UnboxedKernelsDist, ARepeatedTrainingStepMatchesThePlainOne) {
  const int64_t n = 4 * ws();
  auto mesh = world_mesh();
  const std::vector<at::Tensor> inputs = {values({n, 6}), values({6}, 4) + 2, values({6}, 5), values({6, 5}, 1)};
  const std::vector<P> placements = {{hp::Shard(0)}, {hp::Replicate()}, {hp::Replicate()}, {hp::Replicate()}};
  auto f = [](const std::vector<at::Tensor>& x) {
    at::Tensor h = at::layer_norm(x[0], {6}, x[1], x[2]);
    h = at::silu(h) * h;
    return at::softmax(at::mm(h, x[3]), 1);
  };
  const at::Tensor g = values({n, 5}, 7);
  std::vector<at::Tensor> plain;
  for (const at::Tensor& t : inputs) plain.push_back(t.clone().requires_grad_(true));
  (f(plain) * g).sum().backward();
  uint64_t runs = 0;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<at::Tensor> dist;
    for (size_t k = 0; k < inputs.size(); ++k) {
      dist.push_back(hp::distribute_tensor(inputs[k], mesh, placements[k]));
      dist.back().set_requires_grad(true);
    }
    const uint64_t before = hp::unboxed_runs_on_this_thread();
    const at::Tensor out = f(dist);
    EXPECT_TRUE(close(out, f(inputs)));
    (hp::DTensor(out).full_tensor() * g).sum().backward();
    runs = hp::unboxed_runs_on_this_thread() - before;
    for (size_t k = 0; k < inputs.size(); ++k) {
      ASSERT_TRUE(dist[k].grad().defined()) << "input " << k;
      EXPECT_TRUE(close(dist[k].grad(), plain[k].grad())) << "gradient of input " << k;
    }
  }
  // native_layer_norm, silu, mul, mm and _softmax forward; mul, t, mm, silu_backward,
  // _softmax_backward_data, native_layer_norm_backward among the backward's.
  EXPECT_GE(runs, 10u) << "the repeated step ran unboxed";
}

// native_layer_norm_backward's output mask (a bool list, part of the decision key) says which
// gradients exist: a frozen weight, then a trained one, then frozen again, each call repeated by
// the next step, gives the plain gradients and no others.
TEST(UnboxedKernelsDist, LayerNormGradientsWhicheverInputsNeedThem) {
  const int64_t n = 4 * ws();
  const P S0{hp::Shard(0)}, R{hp::Replicate()};
  auto mesh = world_mesh();
  for (bool train_weight : {false, false, true, true, false}) {
    const std::vector<at::Tensor> inputs = {values({n, 6}), values({6}, 4) + 2, values({6}, 5)};
    at::Tensor px = inputs[0].clone().requires_grad_(true), pw = inputs[1].clone().requires_grad_(train_weight),
               pb = inputs[2].clone().requires_grad_(train_weight);
    at::Tensor dx = hp::distribute_tensor(inputs[0], mesh, S0), dw = hp::distribute_tensor(inputs[1], mesh, R),
               db = hp::distribute_tensor(inputs[2], mesh, R);
    dx.set_requires_grad(true);
    dw.set_requires_grad(train_weight);
    db.set_requires_grad(train_weight);
    const at::Tensor g = values({n, 6}, 7);
    (at::layer_norm(px, {6}, pw, pb) * g).sum().backward();
    (hp::DTensor(at::layer_norm(dx, {6}, dw, db)).full_tensor() * g).sum().backward();
    EXPECT_TRUE(close(dx.grad(), px.grad())) << "train_weight " << train_weight;
    EXPECT_EQ(dw.grad().defined(), train_weight);
    if (!train_weight) continue;
    ASSERT_TRUE(dw.grad().defined() && hp::is_dtensor(dw.grad()));
    EXPECT_TRUE(close(dw.grad(), pw.grad()));
    EXPECT_TRUE(close(db.grad(), pb.grad()));
  }
}

}  // namespace t_dist_dtensor_unboxed_kernels_test
