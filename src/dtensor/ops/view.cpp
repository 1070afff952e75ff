// View and shape ops: view/_unsafe_view/_reshape_alias (global sizes become local sizes), expand,
// transpose/permute/t, unsqueeze/squeeze, select/slice, split/unbind, cat/stack, alias/detach,
// as_strided (as autograd emits it).
#include "rule_utils.h"

#include "../local_layout.h"

#include <algorithm>
#include <numeric>

namespace hyper_parallel {
namespace ops {
namespace {

OpSharding single_input(const OpInfo& info, Placements in, Placements out) {
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), replicate(info));
  s.input_placements[0] = std::move(in);
  s.output_placements.assign(info.schema().returns().size(), std::move(out));
  return s;
}

const DTensorSpec& self_spec(const OpInfo& info) {
  const DTensorSpec* s = info.spec(0);
  HP_CHECK_T(c10::ValueError, s != nullptr, "hyper_parallel::dispatch: ", info.describe(), " needs a DTensor self");
  return *s;
}

// ---- reshape: dims grouped where the products of sizes agree.
struct DimGroup {
  size_t ib, ie, ob, oe;
};

std::vector<DimGroup> dim_groups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<DimGroup> groups;
  size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    if (i < in.size() && in[i] == 1 && (j >= out.size() || out[j] != 1)) { groups.push_back({i, i + 1, j, j}); ++i; continue; }
    if (j < out.size() && out[j] == 1 && (i >= in.size() || in[i] != 1)) { groups.push_back({i, i, j, j + 1}); ++j; continue; }
    if (i >= in.size() || j >= out.size()) break;
    const size_t ib = i, jb = j;
    int64_t pi = in[i++], pj = out[j++];
    while (pi != pj) {
      if (pi < pj && i < in.size()) pi *= in[i++];
      else if (pj < pi && j < out.size()) pj *= out[j++];
      else break;
    }
    groups.push_back({ib, i, jb, j});
  }
  return groups;
}

std::vector<int64_t> infer_sizes(std::vector<int64_t> sizes, int64_t numel) {
  int64_t known = 1, infer = -1;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == -1) infer = static_cast<int64_t>(k);
    else known *= sizes[k];
  }
  if (infer >= 0) sizes[static_cast<size_t>(infer)] = known == 0 ? 0 : numel / known;
  return sizes;
}

enum class ReshapeKind { View, UnsafeView, ReshapeAlias };

OpSharding reshape_rule(const OpInfo& info, ReshapeKind kind) {
  const DTensorSpec& in = self_spec(info);
  const std::vector<int64_t> out_shape = infer_sizes(int_list(info, 1), in.numel());
  const size_t nmesh = in.placements.size();
  Placements want = in.placements, out = in.placements;  // Partial is linear under reshapes
  const auto groups = in.numel() == 0 ? std::vector<DimGroup>{} : dim_groups(in.shape, out_shape);
  for (size_t i = 0; i < nmesh; ++i) {
    const Placement& p = in.placements[i];
    if (!p.is_shard()) continue;
    const size_t d = static_cast<size_t>(p.dim());
    bool ok = false;
    for (const auto& g : groups) {
      if (d < g.ib || d >= g.ie) continue;
      if (g.ib == d && g.ob < g.oe) {
        int64_t parts = 1;
        for (size_t k = 0; k < nmesh; ++k)
          if (in.placements[k].is_shard(p.dim())) parts *= info.mesh_shape()[k];
        const bool one_to_one = g.ie - g.ib == 1 && g.oe - g.ob == 1;
        ok = one_to_one || (in.shape[d] % parts == 0 && out_shape[g.ob] % parts == 0);
        if (ok) out[i] = Shard(static_cast<int64_t>(g.ob));
      }
      break;
    }
    if (!ok) {  // the dim is merged or split where its pieces do not stay contiguous
      for (size_t k = 0; k < nmesh; ++k)
        if (in.placements[k].is_shard(p.dim())) { want[k] = Replicate(); out[k] = Replicate(); }
    }
  }
  OpSharding s = single_input(info, want, out);
  const std::vector<int64_t> local = local_shape(info, out, out_shape);
  s.kernel = kernel_returning([local, kind](const torch::jit::Stack& a) {
    const at::Tensor& self = a[0].toTensor();
    // A local shard that cannot be viewed (its layout differs from the global one, e.g. after an
    // all-gather along a later dim) is copied; the dispatcher marks such a view as a copy.
    auto strides = at::detail::computeStride(self.sizes(), self.strides(), local);
    if (kind == ReshapeKind::UnsafeView) return strides ? at::_unsafe_view(self, local) : self.reshape(local);
    return strides ? self.view(local) : self.reshape(local);
  });
  return s;
}

