// The op matrix (after PyTorch's test_dtensor_ops.py): every op variant of the table, with its
// inputs in every meaningful placement (Shard on each dim, Replicate, Partial sum and max), on even,
// uneven and empty-piece shapes, forward and gradients compared with the same op on plain tensors.
// Each cell is correct, or refused with an error raised on every rank; a wrong value or an error
// on some ranks only fails the test. One bad cell does not stop the matrix; the summary lists the
// refused variants.
#include "../../common/test_util.h"

#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collectives.h>

#include <map>
#include <set>

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_op_matrix_test {
namespace {

using Fn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
constexpr int64_t N = -1;  // in a shape: the dim that takes the even / uneven / tiny size

struct OpCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  Fn f;
  bool grad = true;
};

const std::vector<OpCase>& op_table() {
  using V = const std::vector<at::Tensor>&;
  static const std::vector<OpCase> t = [] {
    std::vector<OpCase> c;
    auto unary = [&](const std::string& n, std::function<at::Tensor(const at::Tensor&)> g, bool grad = true) {
      c.push_back({n, {{N, 3}}, [g](V a) { return g(a[0]); }, grad});
    };
    auto binary = [&](const std::string& n, std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> g,
                      bool grad = true) {
      c.push_back({n, {{N, 3}, {N, 3}}, [g](V a) { return g(a[0], a[1]); }, grad});
      c.push_back({n + " (broadcast row)", {{N, 3}, {3}}, [g](V a) { return g(a[0], a[1]); }, grad});
    };
    // pointwise, unary
    unary("abs", [](const at::Tensor& x) { return x.abs(); });
    unary("neg", [](const at::Tensor& x) { return -x; });
    unary("exp", [](const at::Tensor& x) { return x.exp(); });
    unary("log", [](const at::Tensor& x) { return (x.abs() + 1).log(); });
    unary("sqrt", [](const at::Tensor& x) { return (x.abs() + 1).sqrt(); });
    unary("rsqrt", [](const at::Tensor& x) { return (x.abs() + 1).rsqrt(); });
    unary("sigmoid", [](const at::Tensor& x) { return x.sigmoid(); });
    unary("tanh", [](const at::Tensor& x) { return x.tanh(); });
    unary("relu", [](const at::Tensor& x) { return x.relu(); });
    unary("gelu", [](const at::Tensor& x) { return at::gelu(x); });
    unary("gelu tanh", [](const at::Tensor& x) { return at::gelu(x, "tanh"); });
    unary("silu", [](const at::Tensor& x) { return at::silu(x); });
    unary("sin", [](const at::Tensor& x) { return x.sin(); });
    unary("cos", [](const at::Tensor& x) { return x.cos(); });
    unary("erf", [](const at::Tensor& x) { return x.erf(); });
    unary("log1p", [](const at::Tensor& x) { return x.abs().log1p(); });
    unary("expm1", [](const at::Tensor& x) { return x.expm1(); });
    unary("reciprocal", [](const at::Tensor& x) { return (x.abs() + 1).reciprocal(); });
    unary("square", [](const at::Tensor& x) { return x.square(); });
    unary("pow 2", [](const at::Tensor& x) { return x.pow(2); });
    unary("pow 0.5", [](const at::Tensor& x) { return (x.abs() + 1).pow(0.5); });
    unary("2 ** x", [](const at::Tensor& x) { return at::pow(2.0, x); });
    unary("clamp", [](const at::Tensor& x) { return x.clamp(-0.5, 0.5); });
    unary("clamp_min", [](const at::Tensor& x) { return x.clamp_min(0.1); });
    unary("clamp_max", [](const at::Tensor& x) { return x.clamp_max(0.1); });
    unary("leaky_relu", [](const at::Tensor& x) { return at::leaky_relu(x, 0.1); });
    unary("hardtanh", [](const at::Tensor& x) { return at::hardtanh(x, -0.5, 0.5); });
    unary("elu", [](const at::Tensor& x) { return at::elu(x); });
    unary("softplus", [](const at::Tensor& x) { return at::softplus(x); });
    unary("mish", [](const at::Tensor& x) { return at::mish(x); });
    unary("floor", [](const at::Tensor& x) { return (x * 3).floor(); }, false);
    unary("ceil", [](const at::Tensor& x) { return (x * 3).ceil(); }, false);
    unary("round", [](const at::Tensor& x) { return (x * 3).round(); }, false);
    unary("trunc", [](const at::Tensor& x) { return (x * 3).trunc(); }, false);
    unary("sign", [](const at::Tensor& x) { return x.sign(); }, false);
    unary("nan_to_num", [](const at::Tensor& x) { return at::nan_to_num(x.log()); }, false);
    unary("isnan", [](const at::Tensor& x) { return x.log().isnan(); }, false);
    unary("logical_not", [](const at::Tensor& x) { return (x > 0).logical_not(); }, false);
    // scalars and casts
    unary("x + 2.5", [](const at::Tensor& x) { return x + 2.5; });
    unary("x - 2.5", [](const at::Tensor& x) { return x - 2.5; });
    unary("2.5 - x", [](const at::Tensor& x) { return 2.5 - x; });
    unary("x * 2.5", [](const at::Tensor& x) { return x * 2.5; });
    unary("x / 2.5", [](const at::Tensor& x) { return x / 2.5; });
    unary("2.5 / x", [](const at::Tensor& x) { return 2.5 / (x.abs() + 1); });
    unary("x + scalar_tensor", [](const at::Tensor& x) { return x + at::scalar_tensor(2.5); });
    unary("add alpha", [](const at::Tensor& x) { return at::add(x, 1.5, 2); });
    unary("div floor", [](const at::Tensor& x) { return at::div(x * 4, 1.5, "floor"); }, false);
    unary("to double", [](const at::Tensor& x) { return x.to(at::kDouble); });
    unary("to long", [](const at::Tensor& x) { return (x * 4).to(at::kLong); }, false);
    unary("to bool", [](const at::Tensor& x) { return (x * 4).to(at::kBool); }, false);
    unary("to half", [](const at::Tensor& x) { return x.to(at::kHalf); });
    unary("to bfloat16", [](const at::Tensor& x) { return x.to(at::kBFloat16); });
    unary("clone", [](const at::Tensor& x) { return x.clone(); });
    unary("x.add_(2.5)", [](const at::Tensor& x) { return (x * 1).add_(2.5); });
    unary("x.mul_(3)", [](const at::Tensor& x) { return (x * 1).mul_(3); });
    unary("x.exp_()", [](const at::Tensor& x) { return (x * 1).exp_(); });
    unary("x.relu_()", [](const at::Tensor& x) { return (x * 1).relu_(); });
    unary("squeeze_", [](const at::Tensor& x) {
      at::Tensor y = (x * 1).unsqueeze(1);
      return y.squeeze_(1);
    });
    unary("t_", [](const at::Tensor& x) {
      at::Tensor y = x * 1;
      return y.t_();
    });
    unary("x.t().contiguous().neg_()", [](const at::Tensor& x) { return x.t().contiguous().neg_(); });
    unary("zero_", [](const at::Tensor& x) { return (x * 1).zero_(); }, false);
    unary("fill_", [](const at::Tensor& x) { return (x * 1).fill_(1.5); }, false);
    unary("masked_fill", [](const at::Tensor& x) { return x.masked_fill(x > 0.2, 0.0); });
    unary("where", [](const at::Tensor& x) { return at::where(x > 0, x, x * 0.5); });
    unary("dropout p=0", [](const at::Tensor& x) { return at::dropout(x, 0.0, true); });
    unary("zeros_like", [](const at::Tensor& x) { return at::zeros_like(x) + x; });
    unary("ones_like", [](const at::Tensor& x) { return at::ones_like(x) * x; });
    // pointwise, binary
    binary("add", [](const at::Tensor& a, const at::Tensor& b) { return a + b; });
    binary("sub", [](const at::Tensor& a, const at::Tensor& b) { return a - b; });
    binary("mul", [](const at::Tensor& a, const at::Tensor& b) { return a * b; });
    binary("div", [](const at::Tensor& a, const at::Tensor& b) { return a / (b.abs() + 1); });
    binary("maximum", [](const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); });
    binary("minimum", [](const at::Tensor& a, const at::Tensor& b) { return at::minimum(a, b); });
    binary("atan2", [](const at::Tensor& a, const at::Tensor& b) { return at::atan2(a, b); });
    binary("pow", [](const at::Tensor& a, const at::Tensor& b) { return at::pow(a.abs() + 1, b); });
    binary("lerp", [](const at::Tensor& a, const at::Tensor& b) { return at::lerp(a, b, 0.3); });
    binary("addcmul", [](const at::Tensor& a, const at::Tensor& b) { return at::addcmul(a, a, b, 0.5); });
    binary("addcdiv", [](const at::Tensor& a, const at::Tensor& b) { return at::addcdiv(a, a, b.abs() + 1, 0.5); });
    binary("eq", [](const at::Tensor& a, const at::Tensor& b) { return a == b; }, false);
    binary("lt", [](const at::Tensor& a, const at::Tensor& b) { return a < b; }, false);
    binary("logical_and", [](const at::Tensor& a, const at::Tensor& b) { return (a > 0).logical_and(b > 0); }, false);
    binary("logical_or", [](const at::Tensor& a, const at::Tensor& b) { return (a > 0).logical_or(b > 0); }, false);
    binary("fmod", [](const at::Tensor& a, const at::Tensor& b) { return at::fmod(a * 4, b.abs() + 1); }, false);
    binary("remainder", [](const at::Tensor& a, const at::Tensor& b) { return at::remainder(a * 4, b.abs() + 1); }, false);
    binary("a.add_(b)", [](const at::Tensor& a, const at::Tensor& b) { return (a * 1).add_(b); });
    binary("a.mul_(b)", [](const at::Tensor& a, const at::Tensor& b) { return (a * 1).mul_(b); });
    binary("a.copy_(b)", [](const at::Tensor& a, const at::Tensor& b) { return (a * 1).copy_(b.expand_as(a)); });
    // reductions
    unary("sum", [](const at::Tensor& x) { return x.sum(); });
    unary("sum(0)", [](const at::Tensor& x) { return x.sum(0); });
    unary("sum(1, keepdim)", [](const at::Tensor& x) { return x.sum(1, true); });
    unary("mean", [](const at::Tensor& x) { return x.mean(); });
    unary("mean(0)", [](const at::Tensor& x) { return x.mean(0); });
    unary("mean(1)", [](const at::Tensor& x) { return x.mean(1); });
    unary("amax(0)", [](const at::Tensor& x) { return x.amax(0); });
    unary("amin(1)", [](const at::Tensor& x) { return x.amin(1); });
    unary("amax all", [](const at::Tensor& x) { return x.amax(c10::IntArrayRef{0, 1}); });
    unary("max", [](const at::Tensor& x) { return x.max(); });
    unary("min", [](const at::Tensor& x) { return x.min(); });
    unary("max(0)", [](const at::Tensor& x) { return std::get<0>(x.max(0)); });
    unary("min(1)", [](const at::Tensor& x) { return std::get<0>(x.min(1)); });
    unary("argmax(0)", [](const at::Tensor& x) { return x.argmax(0); }, false);
    unary("argmin(1)", [](const at::Tensor& x) { return x.argmin(1); }, false);
    unary("var(0)", [](const at::Tensor& x) { return x.var(0); });
    unary("std(1)", [](const at::Tensor& x) { return x.std(1, /*unbiased=*/false); });
    unary("norm", [](const at::Tensor& x) { return x.norm(); });
    unary("norm(1)", [](const at::Tensor& x) { return at::linalg_vector_norm(x, 2, c10::IntArrayRef{1}); });
    unary("logsumexp(1)", [](const at::Tensor& x) { return at::logsumexp(x, {1}); });
    unary("all", [](const at::Tensor& x) { return (x > -10).all(); }, false);
    unary("any(0)", [](const at::Tensor& x) { return (x > 0.5).any(0); }, false);
    unary("cumsum(0)", [](const at::Tensor& x) { return x.cumsum(0); });
    unary("cumsum(1)", [](const at::Tensor& x) { return x.cumsum(1); });
    // views and shapes
    unary("view", [](const at::Tensor& x) { return x.view({-1}); });
    unary("reshape", [](const at::Tensor& x) { return x.reshape({x.size(0), 3, 1}); });
    unary("flatten", [](const at::Tensor& x) { return x.unsqueeze(0).flatten(0, 1); });
    unary("t", [](const at::Tensor& x) { return x.t(); });
    unary("transpose", [](const at::Tensor& x) { return x.transpose(0, 1); });
    unary("permute", [](const at::Tensor& x) { return x.unsqueeze(1).permute({2, 0, 1}); });
    unary("unsqueeze", [](const at::Tensor& x) { return x.unsqueeze(1); });
    unary("squeeze", [](const at::Tensor& x) { return x.unsqueeze(2).squeeze(2); });
    unary("select(1)", [](const at::Tensor& x) { return x.select(1, 2); });
    unary("select(0)", [](const at::Tensor& x) { return x.select(0, 0); });
    unary("narrow(1)", [](const at::Tensor& x) { return x.narrow(1, 1, 2); });
    unary("narrow(0)", [](const at::Tensor& x) { return x.narrow(0, 0, 1); });
    unary("slice step", [](const at::Tensor& x) { return x.slice(1, 0, 3, 2); });
    unary("split(1)[1]", [](const at::Tensor& x) { return x.split(2, 1)[1]; });
    unary("chunk(0)[0]", [](const at::Tensor& x) { return x.chunk(2, 0)[0]; });
    unary("unbind(1)", [](const at::Tensor& x) { return x.unbind(1)[1]; });
    unary("expand", [](const at::Tensor& x) { return x.unsqueeze(0).expand({2, x.size(0), 3}); });
    unary("contiguous of t", [](const at::Tensor& x) { return x.t().contiguous(); });
    unary("flip", [](const at::Tensor& x) { return x.flip({0}); });
    unary("roll", [](const at::Tensor& x) { return x.roll({1}, {1}); });
    unary("repeat", [](const at::Tensor& x) { return x.repeat({2, 1}); });
    unary("triu", [](const at::Tensor& x) { return x.triu(); });
    unary("tril", [](const at::Tensor& x) { return x.tril(-1); });
    unary("cat(0)", [](const at::Tensor& x) { return at::cat({x, x * 2}, 0); });
    unary("cat(1)", [](const at::Tensor& x) { return at::cat({x, x * 2}, 1); });
    unary("stack", [](const at::Tensor& x) { return at::stack({x, x + 1}, 1); });
    unary("index_select(1)", [](const at::Tensor& x) { return x.index_select(1, at::tensor({2, 0}, at::kLong)); });
    unary("gather(1)", [](const at::Tensor& x) { return x.gather(1, at::zeros({x.size(0), 2}, at::kLong)); });
    unary("scatter_add(1)", [](const at::Tensor& x) {
      return x.scatter_add(1, at::zeros({x.size(0), 2}, at::kLong), x.narrow(1, 0, 2));
    });
    unary("index_fill(1)", [](const at::Tensor& x) { return x.index_fill(1, at::tensor({0, 2}, at::kLong), 0.5); });
    unary("index_put", [](const at::Tensor& x) {
      return x.index_put({at::arange(x.size(0), at::kLong)}, at::ones({3}) * 0.5, /*accumulate=*/true);
    });
    unary("index_add(1)", [](const at::Tensor& x) { return x.index_add(1, at::tensor({2, 0}, at::kLong), x.narrow(1, 0, 2)); });
    unary("topk(1)", [](const at::Tensor& x) { return std::get<0>(x.topk(2, 1)); });
    unary("sort(1)", [](const at::Tensor& x) { return std::get<0>(x.sort(1)); });
    unary("sort(0)", [](const at::Tensor& x) { return std::get<0>(x.sort(0)); });
    // normalisation and softmax
    unary("softmax(1)", [](const at::Tensor& x) { return x.softmax(1); });
    unary("softmax(0)", [](const at::Tensor& x) { return x.softmax(0); });
    unary("log_softmax(1)", [](const at::Tensor& x) { return x.log_softmax(1); });
    unary("log_softmax(0)", [](const at::Tensor& x) { return x.log_softmax(0); });
    unary("layer_norm", [](const at::Tensor& x) { return at::layer_norm(x, {3}); });
    c.push_back({"layer_norm affine", {{N, 3}, {3}, {3}}, [](V a) { return at::layer_norm(a[0], {3}, a[1], a[2]); }});
    // matmuls
    c.push_back({"mm", {{N, 3}, {3, 4}}, [](V a) { return at::mm(a[0], a[1]); }});
    c.push_back({"mm (N inner)", {{2, N}, {N, 3}}, [](V a) { return at::mm(a[0], a[1]); }});
    c.push_back({"matmul", {{N, 3}, {3, 4}}, [](V a) { return at::matmul(a[0], a[1]); }});
    c.push_back({"linear", {{N, 3}, {4, 3}, {4}}, [](V a) { return at::linear(a[0], a[1], a[2]); }});
    c.push_back({"addmm", {{4}, {N, 3}, {3, 4}}, [](V a) { return at::addmm(a[0], a[1], a[2]); }});
    c.push_back({"bmm", {{2, N, 3}, {2, 3, 2}}, [](V a) { return at::bmm(a[0], a[1]); }});
    c.push_back({"matmul 3d", {{2, N, 3}, {3, 2}}, [](V a) { return at::matmul(a[0], a[1]); }});
    // vector products (matmul with a 1-D operand decomposes into them, or into squeeze_ of mm)
    c.push_back({"dot", {{N}, {N}}, [](V a) { return at::dot(a[0], a[1]); }});
    c.push_back({"mv", {{N, 3}, {3}}, [](V a) { return at::mv(a[0], a[1]); }});
    c.push_back({"mv (N inner)", {{3, N}, {N}}, [](V a) { return at::mv(a[0], a[1]); }});
    c.push_back({"outer", {{N}, {3}}, [](V a) { return at::outer(a[0], a[1]); }});
    c.push_back({"matmul 1-D @ 2-D", {{N}, {N, 3}}, [](V a) { return at::matmul(a[0], a[1]); }});
    c.push_back({"matmul 2-D @ 1-D", {{N, 3}, {3}}, [](V a) { return at::matmul(a[0], a[1]); }});
    // losses and embedding
    c.push_back({"mse_loss", {{N, 3}, {N, 3}}, [](V a) { return at::mse_loss(a[0], a[1]); }});
    c.push_back({"cross_entropy", {{N, 3}}, [](V a) {
                   return at::cross_entropy_loss(a[0], at::arange(a[0].size(0), at::kLong).remainder(3));
                 }});
    c.push_back({"cross_entropy smoothing", {{N, 3}}, [](V a) {
                   return at::cross_entropy_loss(a[0], at::arange(a[0].size(0), at::kLong).remainder(3), {},
                                                 at::Reduction::Mean, -100, 0.1);
                 }});
    c.push_back({"nll_loss", {{N, 3}}, [](V a) {
                   return at::nll_loss(a[0].log_softmax(1), at::arange(a[0].size(0), at::kLong).remainder(3));
                 }});
    c.push_back({"cross_entropy 3d", {{2, 3, N}}, [](V a) {
                   return at::cross_entropy_loss(a[0], at::zeros({2, a[0].size(2)}, at::kLong));
                 }});
    c.push_back({"embedding", {{5, N}}, [](V a) { return at::embedding(a[0], at::tensor({1, 4, 0}, at::kLong)); }});
    return c;
  }();
  return t;
}

