#include <hyper_parallel/dtensor/redistribute_plan.h>
#include <hyper_parallel/runtime/errors.h>

namespace hyper_parallel {
namespace {

using Kind = RedistributeStep::Kind;

bool shards(const Placement& p, int64_t d) { return p.is_shard(d); }

// Whether a mesh dimension other than `i` shards tensor dim `d` now or after the redistribution.
bool others_touch(const Placements& cur, const Placements& dst, size_t i, int64_t d) {
  for (size_t k = 0; k < cur.size(); ++k)
    if (k != i && (shards(cur[k], d) || shards(dst[k], d))) return true;
  return false;
}

}  // namespace

std::string RedistributeStep::to_string() const {
  const std::string m = "mesh_dim=" + std::to_string(mesh_dim);
  switch (kind) {
    case Kind::AllGather: return "all_gather(" + m + ", dim=" + std::to_string(dim) + ")";
    case Kind::AllReduce: return std::string("all_reduce(") + m + ", " + reduce_op_name(op) + ")";
    case Kind::ReduceScatter:
      return std::string("reduce_scatter(") + m + ", " + reduce_op_name(op) + ", dim=" + std::to_string(dim) + ")";
    case Kind::AllToAll:
      return "all_to_all(" + m + ", dim " + std::to_string(dim) + " -> " + std::to_string(dim2) + ")";
    case Kind::Chunk: return "chunk(" + m + ", dim=" + std::to_string(dim) + ")";
    case Kind::ToPartial: return std::string("to_partial(") + m + ", " + reduce_op_name(op) + ")";
  }
  return "?";
}

std::vector<RedistributeStep> plan_redistribute(const std::vector<int64_t>& mesh_shape,
                                                const Placements& src, const Placements& dst,
                                                int64_t ndim) {
  const size_t n = mesh_shape.size();
  HP_CHECK_T(c10::ValueError, src.size() == n && dst.size() == n, "hyper_parallel::plan_redistribute: ",
             short_string(src), " -> ", short_string(dst), " needs one placement per mesh dimension (",
             n, ")");
  for (const auto* ps : {&src, &dst})
    for (const auto& p : *ps)
      HP_CHECK_T(c10::ValueError, !p.is_shard() || (p.dim() >= 0 && p.dim() < ndim),
                 "hyper_parallel::plan_redistribute: ", p.short_string(), " is out of range for a tensor with ", ndim,
                 " dimensions");
  std::vector<bool> needs(n);
  for (size_t i = 0; i < n; ++i) {
    needs[i] = src[i] != dst[i];
    HP_CHECK_T(c10::ValueError,
               !(src[i].is_partial() && dst[i].is_partial() && src[i] != dst[i]),
               "hyper_parallel::plan_redistribute: cannot turn ", src[i].short_string(), " into ", dst[i].short_string(),
               " on mesh dim ", i);
  }
  // A change on mesh dim i disturbs later mesh dims that shard the same tensor dims: their
  // pieces nest inside i's, so they go through Replicate too.
  for (size_t i = 0; i < n; ++i) {
    if (!needs[i]) continue;
    for (const Placement* p : {&src[i], &dst[i]}) {
      if (!p->is_shard()) continue;
      for (size_t j = i + 1; j < n; ++j)
        if (shards(src[j], p->dim()) || shards(dst[j], p->dim())) needs[j] = true;
    }
  }

  std::vector<RedistributeStep> steps;
  Placements cur = src;
  auto emit = [&](Kind k, size_t i, int64_t dim, int64_t dim2, ReduceOp op, Placement after) {
    cur[i] = after;
    steps.push_back({k, static_cast<int64_t>(i), dim, dim2, op, cur});
  };
  // Unshard / reduce from the innermost mesh dimension outwards.
  for (size_t ii = n; ii-- > 0;) {
    const size_t i = ii;
    if (!needs[i]) continue;
    const Placement c = cur[i], d = dst[i];
    if (c.is_shard()) {
      if (d.is_shard() && !others_touch(cur, dst, i, c.dim()) && !others_touch(cur, dst, i, d.dim()))
        emit(Kind::AllToAll, i, c.dim(), d.dim(), ReduceOp::SUM, d);
      else
        emit(Kind::AllGather, i, c.dim(), -1, ReduceOp::SUM, Replicate());
    } else if (c.is_partial()) {
      if (d.is_shard() && !others_touch(cur, dst, i, d.dim()))
        emit(Kind::ReduceScatter, i, d.dim(), -1, c.reduce_op(), d);
      else
        emit(Kind::AllReduce, i, -1, -1, c.reduce_op(), Replicate());
    }
  }
  // Reshard from the outermost mesh dimension inwards.
  for (size_t i = 0; i < n; ++i) {
    if (cur[i] == dst[i]) continue;
    TORCH_INTERNAL_ASSERT(cur[i].is_replicate(), "redistribute plan: unexpected ", cur[i].to_string());
    if (dst[i].is_shard())
      emit(Kind::Chunk, i, dst[i].dim(), -1, ReduceOp::SUM, dst[i]);
    else
      emit(Kind::ToPartial, i, -1, -1, dst[i].reduce_op(), dst[i]);
  }
  return steps;
}

}  // namespace hyper_parallel