// ---- ops that only move dims around: input dims that disappear are unsharded first.
OpSharding dim_map_rule(const OpInfo& info, const std::function<int64_t(int64_t)>& map) {
  const DTensorSpec& in = self_spec(info);
  Placements want = without_shards(in.placements, [&](int64_t d) { return map(d) < 0; });
  return single_input(info, want, map_shard_dims(want, map));
}

OpSharding transpose_rule(const OpInfo& info) {
  const int64_t nd = self_spec(info).ndim();
  const int64_t a = wrap_dim(info.arg(1).toInt(), nd), b = wrap_dim(info.arg(2).toInt(), nd);
  return dim_map_rule(info, [a, b](int64_t d) { return d == a ? b : d == b ? a : d; });
}

OpSharding t_rule(const OpInfo& info) {
  const int64_t nd = self_spec(info).ndim();
  return dim_map_rule(info, [nd](int64_t d) { return nd < 2 ? d : 1 - d; });
}

OpSharding permute_rule(const OpInfo& info) {
  const int64_t nd = self_spec(info).ndim();
  auto dims = int_list(info, 1);
  std::vector<int64_t> inverse(static_cast<size_t>(nd));
  for (size_t k = 0; k < dims.size(); ++k) inverse[static_cast<size_t>(wrap_dim(dims[k], nd))] = static_cast<int64_t>(k);
  return dim_map_rule(info, [inverse](int64_t d) { return inverse[static_cast<size_t>(d)]; });
}

OpSharding unsqueeze_rule(const OpInfo& info) {
  const int64_t dim = wrap_dim(info.arg(1).toInt(), self_spec(info).ndim() + 1);
  return dim_map_rule(info, [dim](int64_t d) { return d >= dim ? d + 1 : d; });
}

// squeeze removes only the dims whose *global* size is 1 (a local piece may be 1 where the
// global dim is not).
OpSharding squeeze_rule(const OpInfo& info) {
  const DTensorSpec& in = self_spec(info);
  std::vector<int64_t> dims;
  if (info.num_args() > 1) {
    for (int64_t d : int_list(info, 1)) dims.push_back(wrap_dim(d, in.ndim()));
  } else {
    for (int64_t d = 0; d < in.ndim(); ++d) dims.push_back(d);
  }
  std::vector<int64_t> removed;
  for (int64_t d : dims)
    if (in.shape[static_cast<size_t>(d)] == 1) removed.push_back(d);
  std::sort(removed.begin(), removed.end());
  OpSharding s = dim_map_rule(info, [removed](int64_t d) {
    int64_t shift = 0;
    for (int64_t r : removed) {
      if (r == d) return int64_t{-1};
      if (r < d) ++shift;
    }
    return d - shift;
  });
  s.kernel = kernel_returning([removed](const torch::jit::Stack& a) {
    at::Tensor t = a[0].toTensor().alias();
    for (auto it = removed.rbegin(); it != removed.rend(); ++it) t = t.squeeze(*it);
    return t;
  });
  return s;
}

OpSharding select_rule(const OpInfo& info) {
  const int64_t dim = wrap_dim(info.arg(1).toInt(), self_spec(info).ndim());
  return dim_map_rule(info, [dim](int64_t d) { return d == dim ? -1 : d > dim ? d - 1 : d; });
}

// slice/split/unbind along a sharded dim: gathered first (PyTorch does the same).
OpSharding along_dim_rule(const OpInfo& info, size_t dim_arg, bool removes_dim) {
  const DTensorSpec& in = self_spec(info);
  const int64_t dim = wrap_dim(info.arg(dim_arg).toInt(), in.ndim());
  Placements want = without_shards(in.placements, [dim](int64_t d) { return d == dim; });
  Placements out = removes_dim ? map_shard_dims(want, [dim](int64_t d) { return d > dim ? d - 1 : d; }) : want;
  return single_input(info, want, out);
}

OpSharding slice_rule(const OpInfo& info) {
  const DTensorSpec& in = self_spec(info);
  const int64_t dim = wrap_dim(info.arg(1).toInt(), in.ndim());
  const int64_t n = in.shape[static_cast<size_t>(dim)];
  const auto& start = info.arg(2), end = info.arg(3);
  const int64_t step = info.arg(4).toInt();
  const bool whole = (start.isNone() || start.toInt() == 0) &&
                     (end.isNone() || end.toInt() >= n) && step == 1;
  if (whole) return single_input(info, in.placements, in.placements);  // autograd's no-op slices
  return along_dim_rule(info, 1, false);
}