enum Outcome : int64_t { kCorrect = 0, kRefused = 1, kWrong = 2, kSkipped = 3 };

// A DTensor of `full` with `placements` (Partial: pieces that reduce to `full`).
hp::DTensor make_input(const at::Tensor& full, const hp::DeviceMesh& mesh, const hp::Placements& placements,
                       bool leaf_grad) {
  bool partial = false;
  for (const auto& p : placements) partial = partial || p.is_partial();
  if (!partial) {
    auto d = hp::distribute_tensor(full, mesh, placements, c10::nullopt);
    if (leaf_grad) d.set_requires_grad(true);
    return d;
  }
  const auto coord = *mesh.get_coordinate();
  at::Tensor local = full;
  for (size_t i = 0; i < placements.size(); ++i) {
    const auto& p = placements[i];
    const int64_t parts = mesh.size(static_cast<int64_t>(i));
    if (p.is_shard()) {
      const int64_t d = p.normalized(full.dim()).dim(), n = local.size(d);
      local = local.narrow(d, hp::chunk_offset(n, parts, coord[i]), hp::chunk_size(n, parts, coord[i]));
    } else if (p.is_partial() && p.reduce_op() == hp::ReduceOp::SUM && parts > 1) {
      local = coord[i] == 0 ? local - 0.375 * (parts - 1) : at::full_like(local, 0.375);
    }  // max/min/avg of identical pieces is the value
  }
  return hp::DTensor::from_local(local.contiguous().detach().requires_grad_(leaf_grad), mesh, placements, false,
                                 full.sizes(), full.strides());
}

