// Reductions (sum, mean, amax, amin, all/any, norms).
#include "rule_utils.h"

#include <ATen/Dispatch.h>

#include <limits>

namespace hyper_parallel {
namespace ops {
namespace {

enum class Reduce { Sum, Mean, Max, Min, Replicated };

// max/min (amax/amin) on the local piece: a rank whose piece of a reduced dim is empty
// (torch.chunk leaves trailing ranks nothing) contributes the reduction's identity instead of
// failing alone while its peers go on.
Kernel empty_piece_identity(bool is_max, size_t nargs, bool has_dims) {
  return [is_max, nargs, has_dims](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const at::Tensor self = (*stack)[stack->size() - nargs].toTensor();  // a copy: the stack is popped below
    const auto dims = has_dims ? (*stack)[stack->size() - nargs + 1].toIntVector() : std::vector<int64_t>{};
    const bool keep = has_dims && (*stack)[stack->size() - nargs + 2].toBool();
    std::vector<bool> red(static_cast<size_t>(self.dim()), dims.empty());
    for (int64_t d : dims) red[static_cast<size_t>(wrap_dim(d, self.dim()))] = true;
    bool empty = false;
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < self.dim(); ++d) {
      if (!red[static_cast<size_t>(d)]) shape.push_back(self.size(d));
      else {
        empty = empty || self.size(d) == 0;
        if (keep) shape.push_back(1);
      }
    }
    if (!empty) return op.callBoxed(stack);
    stack->erase(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end());
    at::Tensor identity = at::empty(shape, self.options());
    if (self.scalar_type() == at::kBool) identity.fill_(!is_max);
    else if (at::isFloatingType(self.scalar_type()))
      identity.fill_(is_max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity());
    else
      AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "amax_identity", [&] {
        identity.fill_(is_max ? std::numeric_limits<scalar_t>::lowest() : std::numeric_limits<scalar_t>::max());
      });
    stack->emplace_back(identity);
  };
}

// `dim_arg`: index of the dims argument (-1: reduces every dim); `keepdim_arg` likewise.
OpSharding reduction_rule(const OpInfo& info, Reduce kind, int64_t dim_arg, int64_t keepdim_arg) {
  const DTensorSpec& in = info.input_spec(0);
  const int64_t nd = in.ndim();
  std::vector<bool> reduced(static_cast<size_t>(nd), dim_arg < 0);
  if (dim_arg >= 0) {
    auto dims = int_list(info, static_cast<size_t>(dim_arg));
    if (dims.empty()) reduced.assign(static_cast<size_t>(nd), true);
    for (int64_t d : dims) reduced[static_cast<size_t>(wrap_dim(d, nd))] = true;
  }
  const bool keepdim = keepdim_arg >= 0 && info.arg(static_cast<size_t>(keepdim_arg)).toBool();
  auto out_dim = [&](int64_t d) {
    if (keepdim) return d;
    int64_t shift = 0;
    for (int64_t k = 0; k < d; ++k) shift += reduced[static_cast<size_t>(k)];
    return d - shift;
  };
  Placements want = in.placements, out(in.placements.size());
  for (size_t i = 0; i < in.placements.size(); ++i) {
    const Placement& p = in.placements[i];
    if (p.is_shard() && !reduced[static_cast<size_t>(p.dim())]) {
      out[i] = Shard(out_dim(p.dim()));
    } else if (p.is_shard()) {
      // Reducing over a sharded dim: each rank reduces its piece; the pieces combine later.
      switch (kind) {
        case Reduce::Sum: out[i] = Partial(ReduceOp::SUM); break;
        case Reduce::Max: out[i] = Partial(ReduceOp::MAX); break;
        case Reduce::Min: out[i] = Partial(ReduceOp::MIN); break;
        case Reduce::Mean:
          if (evenly_sharded(info, in, p.dim())) out[i] = Partial(ReduceOp::AVG);
          else { want[i] = Replicate(); out[i] = Replicate(); }
          break;
        case Reduce::Replicated: want[i] = Replicate(); out[i] = Replicate(); break;
      }
    } else if (p.is_partial()) {
      // sum and mean are linear in a Partial(sum) input; the others need the value.
      if ((kind == Reduce::Sum || kind == Reduce::Mean) && p.reduce_op() == ReduceOp::SUM) out[i] = p;
      else { want[i] = Replicate(); out[i] = Replicate(); }
    } else {
      out[i] = Replicate();
    }
  }
  // Mean over a sharded dim of a Partial elsewhere mixes two reductions: keep it simple.
  bool has_avg = false, has_other_partial = false;
  for (const auto& p : out) {
    has_avg = has_avg || (p.is_partial() && p.reduce_op() == ReduceOp::AVG);
    has_other_partial = has_other_partial || (p.is_partial() && p.reduce_op() != ReduceOp::AVG);
  }
  if (has_avg && has_other_partial) {
    want = without_partial(without_shards(in.placements, [&](int64_t d) { return reduced[static_cast<size_t>(d)]; }));
    for (size_t i = 0; i < out.size(); ++i) out[i] = want[i].is_shard() ? Shard(out_dim(want[i].dim())) : Replicate();
  }
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), replicate(info));
  s.input_placements[0] = want;
  s.output_placements.assign(info.schema().returns().size(), out);
  // The reduced shape, for every return (values and indices alike): several of these ops have no
  // meta kernel in libtorch 1.13.
  std::vector<int64_t> out_shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[static_cast<size_t>(d)]) out_shape.push_back(in.shape[static_cast<size_t>(d)]);
    else if (keepdim) out_shape.push_back(1);
  }
  size_t tensor_returns = 0;
  for (const auto& r : info.schema().returns()) tensor_returns += r.type()->kind() == c10::TypeKind::TensorType;
  s.output_shapes.assign(tensor_returns, out_shape);
  if (kind == Reduce::Max || kind == Reduce::Min) {
    s.kernel = empty_piece_identity(kind == Reduce::Max, info.num_args(), dim_arg >= 0);
  }
  return s;
}