OpSharding expand_rule(const OpInfo& info) {
  const DTensorSpec& in = self_spec(info);
  std::vector<int64_t> sizes = int_list(info, 1);
  const int64_t offset = static_cast<int64_t>(sizes.size()) - in.ndim();
  for (int64_t k = 0; k < static_cast<int64_t>(sizes.size()); ++k)
    if (sizes[static_cast<size_t>(k)] == -1) sizes[static_cast<size_t>(k)] = in.shape[static_cast<size_t>(k - offset)];
  Placements want = without_shards(in.placements, [&](int64_t d) {
    return sizes[static_cast<size_t>(d + offset)] != in.shape[static_cast<size_t>(d)];
  });
  Placements out = map_shard_dims(want, [offset](int64_t d) { return d + offset; });
  OpSharding s = single_input(info, want, out);
  const std::vector<int64_t> local = local_shape(info, out, sizes);
  s.kernel = kernel_returning([local](const torch::jit::Stack& a) {
    return a[0].toTensor().expand(local);
  });
  return s;
}

OpSharding identity_rule(const OpInfo& info) {
  const DTensorSpec& in = self_spec(info);
  return single_input(info, in.placements, in.placements);
}

// as_strided(size, stride, offset) of a tensor with a dense global layout, read as the view of its
// dims it is: a view dim of size > 1 is the base dim of the same stride, and the offset is a start
// along each base dim (a base dim no view dim takes is selected at its start). nullopt when the
// geometry is no such view (overlapping, or strides the base does not have).
struct DimView {
  std::vector<int64_t> base_dim;  // per view dim: the base dim, -1 for a view dim of size 1
  std::vector<int64_t> start;     // per base dim
};
c10::optional<DimView> as_dim_view(const DTensorSpec& in, const std::vector<int64_t>& size,
                                   const std::vector<int64_t>& stride, int64_t offset) {
  if (!is_dense(in.shape, in.stride) || size.size() != stride.size()) return c10::nullopt;
  DimView v;
  v.base_dim.assign(size.size(), -1);
  std::vector<bool> taken(in.shape.size(), false);
  for (size_t k = 0; k < size.size(); ++k) {
    if (size[k] == 1) continue;
    for (size_t b = 0; b < in.shape.size(); ++b)
      if (!taken[b] && in.shape[b] > 1 && in.stride[b] == stride[k]) {
        taken[b] = true;
        v.base_dim[k] = static_cast<int64_t>(b);
        break;
      }
    if (v.base_dim[k] < 0) return c10::nullopt;
  }
  // A sharded base dim of size 1 goes to a view dim of size 1 (its stride is arbitrary): the
  // piece holding it (or nothing) stays where it is.
  for (const auto& p : in.placements) {
    if (!p.is_shard() || in.shape[static_cast<size_t>(p.dim())] != 1 || taken[static_cast<size_t>(p.dim())]) continue;
    for (size_t k = 0; k < size.size(); ++k)
      if (size[k] == 1 && v.base_dim[k] < 0) {
        v.base_dim[k] = p.dim();
        taken[static_cast<size_t>(p.dim())] = true;
        break;
      }
  }
  int64_t rel = offset - in.storage_offset;
  if (rel < 0) return c10::nullopt;
  std::vector<size_t> order;
  for (size_t b = 0; b < in.shape.size(); ++b)
    if (in.shape[b] > 1) order.push_back(b);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return in.stride[a] > in.stride[b]; });
  v.start.assign(in.shape.size(), 0);
  for (size_t b : order) {
    v.start[b] = rel / in.stride[b];
    rel %= in.stride[b];
  }
  if (rel != 0) return c10::nullopt;
  for (size_t k = 0; k < size.size(); ++k)
    if (v.base_dim[k] >= 0 && v.start[static_cast<size_t>(v.base_dim[k])] + size[k] > in.shape[static_cast<size_t>(v.base_dim[k])])
      return c10::nullopt;
  for (size_t b = 0; b < in.shape.size(); ++b)
    if (v.start[b] >= std::max<int64_t>(in.shape[b], 1)) return c10::nullopt;
  return v;
}

