// Losses: nll_loss and nll_loss2d (what cross_entropy decomposes into) with the class dim sharded
// run in parallel (loss parallelism, PyTorch's loss_parallel semantics): each rank scores the
// targets in its class range and the loss is all-reduced over the mesh dim sharding the classes;
// the other mesh dims keep their batch (or sequence) sharding, the target sharded alike, so a
// summed loss is Partial there and a per-element one sharded. Otherwise losses run on replicated
// inputs.
#include "rule_utils.h"

#include <hyper_parallel/dtensor/loss_parallel.h>
#include <hyper_parallel/runtime/collectives.h>

namespace hyper_parallel {
namespace ops {
namespace {

OpSharding all_replicated(const OpInfo& info) {
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), replicate(info));
  s.output_placements.assign(info.schema().returns().size(), replicate(info));
  return s;
}

// Targets outside [begin, begin + size), and ignored ones, become -1, the local ignore_index.
at::Tensor local_targets(const at::Tensor& target, int64_t begin, int64_t size, int64_t ignore_index) {
  // bitwise_or: it has a meta kernel (logical_or has none in C++), the same on bools.
  at::Tensor outside = (target < begin).bitwise_or_(target >= begin + size).bitwise_or_(target == ignore_index);
  return (target - begin).masked_fill_(outside, -1);
}

// How the input [N, C, ...] of an nll loss is laid out for a class-parallel run.
struct ClassParallel {
  int64_t class_dim = -1;       // the mesh dim sharding the classes (dim 1)
  Placements input;             // the input's placements: classes on class_dim, the rest Shard(d != 1) or Replicate
  Placements target;            // the target's (the input's without the class dim)
  std::vector<int64_t> batch;   // the mesh dims sharding another dim than the classes
};

// The layout a class-parallel nll loss runs in, or nullopt (no mesh dim shards the classes).
c10::optional<ClassParallel> class_parallel(const DTensorSpec& self) {
  if (self.ndim() < 2) return c10::nullopt;
  ClassParallel c;
  c.input = self.placements;
  c.target = Placements(self.placements.size(), Replicate());
  for (size_t i = 0; i < c.input.size(); ++i) {
    const Placement& p = c.input[i];
    if (p.is_shard(1)) {
      if (c.class_dim >= 0) return c10::nullopt;  // classes split twice: gathered below
      c.class_dim = static_cast<int64_t>(i);
    } else if (p.is_shard()) {
      c.batch.push_back(static_cast<int64_t>(i));
      c.target[i] = Shard(p.dim() > 1 ? p.dim() - 1 : p.dim());
    } else {
      c.input[i] = Replicate();  // a Partial input is reduced first
    }
  }
  if (c.class_dim < 0) return c10::nullopt;
  return c;
}

bool has_weight(const c10::IValue& w) { return !w.isNone() && !(w.isTensor() && !w.toTensor().defined()); }

// Each target's class weight (without weights: true), 0 for an ignored target.
at::Tensor target_weights(const at::Tensor& target, const at::Tensor& weight, int64_t ignore_index) {
  const at::Tensor kept = target != ignore_index;
  if (!weight.defined()) return kept;
  return weight.index_select(0, target.masked_fill(~kept, 0).flatten()).view(target.sizes()) * kept;
}

// The handlers' parameters: {class begin, class count, class mesh dim, batch mesh dims...}.
std::vector<int64_t> params_of(const OpInfo& info, const DTensorSpec& self, const ClassParallel& c) {
  auto [shape, offset] = compute_local_shape_and_offset(self.shape, info.mesh_shape(), info.coordinate(), c.input);
  std::vector<int64_t> p{offset[1], shape[1], c.class_dim};
  p.insert(p.end(), c.batch.begin(), c.batch.end());
  return p;
}

// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index)
//   -> (output, total_weight), over the local classes, reduced over the classes' mesh dim; a mean
// divides by the whole batch's total weight (reduced over the batch's mesh dims too).
void nll_forward_over_shards(const c10::OperatorHandle& op, torch::jit::Stack* stack, const DeviceMesh& mesh,
                             const std::vector<int64_t>& params) {
  const torch::jit::Stack a = pop_args(op, stack);
  const int64_t begin = params[0], size = params[1], class_dim = params[2];
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& target = a[1].toTensor();
  const at::Tensor weight = has_weight(a[2]) ? a[2].toTensor() : at::Tensor();
  const int64_t reduction = a[3].toInt(), ignore_index = a[4].toInt();
  const at::Tensor t = local_targets(target, begin, size, ignore_index);
  const at::Tensor w = weight.defined() ? weight.narrow(0, begin, size) : at::Tensor();
  // Every rank of the classes' group holds the same targets: the weight of the targets counted.
  at::Tensor total = target_weights(target, weight, ignore_index).sum().to(x.scalar_type());
  for (size_t i = 3; i < params.size(); ++i) all_reduce_(total, ReduceOp::SUM, mesh.get_group(params[i]));
  const int64_t r = reduction == at::Reduction::None ? at::Reduction::None : at::Reduction::Sum;
  at::Tensor out = std::get<0>(x.dim() == 4 ? at::nll_loss2d_forward(x, t, w, r, -1) : at::nll_loss_forward(x, t, w, r, -1));
  all_reduce_(out, ReduceOp::SUM, mesh.get_group(class_dim));
  if (reduction == at::Reduction::Mean) out = out / total;
  stack->emplace_back(out);
  stack->emplace_back(total);
}

// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index)
OpSharding nll_forward_rule(const OpInfo& info) {
  const DTensorSpec& self = info.input_spec(0);
  const auto c = class_parallel(self);
  const int64_t reduction = info.arg(3).toInt();
  const bool two_d = info.name() == "aten::nll_loss2d_forward";
  if (!c) {
    OpSharding s = all_replicated(info);
    if (two_d) {  // no meta kernel in libtorch 1.13: the shapes
      const DTensorSpec* target = info.spec(1);
      s.output_shapes = {reduction == 0 && target != nullptr ? target->shape : std::vector<int64_t>{}, {}};
    }
    return s;
  }
  Placements loss(c->target.size(), Replicate());
  for (int64_t i : c->batch) loss[static_cast<size_t>(i)] = reduction == at::Reduction::None ? c->target[static_cast<size_t>(i)] : Partial();
  OpSharding s;
  for (const auto& in : info.inputs())
    s.input_placements.push_back(in.arg == 0 ? c->input : in.arg == 1 ? c->target : replicate(info));
  s.output_placements = {loss, replicate(info)};
  std::vector<int64_t> per_element = self.shape;
  per_element.erase(per_element.begin() + 1);
  s.output_shapes = {reduction == at::Reduction::None ? per_element : std::vector<int64_t>{}, std::vector<int64_t>{}};
  s.handler = "hp::nll_forward_over_shards";
  s.handler_params = params_of(info, self, *c);
  return s;
}

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight, reduction,
// ignore_index, total_weight): local, the gradient laid out as self (no communication).
OpSharding nll_backward_rule(const OpInfo& info) {
  const DTensorSpec& self = info.input_spec(1);
  const auto c = class_parallel(self);
  if (!c) {
    OpSharding s = all_replicated(info);
    s.output_shapes = {self.shape};
    return s;
  }
  const int64_t reduction = info.arg(4).toInt();
  OpSharding s;
  for (const auto& in : info.inputs()) {
    if (in.arg == 0) s.input_placements.push_back(reduction == at::Reduction::None ? c->target : replicate(info));
    else if (in.arg == 1) s.input_placements.push_back(c->input);
    else if (in.arg == 2) s.input_placements.push_back(c->target);
    else s.input_placements.push_back(replicate(info));
  }
  s.output_placements = {c->input};
  s.output_shapes = {self.shape};
  const std::vector<int64_t> p = params_of(info, self, *c);
  const int64_t begin = p[0], size = p[1];
  const bool two_d = info.name() == "aten::nll_loss2d_backward";
  // Under loss_parallel, as PyTorch's: self is log_softmax's output and this returns the gradient
  // of log_softmax and nll together (log_softmax's backward then passes it on), which needs no
  // all-reduce: a row's gradient sums over all classes to -w[target] * grad, known on every rank.
  const bool fused = LossParallelGuard::enabled();
  s.kernel = kernel_returning([begin, size, two_d, fused](const torch::jit::Stack& a) {
    const at::Tensor& go = a[0].toTensor();
    const at::Tensor& y = a[1].toTensor();
    const at::Tensor& target = a[2].toTensor();
    const int64_t reduction = a[4].toInt(), ignore_index = a[5].toInt();
    const at::Tensor& total = a[6].toTensor();
    const at::Tensor t = local_targets(target, begin, size, ignore_index);
    const at::Tensor weight = has_weight(a[3]) ? a[3].toTensor() : at::Tensor();
    const at::Tensor w = weight.defined() ? weight.narrow(0, begin, size) : at::Tensor();
    // total_weight is the whole batch's, so a mean's scale is the single-device one.
    at::Tensor g = two_d ? at::nll_loss2d_backward(go, y, t, w, reduction, -1, total) : at::nll_loss_backward(go, y, t, w, reduction, -1, total);
    if (!fused) return g;
    at::Tensor row = target_weights(target, weight, ignore_index) * go;  // a per-element grad_output, or a scalar one
    if (reduction == at::Reduction::Mean) row = row / total;
    return g + y.exp() * row.unsqueeze(1);
  });
  return s;
}

struct LossRegistrar {
  LossRegistrar() {
    register_op_handler("hp::nll_forward_over_shards", nll_forward_over_shards);
    for (const char* n : {"aten::nll_loss_forward", "aten::nll_loss2d_forward"}) register_sharding_rule(n, nll_forward_rule);
    for (const char* n : {"aten::nll_loss_backward", "aten::nll_loss2d_backward"}) register_sharding_rule(n, nll_backward_rule);
    for (const char* n : {"aten::mse_loss", "aten::binary_cross_entropy"}) register_sharding_rule(n, all_replicated);
    // No meta kernels in libtorch 1.13: the rules give the shapes.
    for (const char* n : {"aten::mse_loss_backward", "aten::binary_cross_entropy_backward"})
      register_sharding_rule(n, [](const OpInfo& i) {  // (grad_output, self, ...) -> like self
        OpSharding s = all_replicated(i);
        s.output_shapes = {i.input_spec(1).shape};
        return s;
      });
  }
} loss_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