std::vector<hp::Placements> candidates(const hp::DeviceMesh& mesh, int64_t ndim, bool floating) {
  std::vector<hp::Placement> one{hp::Replicate()};
  for (int64_t d = 0; d < ndim; ++d) one.push_back(hp::Shard(d));
  if (floating) {
    one.push_back(hp::Partial());
    one.push_back(hp::Partial(hp::ReduceOp::MAX));
  }
  std::vector<hp::Placements> out;
  if (mesh.ndim() == 1) {
    for (const auto& p : one) out.push_back({p});
  } else {  // 2-D: the same placement on both mesh dims (nested), or one of them replicated,
            // plus Shard/Partial crossings; a subset that bounds the count on 2 cores
    for (size_t i = 0; i < one.size(); ++i)
      for (size_t j = 0; j < one.size(); ++j)
        if (i == j || i == 0 || j == 0 || (i == 1 && j + 1 == one.size()) || (j == 1 && i + 2 == one.size()))
          out.push_back({one[i], one[j]});
  }
  return out;
}

struct Matrix {
  std::map<int64_t, int64_t> counts;
  std::map<std::string, std::string> refused;  // variant -> first message
  std::vector<std::string> failures;
};

// The seed's float32 tolerance; half and bfloat16 results are compared at their own precision
// (a Partial cast to them rounds each addend, an error of the order of reducing in them).
double tol(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? 2e-3 : t.scalar_type() == at::kBFloat16 ? 1.6e-2 : 1e-4;
}

