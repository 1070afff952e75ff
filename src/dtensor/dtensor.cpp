// The DTensor API: accessors, the differentiable from_local / to_local / redistribute boundaries,
// distribute_tensor.
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/loss_parallel.h>
#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/call_context.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "dtensor_impl.h"
#include "local_layout.h"
#include "op_report.h"
#include "redistribute.h"

namespace hyper_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Carries a spec through an autograd context's saved_data.
struct SpecCapsule : torch::CustomClassHolder {
  explicit SpecCapsule(std::shared_ptr<const DTensorSpec> s) : spec(std::move(s)) {}
  std::shared_ptr<const DTensorSpec> spec;
};
c10::IValue capsule(std::shared_ptr<const DTensorSpec> s) {
  return c10::IValue::make_capsule(c10::make_intrusive<SpecCapsule>(std::move(s)));
}
std::shared_ptr<const DTensorSpec> uncapsule(const c10::IValue& v) {
  return c10::static_intrusive_pointer_cast<SpecCapsule>(v.toCapsule())->spec;
}

// While module paths are tracked, an autograd function remembers the module its forward ran in,
// and its backward's collectives count for that module (CommDebugMode's per-module table).
void remember_module(AutogradContext* ctx) {
  if (call_context::tracking()) ctx->saved_data["module"] = call_context::current_fqn();
}
struct BackwardModule {
  c10::optional<call_context::ModuleOverride> scope;
  explicit BackwardModule(AutogradContext* ctx) {
    auto it = ctx->saved_data.find("module");
    if (it != ctx->saved_data.end()) scope.emplace(&it->second.toStringRef());
  }
};

DTensorImpl& impl_of(const at::Tensor& t, const char* what) {
  DTensorImpl* impl = dtensor_impl(t);
  HP_CHECK_T(c10::TypeError, impl != nullptr, "hyper_parallel::", what, ": needs a DTensor, got a plain tensor");
  return *impl;
}

// The DTensor whose local data `what` is about to read: a stale copy-view is refused.
DTensorImpl& read_impl_of(const at::Tensor& t, const char* what) {
  DTensorImpl& impl = impl_of(t, what);
  if (impl.is_stale_copy_view())
    stale_copy_view_error(*impl.copy_source(), std::string("hyper_parallel::") + what, "the DTensor " + impl.spec().short_string());
  return impl;
}

// A plain gradient of a DTensor's global shape is one libtorch made in backward (e.g. an in-place
// op on zeros(sizes) under implicit replication returns the plain tensor itself): it holds the
// whole value on every rank, i.e. it is the Replicate DTensor it stands for.
at::Tensor whole_grad_as_replicate(const at::Tensor& grad, const DTensorSpec& spec) {
  if (!grad.defined() || dtensor_impl(grad) != nullptr || grad.sizes() != c10::IntArrayRef(spec.shape)) return grad;
  return make_dtensor(grad.contiguous(), std::make_shared<DTensorSpec>(spec.mesh, Placements(spec.placements.size(), Replicate()),
                                                                        spec.shape, grad.scalar_type()));
}

// Redistributes a gradient to `target` placements; plain gradients pass through.
at::Tensor grad_to(const at::Tensor& grad_in, const DTensorSpec& spec, const Placements& target) {
  const at::Tensor grad = whole_grad_as_replicate(grad_in, spec);
  DTensorImpl* g = dtensor_impl(grad);
  if (g == nullptr || g->spec().placements == target) return grad;
  return make_dtensor(redistribute_local(g->local(), g->spec(), target),
                      spec_with_placements(g->spec(), target));
}

struct FromLocalFn : torch::autograd::Function<FromLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local,
                            std::shared_ptr<const DTensorSpec> spec) {
    ctx->saved_data["spec"] = capsule(spec);
    remember_module(ctx);
    return make_dtensor(local.detach(), std::move(spec));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const BackwardModule module(ctx);
    const auto spec = uncapsule(ctx->saved_data["spec"]);
    at::Tensor g = whole_grad_as_replicate(grads[0], *spec);
    if (DTensorImpl* impl = dtensor_impl(g)) {
      // The gradient of each rank's local is the DTensor gradient in the forward layout; a
      // Partial gradient (e.g. from Colwise) is reduced here.
      g = redistribute_local(impl->local(), impl->spec(), without_partial(spec->placements));
    }
    return {g, at::Tensor()};
  }
};