// as_strided reaches DTensors from autograd's in-place-on-view path (CopySlices, AsStridedBackward),
// with the geometry the DTensors report (global sizes, strides and storage offsets). A tensor with
// no Shard holds the whole tensor locally: the same geometry applies to its local data, offset
// relative to the local view's own; a sharded one supports only restating its own geometry.
OpSharding as_strided_rule(const OpInfo& info) {
  const DTensorSpec& in = self_spec(info);
  bool sharded = false;
  for (const auto& p : in.placements) sharded = sharded || p.is_shard();
  const auto size = int_list(info, 1), stride = int_list(info, 2);
  const int64_t offset = info.arg(3).isNone() ? in.storage_offset : info.arg(3).toInt();
  if (!sharded) {
    OpSharding s = identity_rule(info);
    const std::vector<int64_t> global_stride = in.stride;
    const int64_t global_offset = in.storage_offset;
    const std::string what = info.describe();
    s.kernel = kernel_returning([=](const torch::jit::Stack& a) {
      const at::Tensor& self = a[0].toTensor();
      HP_CHECK_T(c10::NotImplementedError, has_layout(self, global_stride),
                 "hyper_parallel::dispatch: ", what, ": the local data is laid out with strides ", self.strides(),
                 " where the DTensor reports ", c10::IntArrayRef(global_stride), "; as_strided cannot be replayed");
      return self.as_strided(size, stride, self.storage_offset() + (offset - global_offset));
    });
    return s;
  }
  // Sharded: the geometry must be a view of the base's dims that keeps every sharded dim whole
  // (e.g. a transpose, or a narrow/select of an unsharded dim); its local version is the same
  // view of the local piece, through the local piece's own strides.
  const c10::optional<DimView> view = as_dim_view(in, size, stride, offset);
  bool whole = view.has_value();
  Placements out = in.placements;
  for (size_t i = 0; whole && i < in.placements.size(); ++i) {
    if (!in.placements[i].is_shard()) continue;
    const int64_t b = in.placements[i].dim();
    const auto k = std::find(view->base_dim.begin(), view->base_dim.end(), b);
    whole = k != view->base_dim.end() && view->start[static_cast<size_t>(b)] == 0 &&
            size[static_cast<size_t>(k - view->base_dim.begin())] == in.shape[static_cast<size_t>(b)];
    if (whole) out[i] = Shard(k - view->base_dim.begin());
  }
  HP_CHECK_T(c10::NotImplementedError, whole, "hyper_parallel::dispatch: ", info.describe(), " with size ", c10::IntArrayRef(size),
             " stride ", c10::IntArrayRef(stride), " offset ", offset,
             " on a sharded DTensor is not supported: it is not a view that keeps every sharded dim whole (autograd "
             "replays an in-place op on a view of a sharded DTensor this way: run the op out of place, or "
             "redistribute the tensor first)");
  OpSharding s = single_input(info, in.placements, out);
  const DimView v = *view;
  std::vector<bool> sharded_dim(in.shape.size(), false);
  for (const auto& p : in.placements)
    if (p.is_shard()) sharded_dim[static_cast<size_t>(p.dim())] = true;
  s.kernel = kernel_returning([v, size, sharded_dim](const torch::jit::Stack& a) {
    const at::Tensor& self = a[0].toTensor();
    std::vector<int64_t> lsize(size.size()), lstride(size.size(), 1);
    int64_t loffset = self.storage_offset();
    for (size_t b = 0; b < v.start.size(); ++b) loffset += v.start[b] * self.stride(static_cast<int64_t>(b));
    for (size_t k = 0; k < size.size(); ++k) {
      const int64_t b = v.base_dim[k];
      lsize[k] = b < 0 ? 1 : sharded_dim[static_cast<size_t>(b)] ? self.size(b) : size[k];  // a sharded dim is whole
      if (b >= 0) lstride[k] = self.stride(b);
    }
    return self.as_strided(lsize, lstride, loffset);
  });
  return s;
}

