#pragma once
// Helpers shared by the sharding rules of every op family.
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include <hyper_parallel/dtensor/sharding_rule.h>
#include <hyper_parallel/runtime/errors.h>

namespace hyper_parallel {
namespace ops {

using Kernel = std::function<void(const c10::OperatorHandle&, torch::jit::Stack*)>;

/// All-Replicate placements for the op's mesh.
inline Placements replicate(const OpInfo& info) {
  return Placements(static_cast<size_t>(info.mesh_ndim()), Replicate());
}

/// `p` with every Shard(d) for which `unshard(d)` holds turned into Replicate.
inline Placements without_shards(Placements p, const std::function<bool(int64_t)>& unshard) {
  for (auto& x : p)
    if (x.is_shard() && unshard(x.dim())) x = Replicate();
  return p;
}

/// Shard dims mapped through `map` (-1: the dim disappears, so the mesh dim must be Replicate
/// on the input; callers unshard those first).
inline Placements map_shard_dims(Placements p, const std::function<int64_t(int64_t)>& map) {
  for (auto& x : p)
    if (x.is_shard()) {
      const int64_t d = map(x.dim());
      x = d < 0 ? Replicate() : Shard(d);
    }
  return p;
}

/// Local sizes of `global_shape` under `placements` on this rank.
inline std::vector<int64_t> local_shape(const OpInfo& info, const Placements& placements,
                                        const std::vector<int64_t>& global_shape) {
  return compute_local_shape_and_offset(global_shape, info.mesh_shape(), info.coordinate(), placements).first;
}

/// Whether every mesh dim sharding a dim does so evenly.
inline bool evenly_sharded(const OpInfo& info, const DTensorSpec& spec, int64_t dim) {
  int64_t parts = 1;
  for (size_t i = 0; i < spec.placements.size(); ++i)
    if (spec.placements[i].is_shard(dim)) parts *= info.mesh_shape()[i];
  return spec.shape[static_cast<size_t>(dim)] % parts == 0;
}

/// A dimension argument of an op (a 0-dim tensor has dim 0 and -1, as in PyTorch).
inline int64_t wrap_dim(int64_t d, int64_t ndim) { return hyper_parallel::wrap_dim(d, ndim, "dispatch", "a tensor", true); }

/// Pops the op's local arguments off `stack` (returned) for a kernel or handler that computes
/// one result and pushes it.
inline torch::jit::Stack pop_args(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto nargs = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  torch::jit::Stack args(stack->end() - nargs, stack->end());
  stack->erase(stack->end() - nargs, stack->end());
  return args;
}

/// A kernel that pops the op's local arguments, computes one result from them, and pushes it.
inline Kernel kernel_returning(std::function<at::Tensor(const torch::jit::Stack&)> fn) {
  return [fn = std::move(fn)](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const torch::jit::Stack args = pop_args(op, stack);
    stack->emplace_back(fn(args));
  };
}

/// The op's integer-list argument `i` (None -> empty).
inline std::vector<int64_t> int_list(const OpInfo& info, size_t i) {
  const auto& v = info.arg(i);
  if (v.isNone()) return {};
  if (v.isInt()) return {v.toInt()};
  return v.toIntVector();
}

/// The op's argument named `name`, or nullptr when its schema has none.
inline const c10::IValue* arg_named(const OpInfo& info, const char* name) {
  const auto& args = info.schema().arguments();
  for (size_t a = 0; a < args.size(); ++a)
    if (args[a].name() == name) return &info.arg(a);
  return nullptr;
}

/// The broadcast shape of the given shapes.
std::vector<int64_t> broadcast_shape(const std::vector<const std::vector<int64_t>*>& shapes);

}  // namespace ops
}  // namespace hyper_parallel