struct ToLocalFn : torch::autograd::Function<ToLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dtensor,
                            std::shared_ptr<const DTensorSpec> grad_spec) {
    ctx->saved_data["spec"] = capsule(std::move(grad_spec));
    remember_module(ctx);
    return read_impl_of(dtensor, "DTensor::to_local").local().alias();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto spec = uncapsule(ctx->saved_data["spec"]);
    at::Tensor g = grads[0];
    if (!g.defined() || dtensor_impl(g) != nullptr) return {g, at::Tensor()};
    const auto expected = spec->local_shape();
    TORCH_CHECK(g.sizes() == c10::IntArrayRef(expected), "hyper_parallel::DTensor::to_local: in backward, the gradient of the local tensor has shape ",
                g.sizes(), " but the local shard has shape ", c10::IntArrayRef(expected));
    return {make_dtensor(g, spec), at::Tensor()};
  }
};

struct RedistributeFn : torch::autograd::Function<RedistributeFn> {
  // `dst`'s dtype is the forward collective's; `backward_dtype` (-1: none) the backward one's.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            std::shared_ptr<const DTensorSpec> dst, int64_t backward_dtype) {
    const DTensorImpl& in = read_impl_of(input, "DTensor::redistribute");
    ctx->saved_data["src"] = capsule(in.spec_ptr());
    ctx->saved_data["backward_dtype"] = backward_dtype;
    remember_module(ctx);
    if (CommDebugMode::op_tracing()) trace_redistribute(in.spec(), dst->placements);
    const at::Tensor source = dst->dtype == in.spec().dtype ? in.local() : in.local().to(dst->dtype);
    // The same placements (only the gradient's path, or a cast): PyTorch's output shares the data.
    if (dst->placements == in.spec().placements) {
      auto same = std::make_shared<DTensorSpec>(in.spec());
      same->dtype = dst->dtype;
      return make_dtensor(source.alias(), std::move(same));
    }
    at::Tensor local = redistribute_local(source, in.spec(), dst->placements);
    // A new tensor, as PyTorch's: a local chunk of the source (Replicate -> Shard) is copied, and
    // the data laid out as the global strides say (a gather builds it contiguous).
    const auto strides = local_strides_like(dst->shape, dst->stride, local.sizes().vec());
    if (local.is_alias_of(in.local()) || !has_layout(local, strides)) local = copy_with_layout(local, strides);
    return make_dtensor(std::move(local), std::move(dst));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const BackwardModule module(ctx);
    const auto src = uncapsule(ctx->saved_data["src"]);
    const int64_t backward_dtype = ctx->saved_data["backward_dtype"].toInt();
    at::Tensor g = whole_grad_as_replicate(grads[0], *src);
    // PyTorch's rule: the gradient goes back to the input's placements, except that where the
    // input was Partial a Replicate or Shard gradient becomes Replicate (making it Partial again
    // would only defer a reduction), and a Partial gradient stays Partial.
    Placements target = src->placements;
    const DTensorImpl* gi = dtensor_impl(g);
    for (size_t i = 0; i < target.size(); ++i)
      if (target[i].is_partial() && !(gi != nullptr && gi->spec().placements[i].is_partial())) target[i] = Replicate();
    if (backward_dtype < 0) return {grad_to(g, *src, target), at::Tensor(), at::Tensor()};
    // In backward_dtype through the collective, in the input's dtype after it.
    g = grad_to(g.to(static_cast<c10::ScalarType>(backward_dtype)), *src, target);
    return {g.to(src->dtype), at::Tensor(), at::Tensor()};
  }
};

thread_local bool t_implicit_replication = false;

