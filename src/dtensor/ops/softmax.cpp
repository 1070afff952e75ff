// softmax / log_softmax and their backwards. Over a sharded dim (the vocabulary of logits kept
// Shard(-1) for loss parallelism) they run in parallel: a max and a sum all-reduced over the
// shards instead of gathering the dim.
#include "rule_utils.h"

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

// softmax(self, dim, half_to_float) / log_softmax(...)
OpSharding softmax_rule(const OpInfo& info, bool log) {
  const DTensorSpec& in = *info.spec(0);
  const int64_t dim = wrap_dim(info.arg(1).toInt(), in.ndim());
  const Placements x = without_partial(in.placements);
  OpSharding s;
  s.input_placements = {x};
  s.output_placements = {x};
  const auto dims = mesh_dims_sharding(x, dim);
  if (dims.empty()) return s;  // the dim is whole on every rank: the local op is exact
  s.kernel = kernel_returning(info.num_args(), [dim, dims, log](const torch::jit::Stack& a, const DeviceMesh& mesh) {
    at::Tensor x = a[0].toTensor();
    if (a[2].toBool()) x = x.to(at::kFloat);  // half_to_float
    at::Tensor m = x.size(dim) > 0 ? std::get<0>(x.max(dim, /*keepdim=*/true))
                                   : at::full({}, -std::numeric_limits<double>::infinity(), x.options()).expand_as(x.sum(dim, true)).clone();
    all_reduce_over(m, ReduceOp::MAX, mesh, dims);
    at::Tensor e = (x - m).exp();
    at::Tensor sum = e.sum(dim, /*keepdim=*/true);
    all_reduce_over(sum, ReduceOp::SUM, mesh, dims);
    return log ? x - m - sum.log() : e / sum;
  });
  return s;
}

// _softmax_backward_data(grad_output, output, dim, input_dtype) and the log variant.
OpSharding softmax_backward_rule(const OpInfo& info, bool log) {
  const DTensorSpec& out = *info.spec(1);
  const int64_t dim = wrap_dim(info.arg(2).toInt(), out.ndim());
  const Placements x = without_partial(out.placements);
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), x);
  s.output_placements = {x};
  const auto dims = mesh_dims_sharding(x, dim);
  if (dims.empty()) return s;
  s.kernel = kernel_returning(info.num_args(), [dim, dims, log](const torch::jit::Stack& a, const DeviceMesh& mesh) {
    const at::Tensor& grad = a[0].toTensor();
    const at::Tensor& y = a[1].toTensor();
    const auto input_dtype = static_cast<at::ScalarType>(a[3].toInt());
    at::Tensor sum = (log ? grad : grad * y).sum(dim, /*keepdim=*/true);
    all_reduce_over(sum, ReduceOp::SUM, mesh, dims);
    at::Tensor g = log ? grad - y.exp() * sum : y * (grad - sum);
    return g.scalar_type() == input_dtype ? g : g.to(input_dtype);
  });
  return s;
}

struct Registrar {
  Registrar() {
    register_sharding_rule("aten::_softmax", [](const OpInfo& i) { return softmax_rule(i, false); });
    register_sharding_rule("aten::_log_softmax", [](const OpInfo& i) { return softmax_rule(i, true); });
    register_sharding_rule("aten::_softmax_backward_data", [](const OpInfo& i) { return softmax_backward_rule(i, false); });
    register_sharding_rule("aten::_log_softmax_backward_data", [](const OpInfo& i) { return softmax_backward_rule(i, true); });
  }
} registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
