// Losses: nll_loss (what cross_entropy decomposes into) with the class dim sharded runs in
// parallel (loss parallelism: each rank scores the targets in its vocabulary range, the loss is
// Partial); otherwise losses run on replicated inputs.
#include "rule_utils.h"

namespace hyper_parallel {
namespace ops {
namespace {

OpSharding all_replicated(const OpInfo& info) {
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), replicate(info));
  s.output_placements.assign(info.schema().returns().size(), replicate(info));
  return s;
}

// The classes this rank holds: [begin, begin + size) of dim 1 of `self` laid out by `p`.
std::pair<int64_t, int64_t> class_range(const OpInfo& info, const DTensorSpec& self, const Placements& p) {
  auto [shape, offset] = compute_local_shape_and_offset(self.shape, info.mesh_shape(), info.coordinate(), p);
  return {offset[1], shape[1]};
}

// Targets outside [begin, begin + size), and ignored ones, become -1, the local ignore_index.
at::Tensor local_targets(const at::Tensor& target, int64_t begin, int64_t size, int64_t ignore_index) {
  // bitwise_or: it has a meta kernel (logical_or has none in C++), the same on bools.
  at::Tensor outside = (target < begin).bitwise_or_(target >= begin + size).bitwise_or_(target == ignore_index);
  return (target - begin).masked_fill_(outside, -1);
}

// Whether nll_loss on these inputs can run class-parallel: 2-D input with the class dim sharded
// and no class weights (they would have to be sharded alike).
bool class_parallel(const OpInfo& info, size_t self_arg, size_t weight_arg, Placements& self_p) {
  const DTensorSpec& self = info.input_spec(self_arg);
  const c10::IValue& w = info.arg(weight_arg);
  const bool weighted = !w.isNone() && !(w.isTensor() && !w.toTensor().defined());
  if (self.ndim() != 2 || weighted) return false;
  self_p = without_partial(without_shards(self.placements, [](int64_t d) { return d != 1; }));
  for (const auto& p : self_p)
    if (p.is_shard(1)) return true;
  return false;
}

// nll_loss_forward(self, target, weight, reduction, ignore_index) -> (output, total_weight)
OpSharding nll_forward_rule(const OpInfo& info) {
  Placements self_p;
  if (!class_parallel(info, 0, 2, self_p)) return all_replicated(info);
  const DTensorSpec& self = info.input_spec(0);
  Placements loss_p(self_p.size());
  for (size_t i = 0; i < self_p.size(); ++i) loss_p[i] = self_p[i].is_shard(1) ? Partial() : Replicate();
  OpSharding s;
  for (const auto& in : info.inputs()) s.input_placements.push_back(in.arg == 0 ? self_p : replicate(info));
  s.output_placements = {loss_p, replicate(info)};
  const int64_t reduction = info.arg(3).toInt();
  s.output_shapes = {reduction == at::Reduction::None ? std::vector<int64_t>{self.shape[0]} : std::vector<int64_t>{},
                     std::vector<int64_t>{}};
  const auto [begin, size] = class_range(info, self, self_p);
  s.kernel = [begin = begin, size = size](const c10::OperatorHandle&, torch::jit::Stack* stack) {
    torch::jit::Stack a(stack->end() - 5, stack->end());
    stack->erase(stack->end() - 5, stack->end());
    const at::Tensor& x = a[0].toTensor();
    const at::Tensor& target = a[1].toTensor();
    const int64_t reduction = a[3].toInt(), ignore_index = a[4].toInt();
    at::Tensor t = local_targets(target, begin, size, ignore_index);
    // Every rank counts the same (replicated) targets: the mean divides by the global count.
    at::Tensor count = (target != ignore_index).sum().to(x.scalar_type());
    at::Tensor out;
    if (reduction == at::Reduction::None) {
      out = std::get<0>(at::nll_loss_forward(x, t, {}, at::Reduction::None, -1));
    } else {
      out = std::get<0>(at::nll_loss_forward(x, t, {}, at::Reduction::Sum, -1));
      if (reduction == at::Reduction::Mean) out = out / count;
    }
    stack->emplace_back(out);
    stack->emplace_back(count);
  };
  return s;
}

// nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)
OpSharding nll_backward_rule(const OpInfo& info) {
  Placements self_p;
  if (!class_parallel(info, 1, 3, self_p)) return all_replicated(info);
  const DTensorSpec& self = info.input_spec(1);
  OpSharding s;
  for (const auto& in : info.inputs()) s.input_placements.push_back(in.arg == 1 ? self_p : replicate(info));
  s.output_placements = {self_p};
  s.output_shapes = {self.shape};
  const auto [begin, size] = class_range(info, self, self_p);
  s.kernel = kernel_returning([begin = begin, size = size](const torch::jit::Stack& a) {
    at::Tensor t = local_targets(a[2].toTensor(), begin, size, a[5].toInt());
    // total_weight is the global count, so the mean's scale is the single-device one.
    return at::nll_loss_backward(a[0].toTensor(), a[1].toTensor(), t, {}, a[4].toInt(), -1, a[6].toTensor());
  });
  return s;
}

struct LossRegistrar {
  LossRegistrar() {
    register_sharding_rule("aten::nll_loss_forward", nll_forward_rule);
    register_sharding_rule("aten::nll_loss_backward", nll_backward_rule);
    for (const char* n : {"aten::mse_loss", "aten::binary_cross_entropy"}) register_sharding_rule(n, all_replicated);
    // No meta kernels in libtorch 1.13: the rules give the shapes.
    for (const char* n : {"aten::mse_loss_backward", "aten::binary_cross_entropy_backward", "aten::nll_loss2d_backward"})
      register_sharding_rule(n, [](const OpInfo& i) {  // (grad_output, self, ...) -> like self
        OpSharding s = all_replicated(i);
        s.output_shapes = {i.input_spec(1).shape};
        return s;
      });
    // nll_loss2d_forward(self [N,C,H,W], target [N,H,W], weight, reduction, ignore_index) -> (output, total_weight)
    register_sharding_rule("aten::nll_loss2d_forward", [](const OpInfo& i) {
      OpSharding s = all_replicated(i);
      const int64_t reduction = i.arg(3).toInt();
      const DTensorSpec* target = i.spec(1);
      std::vector<int64_t> out = reduction == 0 && target != nullptr ? target->shape : std::vector<int64_t>{};
      s.output_shapes = {out, {}};
      return s;
    });
  }
} loss_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