// The placements of a new DTensor made from plain tensor `t`, checked and normalised.
Placements checked_placements(const char* qualified_fn, const at::Tensor& t, const DeviceMesh& mesh, const Placements& placements) {
  HP_CHECK_T(c10::TypeError, t.defined() && !is_dtensor(t), qualified_fn, ": needs a defined plain tensor",
             (t.defined() ? ", got a DTensor" : ""));
  HP_CHECK_T(c10::ValueError, static_cast<int64_t>(placements.size()) == mesh.ndim(), qualified_fn, ": ",
             short_string(placements), " has ", placements.size(), " placements for a mesh with ", mesh.ndim(),
             " dimensions");
  return normalize_placements(placements, t.dim());
}

}  // namespace

bool is_dtensor(const at::Tensor& t) { return dtensor_impl(t) != nullptr; }

DTensor::DTensor(at::Tensor t) : at::Tensor(std::move(t)) {
  HP_CHECK_T(c10::TypeError, !defined() || is_dtensor(*this),
             "hyper_parallel::DTensor: the tensor is a plain tensor, not a DTensor (use "
             "hyper_parallel::DTensor::from_local or distribute_tensor)");
}

const DTensorSpec& DTensor::spec() const { return impl_of(*this, "DTensor::spec").spec(); }
const Placements& DTensor::placements() const { return spec().placements; }
const DeviceMesh& DTensor::device_mesh() const { return spec().mesh; }
bool DTensor::is_copy_view() const { return impl_of(*this, "DTensor::is_copy_view").is_copy_view(); }

at::Tensor DTensor::to_local(c10::optional<Placements> grad_placements) const {
  const DTensorImpl& impl = read_impl_of(*this, "DTensor::to_local");
  if (!impl.spec().has_partial() && !grad_placements && !requires_grad()) return impl.local();
  auto grad_spec = spec_with_placements(
      impl.spec(), grad_placements ? normalize_placements(*grad_placements, impl.spec().ndim())
                                   : without_partial(impl.spec().placements));
  // Passed as at::Tensor: autograd's argument scan only recognises that exact type.
  return ToLocalFn::apply(static_cast<const at::Tensor&>(*this), std::move(grad_spec));
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, const Placements& placements) const {
  return redistribute(mesh, placements, c10::nullopt, c10::nullopt);
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, const Placements& placements, c10::optional<c10::ScalarType> forward_dtype,
                              c10::optional<c10::ScalarType> backward_dtype) const {
  const DTensorImpl& impl = read_impl_of(*this, "DTensor::redistribute");
  HP_CHECK_T(c10::ValueError, mesh == impl.spec().mesh,
             "hyper_parallel::DTensor::redistribute: moving a DTensor to another mesh is not supported (from ",
             impl.spec().mesh.to_string(), " to ", mesh.to_string(), ")");
  HP_CHECK_T(c10::ValueError, static_cast<int64_t>(placements.size()) == mesh.ndim(),
             "hyper_parallel::DTensor::redistribute: ", short_string(placements), " has ", placements.size(),
             " placements for a mesh with ", mesh.ndim(), " dimensions");
  Placements dst = normalize_placements(placements, impl.spec().ndim());
  const bool cast = (forward_dtype && *forward_dtype != impl.spec().dtype) || (backward_dtype && *backward_dtype != impl.spec().dtype);
  // As PyTorch's, a redistribution to the same placements still lays the gradient out as the
  // input is (e.g. a Partial gradient from to_local(grad_placements=...) is reduced here).
  if (dst == impl.spec().placements && !cast && !requires_grad()) return *this;
  // Without backward_dtype the backward collective runs in this tensor's dtype, not forward_dtype.
  if (forward_dtype && !backward_dtype && *forward_dtype != impl.spec().dtype) backward_dtype = impl.spec().dtype;
  // As PyTorch: a Partial is what ops produce, not a layout to ask for (which rank would hold
  // the value, and what would its gradient be?).
  for (size_t i = 0; i < dst.size(); ++i)
    HP_CHECK_T(c10::ValueError, !dst[i].is_partial() || dst[i] == impl.spec().placements[i],
               "hyper_parallel::DTensor::redistribute: redistributing to ", dst[i].short_string(), " (mesh dim ", i, ", from ",
               impl.spec().placements[i].short_string(), ") is not supported; Partial placements "
               "come from ops (e.g. a Rowwise matmul), or build one with DTensor::from_local");
  // A new tensor: laid out as clone() would lay it out (a dense layout is kept, a view's gaps and
  // offset are not).
  auto spec = std::make_shared<DTensorSpec>(impl.spec());
  spec->placements = std::move(dst);
  if (!is_dense(spec->shape, spec->stride)) spec->stride = contiguous_strides(spec->shape);
  spec->storage_offset = 0;
  if (forward_dtype) spec->dtype = *forward_dtype;
  return DTensor(RedistributeFn::apply(static_cast<const at::Tensor&>(*this), std::move(spec),
                                       backward_dtype ? static_cast<int64_t>(*backward_dtype) : int64_t{-1}));
}

