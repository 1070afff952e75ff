#include "redistribute.h"

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/redistribute_plan.h>
#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collectives.h>

namespace hyper_parallel {
namespace {

// Size of tensor dim `d` that the group of mesh dim `mesh_dim` holds together: the global size
// split by the mesh dims before it that shard `d`.
int64_t level_size(const DTensorSpec& spec, const Placements& cur, int64_t mesh_dim, int64_t d,
                   const std::vector<int64_t>& coord) {
  int64_t n = spec.shape[static_cast<size_t>(d)];
  for (int64_t k = 0; k < mesh_dim; ++k)
    if (cur[static_cast<size_t>(k)].is_shard(d))
      n = chunk_size(n, spec.mesh.size(k), coord[static_cast<size_t>(k)]);
  return n;
}

}  // namespace

std::string describe_redistribution(const DTensorSpec& src, const std::vector<RedistributeStep>& steps) {
  if (steps.empty()) return short_string(src.placements) + " (unchanged)";
  std::string s = short_string(src.placements) + " -> " + short_string(steps.back().after) + ":";
  const auto coord = src.mesh.get_coordinate();
  const auto& names = src.mesh.mesh_dim_names();
  const int64_t elem = static_cast<int64_t>(c10::elementSize(src.dtype));
  Placements cur = src.placements;
  for (size_t i = 0; i < steps.size(); ++i) {
    const RedistributeStep& st = steps[i];
    const size_t md = static_cast<size_t>(st.mesh_dim);
    const std::string over = md < names.size() && !names[md].empty() ? names[md] : "mesh dim " + std::to_string(md);
    int64_t bytes = elem;
    if (coord)
      for (int64_t n : compute_local_shape_and_offset(src.shape, src.mesh.shape(), *coord, cur).first) bytes *= n;
    const char* kind = "";
    switch (st.kind) {
      case RedistributeStep::Kind::AllGather: kind = "all_gather"; break;
      case RedistributeStep::Kind::AllReduce: kind = "all_reduce"; break;
      case RedistributeStep::Kind::ReduceScatter: kind = "reduce_scatter"; break;
      case RedistributeStep::Kind::AllToAll: kind = "all_to_all"; break;
      case RedistributeStep::Kind::Chunk: kind = "chunk"; break;
      case RedistributeStep::Kind::ToPartial: kind = "to_partial"; break;
    }
    const bool local = st.kind == RedistributeStep::Kind::Chunk || st.kind == RedistributeStep::Kind::ToPartial;
    s += std::string(i ? "," : "") + " " + kind + " over " + over + (local ? " (local)" : " (" + std::to_string(bytes) + " B)");
    cur = st.after;
  }
  return s;
}

std::shared_ptr<const DTensorSpec> spec_with_placements(const DTensorSpec& spec, Placements placements) {
  auto s = std::make_shared<DTensorSpec>(spec);
  s->placements = std::move(placements);
  return s;
}

at::Tensor local_piece_of_whole(const at::Tensor& whole, const std::vector<int64_t>& mesh_shape,
                                const std::vector<int64_t>& coordinate, const Placements& placements) {
  const auto [shape, offset] = compute_local_shape_and_offset(whole.sizes().vec(), mesh_shape, coordinate, placements);
  at::Tensor t = whole;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != whole.size(static_cast<int64_t>(d))) t = t.narrow(static_cast<int64_t>(d), offset[d], shape[d]);
  for (size_t i = 0; i < placements.size(); ++i)
    if (placements[i].is_partial() && placements[i].reduce_op() == ReduceOp::SUM && coordinate[i] != 0) return at::zeros_like(t);
  return t;
}

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src, const Placements& dst) {
  if (src.placements == dst) return local;
  return redistribute_local(local, src, plan_redistribute(src.mesh.shape(), src.placements, dst, src.ndim()));
}

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src, const std::vector<RedistributeStep>& steps) {
  if (steps.empty()) return local;
  const auto coord_opt = src.mesh.get_coordinate();
  TORCH_CHECK(coord_opt.has_value(), "hyper_parallel::DTensor::redistribute: this rank is not part of ", src.mesh.to_string());
  const auto& coord = *coord_opt;
  at::Tensor t = local;
  Placements cur = src.placements;
  using Kind = RedistributeStep::Kind;
  for (const auto& s : steps) {
    const auto i = static_cast<size_t>(s.mesh_dim);
    // A mesh dim of size 1 holds the whole tensor on its only rank in every placement.
    if (src.mesh.size(s.mesh_dim) == 1) {
      cur = s.after;
      continue;
    }
    const Group& g = src.mesh.get_group(s.mesh_dim);
    switch (s.kind) {
      case Kind::AllGather:
        t = all_gather(t, s.dim, g, level_size(src, cur, s.mesh_dim, s.dim, coord));
        break;
      case Kind::AllReduce:
        t = all_reduce(t, s.op, g);
        break;
      case Kind::ReduceScatter:
        t = reduce_scatter(t, s.op, s.dim, g);
        break;
      case Kind::AllToAll:
        t = all_to_all(t, /*split_dim=*/s.dim2, /*concat_dim=*/s.dim, g,
                       level_size(src, cur, s.mesh_dim, s.dim, coord));
        break;
      case Kind::Chunk: {
        const int64_t n = t.size(s.dim);
        const int64_t parts = src.mesh.size(s.mesh_dim);
        t = t.narrow(s.dim, chunk_offset(n, parts, coord[i]), chunk_size(n, parts, coord[i])).contiguous();
        break;
      }
      case Kind::ToPartial:
        // Only a sum needs one holder of the value; avg/max/min of equal values is the value.
        if (s.op == ReduceOp::SUM && coord[i] != 0) t = at::zeros_like(t);
        break;
    }
    cur = s.after;
  }
  return t;
}

}  // namespace hyper_parallel