// One cell: forward and gradients against plain tensors; the outcome agreed by every rank.
void run_cell(const hp::DeviceMesh& mesh, const OpCase& op, const std::vector<at::Tensor>& full,
              const std::vector<hp::Placements>& pl, Matrix& m) {
  std::string what = op.name + " with (";
  for (size_t k = 0; k < pl.size(); ++k) what += (k ? ", " : "") + hp::to_string(pl[k]) + " " + c10::str(full[k].sizes());
  what += ")";
  int64_t outcome = kCorrect;
  std::string detail;
  try {
    std::vector<at::Tensor> plain;
    for (const auto& t : full) plain.push_back(t.clone().requires_grad_(op.grad));
    at::Tensor ref;
    try {
      ref = op.f(plain);
    } catch (const c10::Error&) {
      outcome = kSkipped;  // not valid on plain tensors either (e.g. an empty reduction)
    }
    if (outcome == kCorrect) {
      std::vector<at::Tensor> dist;
      for (size_t k = 0; k < full.size(); ++k) dist.push_back(make_input(full[k], mesh, pl[k], op.grad));
      at::Tensor out;
      {
        hp::ImplicitReplicationGuard constants;  // index tensors the op builds itself
        out = op.f(dist);
      }
      at::Tensor got = hp::is_dtensor(out) ? hp::DTensor(out).full_tensor() : out;
      if (got.sizes() != ref.sizes() || got.scalar_type() != ref.scalar_type()) {
        outcome = kWrong;
        detail = "result " + c10::str(got.sizes(), " ", got.scalar_type()) + " vs " + c10::str(ref.sizes(), " ", ref.scalar_type());
      } else if (!at::allclose(got.to(at::kDouble), ref.detach().to(at::kDouble), tol(ref), tol(ref) / 10,
                               /*equal_nan=*/true)) {
        outcome = kWrong;
        detail = "forward max diff " + c10::str((got.to(at::kDouble) - ref.detach().to(at::kDouble)).abs().max().item<double>());
      } else if (op.grad && ref.requires_grad() && at::isFloatingType(ref.scalar_type())) {
        at::Tensor w = values(ref.sizes(), 3).to(ref.scalar_type()) + 2;
        (ref * w).sum().backward();
        (got * w).sum().backward();
        for (size_t k = 0; k < full.size() && outcome == kCorrect; ++k) {
          bool partial = false;
          for (const auto& p : pl[k]) partial = partial || p.is_partial();
          if (partial || !plain[k].grad().defined()) continue;  // a Partial input is not a leaf
          const at::Tensor g = dist[k].grad();
          if (!g.defined()) {
            outcome = kWrong;
            detail = "no gradient for input " + std::to_string(k);
          } else {
            at::Tensor gf = hp::is_dtensor(g) ? hp::DTensor(g).full_tensor() : g;
            if (!at::allclose(gf, plain[k].grad(), 1e-4, 1e-5, /*equal_nan=*/true)) {
              outcome = kWrong;
              detail = "gradient of input " + std::to_string(k) + " max diff " +
                       c10::str((gf - plain[k].grad()).abs().max().item<float>());
            }
          }
        }
      }
    }
  } catch (const c10::Error& e) {
    outcome = kRefused;
    detail = e.what_without_backtrace();
    detail = detail.substr(0, detail.find('\n'));
  }
  // Every rank must reach the same verdict: an error on some ranks only would hang real jobs.
  at::Tensor verdict = at::tensor({outcome, -outcome}, at::kLong);
  hp::all_reduce_(verdict, hp::ReduceOp::MAX, hp::world_group());
  const int64_t hi = verdict[0].item<int64_t>(), lo = -verdict[1].item<int64_t>();
  if (hi != lo) {
    m.failures.push_back(what + ": ranks disagree (outcomes " + std::to_string(lo) + ".." + std::to_string(hi) +
                         "), this rank: " + std::to_string(outcome) + " " + detail);
    m.counts[kWrong]++;
    return;
  }
  m.counts[outcome]++;
  if (outcome == kWrong) m.failures.push_back(what + ": WRONG " + detail);
  if (outcome == kRefused && !m.refused.count(op.name)) m.refused[op.name] = what + ": " + detail;
}