DTensor DTensor::redistribute(const Placements& placements) const {
  return redistribute(device_mesh(), placements);
}

at::Tensor DTensor::full_tensor() const {
  return redistribute(Placements(static_cast<size_t>(device_mesh().ndim()), Replicate())).to_local();
}

DTensor DTensor::from_local(const at::Tensor& local, const DeviceMesh& mesh,
                            const Placements& placements, bool run_check,
                            c10::optional<at::IntArrayRef> shape,
                            c10::optional<at::IntArrayRef> stride) {
  const Placements pl = checked_placements("hyper_parallel::DTensor::from_local", local, mesh, placements);
  at::Tensor data = local;
  std::vector<int64_t> global;
  if (shape) {
    global = shape->vec();
    HP_CHECK_T(c10::ValueError, global.size() == static_cast<size_t>(local.dim()),
               "hyper_parallel::DTensor::from_local: shape ", *shape, " has another rank than the local tensor ",
               local.sizes());
  } else {
    global = local.sizes().vec();
    for (size_t i = 0; i < pl.size(); ++i)
      if (pl[i].is_shard()) global[static_cast<size_t>(pl[i].dim())] *= mesh.size(static_cast<int64_t>(i));
  }
  // The global stride as PyTorch derives it from the local one: along each sharded dim, every
  // other stride at least as large is scaled by the shards' count (a transposed local piece gives a
  // transposed global tensor).
  std::vector<int64_t> global_stride;
  if (stride) {
    global_stride = stride->vec();
  } else if (!shape) {
    global_stride = local.strides().vec();
    for (size_t i = 0; i < pl.size(); ++i) {
      if (!pl[i].is_shard()) continue;
      const auto d = static_cast<size_t>(pl[i].dim());
      const int64_t at_dim = global_stride[d];
      for (size_t j = 0; j < global_stride.size(); ++j)
        if (j != d && global_stride[j] >= at_dim) global_stride[j] *= mesh.size(static_cast<int64_t>(i));
    }
    if (!is_dense(global, global_stride)) global_stride.clear();  // a local view with gaps: contiguous
  }
  const std::vector<int64_t> first_shape = global;
  auto spec = std::make_shared<DTensorSpec>(mesh, pl, std::move(global), local.scalar_type(), global_stride);
  if (run_check) {
    // Every rank must hold the same kind of piece: dtype, requires_grad and (for equal shapes) its
    // strides, as PyTorch's run_check checks them; its shape along each sharded dim must be its
    // torch.chunk piece, the other dims must agree. One all_gather per mesh dimension.
    const int64_t nd = local.dim();
    std::vector<int64_t> meta = {static_cast<int64_t>(local.scalar_type()), local.requires_grad() ? 1 : 0};
    for (int64_t d = 0; d < nd; ++d) meta.push_back(local.size(d));
    for (int64_t d = 0; d < nd; ++d) meta.push_back(local.stride(d));
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      const auto all_meta = control_all_gather(mesh.get_group(i), meta);
      std::vector<std::vector<int64_t>> all;  // every rank's local shape
      for (const auto& m : all_meta) {
        HP_CHECK_T(c10::ValueError, m.size() == meta.size(), "hyper_parallel::DTensor::from_local: run_check: the local tensors "
                   "have different numbers of dimensions on the ranks of mesh dim ", i);
        HP_CHECK_T(c10::ValueError, m[0] == meta[0], "hyper_parallel::DTensor::from_local: run_check: the local tensors' dtypes "
                   "differ on the ranks of mesh dim ", i, " (", c10::toString(static_cast<c10::ScalarType>(m[0])), " and ",
                   local.scalar_type(), ")");
        HP_CHECK_T(c10::ValueError, m[1] == meta[1], "hyper_parallel::DTensor::from_local: run_check: requires_grad differs on "
                   "the ranks of mesh dim ", i);
        all.emplace_back(m.begin() + 2, m.begin() + 2 + nd);
        const bool same_shape = all.back() == local.sizes().vec();
        HP_CHECK_T(c10::ValueError, !same_shape || std::equal(m.begin() + 2 + nd, m.end(), meta.begin() + 2 + nd),
                   "hyper_parallel::DTensor::from_local: run_check: the local tensors' strides differ on the ranks of mesh dim ",
                   i, " (", local.strides(), " here)");
      }
      const Placement& p = spec->placements[static_cast<size_t>(i)];
      if (p.is_shard() && !shape && spec->mesh_dims_sharding(p.dim()).size() == 1) {
        // Uneven shards: the global size is the sum of the pieces.
        int64_t total = 0;
        for (const auto& sz : all) total += sz[static_cast<size_t>(p.dim())];
        spec->shape[static_cast<size_t>(p.dim())] = total;
      }
      for (int64_t d = 0; d < nd; ++d) {
        if (p.is_shard(d)) continue;
        bool same = true;
        for (const auto& sz : all) same = same && sz[static_cast<size_t>(d)] == all[0][static_cast<size_t>(d)];
        if (same) continue;
        std::string shapes;
        for (const auto& sz : all) shapes += c10::str(shapes.empty() ? "" : ", ", c10::IntArrayRef(sz));
        HP_CHECK_T(c10::ValueError, false, "hyper_parallel::DTensor::from_local: run_check: local shapes ", shapes, " differ in dim ", d,
                   ", which mesh dim ", i, " does not shard");
      }
    }
    auto [expect, offset] = spec->local_shape_and_offset(*mesh.get_coordinate());
    HP_CHECK_T(c10::ValueError, local.sizes() == c10::IntArrayRef(expect), "hyper_parallel::DTensor::from_local: run_check: rank ",
               get_rank(), " holds a local tensor of shape ", local.sizes(), " but ", short_string(spec->placements),
               " of the global shape ", c10::IntArrayRef(spec->shape), " gives it ", c10::IntArrayRef(expect));
    // Replicate: coordinate 0's values win, written into the local tensor as PyTorch does.
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      if (!spec->placements[static_cast<size_t>(i)].is_replicate()) continue;
      at::NoGradGuard no_grad;
      at::Tensor copy = data.detach().clone(at::MemoryFormat::Contiguous);
      broadcast_(copy, 0, mesh.get_group(i));
      data.detach().copy_(copy);
    }
    // Uneven shards grow the shape: then the layout is contiguous.
    if (!stride && spec->shape != first_shape) spec->stride = contiguous_strides(spec->shape);
  }
  return DTensor(FromLocalFn::apply(data, std::move(spec)));
}