// cat / stack: every input laid out like the first one, the joined dim unsharded.
OpSharding join_rule(const OpInfo& info, bool stack) {
  const auto& inputs = info.inputs();
  HP_CHECK_T(c10::ValueError, !inputs.empty(), "hyper_parallel::dispatch: ", info.name(), " of no DTensors");
  const DTensorSpec* first = nullptr;
  for (const auto& in : inputs)
    if (!(in.spec->ndim() == 1 && in.spec->shape[0] == 0)) { first = in.spec; break; }  // cat skips legacy empties
  if (first == nullptr) first = inputs[0].spec;
  const int64_t nd = first->ndim();
  const int64_t dim = wrap_dim(info.arg(1).toInt(), stack ? nd + 1 : nd);
  bool all_partial = true;
  for (const auto& in : inputs)
    for (const auto& p : in.spec->placements) all_partial = all_partial && p.is_partial() && p.reduce_op() == ReduceOp::SUM;
  Placements want = without_shards(first->placements, [&](int64_t d) { return !stack && d == dim; });
  if (!all_partial) want = without_partial(want);
  OpSharding s;
  for (const auto& in : inputs)
    s.input_placements.push_back(in.spec->ndim() == nd ? want : replicate(info));
  s.output_placements = {stack ? map_shard_dims(want, [dim](int64_t d) { return d >= dim ? d + 1 : d; }) : want};
  return s;
}

// select_backward(grad, input_sizes, dim, index) / slice_backward(grad, input_sizes, dim, start,
// end, step): the gradient scattered into zeros of the input's (global) size. The selected or
// sliced dim is whole; the other shards carry over and input_sizes becomes local.
OpSharding scatter_backward_rule(const OpInfo& info, bool removes_dim) {
  const DTensorSpec& g = self_spec(info);
  const std::vector<int64_t> sizes = int_list(info, 1);
  const int64_t dim = wrap_dim(info.arg(2).toInt(), static_cast<int64_t>(sizes.size()));
  Placements want = without_partial(g.placements);
  if (!removes_dim) want = without_shards(want, [dim](int64_t d) { return d == dim; });
  Placements out = removes_dim ? map_shard_dims(want, [dim](int64_t d) { return d >= dim ? d + 1 : d; }) : want;
  OpSharding s = single_input(info, want, out);
  s.output_shapes = {sizes};
  const std::vector<int64_t> local = local_shape(info, out, sizes);
  s.adjust_args = [local](torch::jit::Stack& args) { args[1] = c10::IValue(local); };
  return s;
}

struct ViewRegistrar {
  ViewRegistrar() {
    register_sharding_rule("aten::view", [](const OpInfo& i) { return reshape_rule(i, ReshapeKind::View); });
    register_sharding_rule("aten::_unsafe_view", [](const OpInfo& i) { return reshape_rule(i, ReshapeKind::UnsafeView); });
    register_sharding_rule("aten::_reshape_alias", [](const OpInfo& i) { return reshape_rule(i, ReshapeKind::ReshapeAlias); });
    register_sharding_rule("aten::transpose.int", transpose_rule);
    register_sharding_rule("aten::transpose_", transpose_rule);
    register_sharding_rule("aten::t", t_rule);
    register_sharding_rule("aten::t_", t_rule);
    register_sharding_rule("aten::permute", permute_rule);
    register_sharding_rule("aten::unsqueeze", unsqueeze_rule);
    register_sharding_rule("aten::unsqueeze_", unsqueeze_rule);
    register_sharding_rule("aten::squeeze", squeeze_rule);
    register_sharding_rule("aten::squeeze.dim", squeeze_rule);
    register_sharding_rule("aten::squeeze_", squeeze_rule);
    register_sharding_rule("aten::select.int", select_rule);
    register_sharding_rule("aten::slice.Tensor", slice_rule);
    register_sharding_rule("aten::split.Tensor", [](const OpInfo& i) { return along_dim_rule(i, 2, false); });
    register_sharding_rule("aten::split_with_sizes", [](const OpInfo& i) { return along_dim_rule(i, 2, false); });
    register_sharding_rule("aten::unbind.int", [](const OpInfo& i) { return along_dim_rule(i, 1, true); });
    register_sharding_rule("aten::expand", expand_rule);
    register_sharding_rule("aten::alias", identity_rule);
    register_sharding_rule("aten::detach", identity_rule);
    register_sharding_rule("aten::detach_", identity_rule);
    register_sharding_rule("aten::lift_fresh", identity_rule);
    register_sharding_rule("aten::as_strided", as_strided_rule);
    register_sharding_rule("aten::select_backward", [](const OpInfo& i) { return scatter_backward_rule(i, true); });
    register_sharding_rule("aten::slice_backward", [](const OpInfo& i) { return scatter_backward_rule(i, false); });
    register_sharding_rule("aten::cat", [](const OpInfo& i) { return join_rule(i, false); });
    register_sharding_rule("aten::stack", [](const OpInfo& i) { return join_rule(i, true); });
  }
} view_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