void run_matrix(const hp::DeviceMesh& mesh) {
  Matrix m;
  const int64_t n = mesh.size();
  std::set<std::string> variants;
  const char* only = std::getenv("HP_OP_MATRIX_ONLY");  // debugging: one variant by name
  for (const auto& op : op_table()) {
    if (only != nullptr && op.name != only) continue;
    variants.insert(op.name);
    // Even, uneven and (for n > 1) empty trailing pieces; on a 2-D mesh the uneven and empty ones.
    const std::vector<int64_t> sizes = mesh.ndim() == 1 ? std::vector<int64_t>{2 * n, n + 1, 1} : std::vector<int64_t>{n + 1, 1};
    for (int64_t size : sizes) {
      std::vector<at::Tensor> full;
      for (size_t k = 0; k < op.shapes.size(); ++k) {
        std::vector<int64_t> s = op.shapes[k];
        for (auto& x : s) x = x == N ? size : x;
        full.push_back(random(s, 100 + k + static_cast<uint64_t>(size)));
      }
      // Input 0 in every placement; the others alike where the shapes allow, else replicated.
      for (const auto& p0 : candidates(mesh, full[0].dim(), true)) {
        std::vector<hp::Placements> same{p0}, rest{p0};
        for (size_t k = 1; k < full.size(); ++k) {
          bool fits = full[k].dim() == full[0].dim();
          same.push_back(fits ? p0 : hp::Placements(static_cast<size_t>(mesh.ndim()), hp::Replicate()));
          rest.push_back(hp::Placements(static_cast<size_t>(mesh.ndim()), hp::Replicate()));
        }
        run_cell(mesh, op, full, same, m);
        if (full.size() > 1 && same != rest) run_cell(mesh, op, full, rest, m);
      }
      // Each other input alone in each placement.
      for (size_t k = 1; k < full.size(); ++k)
        for (const auto& pk : candidates(mesh, full[k].dim(), true)) {
          std::vector<hp::Placements> pl(full.size(), hp::Placements(static_cast<size_t>(mesh.ndim()), hp::Replicate()));
          pl[k] = pk;
          run_cell(mesh, op, full, pl, m);
        }
    }
  }
  if (hp::get_rank() == 0) {
    std::printf("op matrix on %s: %zu variants, %lld cells: %lld correct, %lld refused on every rank, %lld wrong, %lld not valid on plain tensors\n",
                mesh.to_string().c_str(), variants.size(),
                static_cast<long long>(m.counts[0] + m.counts[1] + m.counts[2] + m.counts[3]),
                static_cast<long long>(m.counts[kCorrect]), static_cast<long long>(m.counts[kRefused]),
                static_cast<long long>(m.counts[kWrong]), static_cast<long long>(m.counts[kSkipped]));
    for (const auto& [name, msg] : m.refused) std::printf("  refused (first cell): %s\n", msg.c_str());
  }
  for (const auto& f : m.failures) ADD_FAILURE() << f;
}

}  // namespace

TEST(OpMatrixDist, OneDimensionalMesh) { run_matrix(world_mesh()); }

TEST(OpMatrix2x2Dist, TwoDimensionalMesh) {
  ASSERT_EQ(hp::get_world_size(), 4);
  run_matrix(hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}));
}

}  // namespace t_dist_dtensor_op_matrix_test
