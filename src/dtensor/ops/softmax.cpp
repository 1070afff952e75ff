// softmax / log_softmax and their backwards. Over a sharded dim (the vocabulary of logits kept
// Shard(-1) for loss parallelism) they run in parallel: a max and a sum all-reduced over the
// shards instead of gathering the dim.
#include "rule_utils.h"

#include <hyper_parallel/dtensor/loss_parallel.h>
#include <hyper_parallel/runtime/collectives.h>

#include <limits>

namespace hyper_parallel {
namespace ops {
namespace {

std::vector<int64_t> mesh_dims_sharding(const Placements& p, int64_t dim) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i].is_shard(dim)) out.push_back(static_cast<int64_t>(i));
  return out;
}

// Reduces `t` in place over the groups of the given mesh dims.
void all_reduce_over(at::Tensor& t, ReduceOp op, const DeviceMesh& mesh, const std::vector<int64_t>& dims) {
  for (int64_t i : dims) all_reduce_(t, op, mesh.get_group(i));
}

// The handlers' parameters: {dim, log (0/1), the mesh dims sharding dim...}.
std::vector<int64_t> params_of(int64_t dim, bool log, const std::vector<int64_t>& dims) {
  std::vector<int64_t> p{dim, log ? 1 : 0};
  p.insert(p.end(), dims.begin(), dims.end());
  return p;
}
struct Params {
  int64_t dim;
  bool log;
  std::vector<int64_t> dims;
  explicit Params(const std::vector<int64_t>& p) : dim(p[0]), log(p[1] != 0), dims(p.begin() + 2, p.end()) {}
};

// softmax / log_softmax over a dim split across ranks: the max and the sum all-reduced over the
// shards instead of gathering the dim.
void softmax_over_shards(const c10::OperatorHandle& op, torch::jit::Stack* stack, const DeviceMesh& mesh,
                         const std::vector<int64_t>& params) {
  const torch::jit::Stack a = pop_args(op, stack);
  const auto [dim, log, dims] = Params(params);
  at::Tensor x = a[0].toTensor();
  if (a[2].toBool()) x = x.to(at::kFloat);  // half_to_float
  at::Tensor m = x.size(dim) > 0 ? std::get<0>(x.max(dim, /*keepdim=*/true))
                                 : at::full({}, -std::numeric_limits<double>::infinity(), x.options()).expand_as(x.sum(dim, true)).clone();
  all_reduce_over(m, ReduceOp::MAX, mesh, dims);
  at::Tensor e = (x - m).exp();
  at::Tensor sum = e.sum(dim, /*keepdim=*/true);
  all_reduce_over(sum, ReduceOp::SUM, mesh, dims);
  stack->emplace_back(log ? x - m - sum.log() : e / sum);
}

// Their backward: one sum over the split dim all-reduced.
void softmax_backward_over_shards(const c10::OperatorHandle& op, torch::jit::Stack* stack, const DeviceMesh& mesh,
                                  const std::vector<int64_t>& params) {
  const torch::jit::Stack a = pop_args(op, stack);
  const auto [dim, log, dims] = Params(params);
  const at::Tensor& grad = a[0].toTensor();
  const at::Tensor& y = a[1].toTensor();
  const auto input_dtype = static_cast<at::ScalarType>(a[3].toInt());
  at::Tensor sum = (log ? grad : grad * y).sum(dim, /*keepdim=*/true);
  all_reduce_over(sum, ReduceOp::SUM, mesh, dims);
  at::Tensor g = log ? grad - y.exp() * sum : y * (grad - sum);
  stack->emplace_back(g.scalar_type() == input_dtype ? g : g.to(input_dtype));
}

// softmax(self, dim, half_to_float) / log_softmax(...)
OpSharding softmax_rule(const OpInfo& info, bool log) {
  const DTensorSpec& in = info.input_spec(0);
  const int64_t dim = wrap_dim(info.arg(1).toInt(), in.ndim());
  if (log && LossParallelGuard::enabled()) {
    // loss_parallel's contract, as PyTorch's: the class dim sharded on exactly one mesh dim, the
    // other mesh dims Shard or Replicate (a log_softmax there is cross_entropy's first step).
    int64_t sharding = 0;
    for (const auto& p : in.placements) sharding += p.is_shard(dim) ? 1 : 0;
    HP_CHECK_T(c10::ValueError, sharding == 1, "hyper_parallel::loss_parallel: loss_parallel() requires exactly one mesh dim to "
               "shard tensor dimension ", dim, ", but got placements ", to_string(in.placements), " with ", sharding,
               " such mesh dim(s); shard the logits on their class dim (e.g. ColwiseParallel(use_local_output=False) on the "
               "output projection), or compute the loss outside loss_parallel()");
    for (size_t i = 0; i < in.placements.size(); ++i)
      HP_CHECK_T(c10::ValueError, in.placements[i].is_shard() || in.placements[i].is_replicate(),
                 "hyper_parallel::loss_parallel: loss_parallel() expects non-TP mesh dims to be Shard or Replicate, got ",
                 in.placements[i].to_string(), " at dim ", i);
  }
  const Placements x = without_partial(in.placements);
  OpSharding s;
  s.input_placements = {x};
  s.output_placements = {x};
  const auto dims = mesh_dims_sharding(x, dim);
  if (dims.empty()) return s;  // the dim is whole on every rank: the local op is exact
  s.handler = "hp::softmax_over_shards";
  s.handler_params = params_of(dim, log, dims);
  return s;
}

// _softmax_backward_data(grad_output, output, dim, input_dtype) and the log variant.
OpSharding softmax_backward_rule(const OpInfo& info, bool log) {
  const DTensorSpec& out = info.input_spec(1);
  const int64_t dim = wrap_dim(info.arg(2).toInt(), out.ndim());
  const Placements x = without_partial(out.placements);
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), x);
  s.output_placements = {x};
  const auto dims = mesh_dims_sharding(x, dim);
  if (dims.empty()) return s;
  if (log && LossParallelGuard::enabled()) {
    // Under loss_parallel the nll loss's backward already gave log_softmax's input gradient
    // (ops/loss.cpp): it passes on in the input's dtype, as in PyTorch.
    s.kernel = kernel_returning([](const torch::jit::Stack& a) {
      const auto dtype = static_cast<at::ScalarType>(a[3].toInt());
      return a[0].toTensor().scalar_type() == dtype ? a[0].toTensor().clone() : a[0].toTensor().to(dtype);
    });
    return s;
  }
  s.handler = "hp::softmax_backward_over_shards";
  s.handler_params = params_of(dim, log, dims);
  return s;
}

struct SoftmaxRegistrar {
  SoftmaxRegistrar() {
    register_op_handler("hp::softmax_over_shards", softmax_over_shards);
    register_op_handler("hp::softmax_backward_over_shards", softmax_backward_over_shards);
    register_sharding_rule("aten::_softmax", [](const OpInfo& i) { return softmax_rule(i, false); });
    register_sharding_rule("aten::_log_softmax", [](const OpInfo& i) { return softmax_rule(i, true); });
    register_sharding_rule("aten::_softmax_backward_data", [](const OpInfo& i) { return softmax_backward_rule(i, false); });
    register_sharding_rule("aten::_log_softmax_backward_data", [](const OpInfo& i) { return softmax_backward_rule(i, true); });
  }
} softmax_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