at::Tensor local_tensor(const at::Tensor& t) { return is_dtensor(t) ? DTensor(t).to_local() : t; }

DTensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                          const Placements& placements, c10::optional<int64_t> src_data_rank) {
  auto spec = std::make_shared<DTensorSpec>(mesh, checked_placements("hyper_parallel::distribute_tensor", tensor, mesh, placements),
                                            tensor.sizes().vec(), tensor.scalar_type());
  const auto coord_opt = mesh.get_coordinate();
  TORCH_CHECK(coord_opt.has_value(), "hyper_parallel::distribute_tensor: this rank is not part of ", mesh.to_string());
  const auto& coord = *coord_opt;

  // Ranks that disagree on the shape, dtype or placements would scatter mismatched pieces or
  // silently hold pieces of different tensors. One tiny check per mesh dim (the mesh is a grid,
  // so agreement along every dim is agreement everywhere); meta tensors never communicate.
  if (!tensor.is_meta()) {
    const std::string d = c10::str("shape ", tensor.sizes(), " dtype ", tensor.scalar_type(), " placements ",
                                   to_string(spec->placements), " src_data_rank ",
                                   src_data_rank ? std::to_string(*src_data_rank) : "None", " on ", mesh.to_string());
    for (int64_t i = 0; i < mesh.ndim(); ++i) check_agreement(mesh.get_group(i), "distribute_tensor", d);
  }
  at::NoGradGuard no_grad;
  // As PyTorch does: a tensor on another device type than the mesh's goes to this rank's device
  // of the mesh first (the current device of an accelerator, set by init_process_group).
  const c10::Device mesh_device(mesh.device_type());
  const at::Tensor source = tensor.is_meta() || tensor.device().type() == mesh_device.type() ? tensor : tensor.to(mesh_device);
  at::Tensor local;
  if (tensor.is_meta()) {
    // Meta tensors have no values: nothing to send, only the local shape matters.
    local = at::empty(spec->local_shape(), tensor.options());
  } else if (!src_data_rank) {
    local = local_piece_of_whole(source.detach(), mesh.shape(), coord, spec->placements).clone(at::MemoryFormat::Contiguous);
  } else {
    const int64_t src = *src_data_rank;
    local = source.detach().contiguous();
    for (size_t i = 0; i < spec->placements.size(); ++i) {
      const Placement& p = spec->placements[i];
      const Group& g = mesh.get_group(static_cast<int64_t>(i));
      HP_CHECK_T(c10::ValueError, src >= 0 && src < g.size(), "hyper_parallel::distribute_tensor: src_data_rank ",
                 src, " is not a rank of mesh dimension ", i, " (size ", g.size(), ")");
      if (p.is_shard()) {
        local = scatter(local, p.dim(), src, g);
      } else {
        local = local.clone();
        broadcast_(local, src, g);
        if (p.is_partial() && p.reduce_op() == ReduceOp::SUM && coord[i] != 0) local.zero_();
      }
    }
    if (local.is_same(tensor)) local = local.clone();
  }
  at::Tensor out = make_dtensor(std::move(local), std::move(spec));
  if (tensor.requires_grad()) out.set_requires_grad(true);
  return DTensor(std::move(out));
}

ImplicitReplicationGuard::ImplicitReplicationGuard() : previous_(t_implicit_replication) {
  t_implicit_replication = true;
}
ImplicitReplicationGuard::~ImplicitReplicationGuard() { t_implicit_replication = previous_; }
bool ImplicitReplicationGuard::enabled() { return t_implicit_replication; }

namespace {
thread_local bool t_loss_parallel = false;
}  // namespace
LossParallelGuard::LossParallelGuard() : previous_(t_loss_parallel) { t_loss_parallel = true; }
LossParallelGuard::~LossParallelGuard() { t_loss_parallel = previous_; }
bool LossParallelGuard::enabled() { return t_loss_parallel; }

std::ostream& operator<<(std::ostream& os, const DTensor& t) {
  if (!t.defined()) return os << "DTensor(undefined)";
  const DTensorImpl& impl = read_impl_of(t, "operator<<(DTensor)");
  os << "DTensor(mesh=" << impl.spec().mesh.to_string() << ", placements="
     << to_string(impl.spec().placements) << ", shape=" << t.sizes() << ", dtype=" << t.scalar_type()
     << (t.requires_grad() ? ", requires_grad=True" : "") << ", local=\n"
     << impl.local() << ")";
  return os;
}

}  // namespace hyper_parallel