struct ReductionRegistrar {
  ReductionRegistrar() {
    register_sharding_rule("aten::sum", [](const OpInfo& i) { return reduction_rule(i, Reduce::Sum, -1, -1); });
    register_sharding_rule("aten::sum.dim_IntList", [](const OpInfo& i) { return reduction_rule(i, Reduce::Sum, 1, 2); });
    register_sharding_rule("aten::mean", [](const OpInfo& i) { return reduction_rule(i, Reduce::Mean, -1, -1); });
    register_sharding_rule("aten::mean.dim", [](const OpInfo& i) { return reduction_rule(i, Reduce::Mean, 1, 2); });
    register_sharding_rule("aten::amax", [](const OpInfo& i) { return reduction_rule(i, Reduce::Max, 1, 2); });
    register_sharding_rule("aten::amin", [](const OpInfo& i) { return reduction_rule(i, Reduce::Min, 1, 2); });
    // Boolean and norm reductions: computed on the whole tensor.
    register_sharding_rule("aten::all", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, -1, -1); });
    register_sharding_rule("aten::any", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, -1, -1); });
    register_sharding_rule("aten::all.dim", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 2); });
    register_sharding_rule("aten::any.dim", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 2); });
    register_sharding_rule("aten::linalg_vector_norm", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 2, 3); });
    // Whole-tensor max/min: each rank's piece, combined as Partial(max/min).
    register_sharding_rule("aten::max", [](const OpInfo& i) { return reduction_rule(i, Reduce::Max, -1, -1); });
    register_sharding_rule("aten::min", [](const OpInfo& i) { return reduction_rule(i, Reduce::Min, -1, -1); });
    // Reductions that need the whole reduced dims (values with indices, second moments, norms):
    // other dims keep their shards.
    register_sharding_rule("aten::max.dim", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 2); });
    register_sharding_rule("aten::min.dim", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 2); });
    register_sharding_rule("aten::argmax", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 2); });
    register_sharding_rule("aten::argmin", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 2); });
    register_sharding_rule("aten::var.correction", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 3); });
    register_sharding_rule("aten::std.correction", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 3); });
    register_sharding_rule("aten::logsumexp", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 1, 2); });
    register_sharding_rule("aten::norm.Scalar", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, -1, -1); });
    register_sharding_rule("aten::norm.ScalarOpt_dim", [](const OpInfo& i) { return reduction_rule(i, Reduce::Replicated, 2, 3); });
  }
} reduction_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
