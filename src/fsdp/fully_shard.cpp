// fully_shard: planning (every parameter checked before any change), the group, its hooks, and
// the registry behind unshard()/reshard().
#include <hyper_parallel/fsdp/fully_shard.h>
#include <hyper_parallel/platform/platform.h>
#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "fsdp_param_group.h"

namespace hyper_parallel {
namespace {

using fsdp::FSDPParam;
using fsdp::FSDPParamGroup;

// A parameter an inner fully_shard call already took over lives on the root mesh (with TP) or on
// dp_mesh itself (without); TP parameters live on the other 1-D slice.
bool already_sharded(const at::Tensor& param, const DeviceMesh& dp_mesh, const DeviceMesh& root) {
  if (!is_dtensor(param)) return false;
  const DeviceMesh& m = DTensor(param).device_mesh();
  return m == dp_mesh || (root.ndim() > 1 && (m == root || m.refines(root).has_value()));
}

// How `param` is sharded over dp (fills everything but `sharded` and `offset`).
FSDPParam plan_param(const at::Tensor& param, const std::string& fqn, const DeviceMesh& dp_mesh) {
  const DeviceMesh root = dp_mesh.root_mesh();
  const std::vector<int64_t> dp_root_dims = dp_mesh.dims_in_root();
  FSDPParam p;
  p.dp_size = dp_mesh.size(-1);
  p.dp_rank = dp_mesh.get_local_rank(-1);
  p.global_shape = param.sizes().vec();
  if (is_dtensor(param)) {
    const DTensor d(param);
    const DeviceMesh& tp = d.device_mesh();
    // TP (or expert) dimensions of the same root that dp does not use, e.g. mesh["tp"] or
    // mesh[{"ep", "tp"}] beside mesh["dp"]; or of that root with the tp dimension unflattened
    // (KV heads replicated over (kv, kv_replica)), where dp's dimensions sit elsewhere.
    const DeviceMesh tp_root = tp.root_mesh();
    const c10::optional<std::vector<int64_t>> refined = tp_root == root ? c10::nullopt : tp_root.refines(root);
    std::vector<int64_t> dp_dims = dp_root_dims;
    if (refined)
      for (int64_t& d : dp_dims) d = (*refined)[static_cast<size_t>(d)];
    bool sibling = (tp_root == root || refined.has_value()) && (tp.ndim() > 1 || tp.dim_in_root().has_value());
    if (sibling)
      for (int64_t dim : tp.dims_in_root()) sibling = sibling && std::find(dp_dims.begin(), dp_dims.end(), dim) == dp_dims.end();
    HP_CHECK_T(c10::ValueError, sibling,
               "hyper_parallel::fully_shard: parameter '", fqn, "' lives on ", tp.to_string(), ", which is not made of other dimensions of the root mesh of ",
               dp_mesh.to_string(), " (apply parallelize_module on mesh[\"tp\"] and fully_shard on mesh[\"dp\"] of one mesh)");
    p.tp_mesh = tp;
    p.tp_placements = d.placements();
    p.shard_root = tp_root;
    p.dp_dim_in_root = dp_dims.back();
    // The first dim TP leaves whole: sharding it over dp nests correctly under any mesh order.
    for (int64_t k = 0; k < d.dim() && p.dp_dim < 0; ++k) {
      bool whole = true;
      for (const Placement& pl : d.placements()) whole = whole && !pl.is_shard(k);
      if (whole) p.dp_dim = k;
    }
    p.compute_shape = d.spec().local_shape();
  } else {
    HP_CHECK_T(c10::ValueError, param.dim() > 0, "hyper_parallel::fully_shard: parameter '", fqn, "' is a scalar");
    p.dp_dim = 0;
    p.compute_shape = param.sizes().vec();
  }
  p.padded_shape = p.compute_shape;
  if (p.dp_dim >= 0) {
    int64_t& n = p.padded_shape[static_cast<size_t>(p.dp_dim)];
    n = (n + p.dp_size - 1) / p.dp_size;
  }
  p.padded_numel = c10::multiply_integers(p.padded_shape);
  return p;
}

// The sharded parameter: this rank's dp piece of the compute-local tensor, on the root mesh
// (with TP) or on dp_mesh.
at::Tensor make_sharded(const FSDPParam& p, const at::Tensor& param, const DeviceMesh& dp_mesh) {
  at::Tensor local = local_tensor(param).detach();
  if (p.dp_dim >= 0) local = local.narrow(p.dp_dim, chunk_offset(local.size(p.dp_dim), p.dp_size, p.dp_rank),
                                          chunk_size(local.size(p.dp_dim), p.dp_size, p.dp_rank));
  // Sharded over dp_mesh's last dimension, replicated over HSDP's replicate one (and any other).
  // A plain parameter of a dp mesh cut from a bigger one (dp x tp) lives on that whole mesh,
  // replicated over its other dimensions (every tp rank computes it alike): every parameter of a
  // dp x tp model is then on one mesh, so a norm over all of them (clip_grad_norm_) combines.
  DeviceMesh mesh = dp_mesh;
  Placements pl(static_cast<size_t>(dp_mesh.ndim()), Replicate());
  pl.back() = Shard(0);
  const DeviceMesh root = dp_mesh.root_mesh();
  if (!p.tp_mesh && root.ndim() > dp_mesh.ndim()) {
    const std::vector<int64_t> dims = dp_mesh.dims_in_root();
    mesh = root;
    pl.assign(static_cast<size_t>(root.ndim()), Replicate());
    pl[static_cast<size_t>(dims.back())] = Shard(0);
  }
  if (p.tp_mesh) {
    mesh = *p.shard_root;
    pl.assign(static_cast<size_t>(mesh.ndim()), Replicate());
    const std::vector<int64_t> tp_dims = p.tp_mesh->dims_in_root();
    for (size_t i = 0; i < tp_dims.size(); ++i) pl[static_cast<size_t>(tp_dims[i])] = p.tp_placements[i];
    pl[static_cast<size_t>(p.dp_dim_in_root)] = p.dp_dim >= 0 ? Shard(p.dp_dim) : Replicate();
  }
  return DTensor::from_local(local.clone(at::MemoryFormat::Contiguous), mesh, pl, false, c10::IntArrayRef(p.global_shape))
      .detach();
}

// fully_shard modules and their groups (the hooks own the groups; an entry outlives neither).
std::mutex g_mutex;
std::unordered_map<const torch::nn::Module*, c10::weak_intrusive_ptr<FSDPParamGroup>> g_groups;

// The tensors earlier calls took over, with the name they had there: a slot outside that call's
// module still holding one is a weight tied across two calls, which would silently become two
// parameters. Weak, so a tensor freed since (and its address reused) is no match.
struct Taken {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  std::string fqn;
};
std::unordered_map<const c10::TensorImpl*, Taken> g_taken;

// The name an earlier call gave `param` when it took it over, if one did.
c10::optional<std::string> taken_by_earlier_call(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_taken.find(param.unsafeGetTensorImpl());
  if (it == g_taken.end()) return c10::nullopt;
  if (it->second.tensor.lock().get() != param.unsafeGetTensorImpl()) {
    g_taken.erase(it);
    return c10::nullopt;
  }
  return it->second.fqn;
}

// `v` with its floating-point tensors (also inside tuples and lists) cast to `dtype`.
c10::IValue cast_floating(const c10::IValue& v, at::ScalarType dtype) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != dtype ? c10::IValue(t.to(dtype)) : v;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& e : v.toTupleRef().elements()) items.push_back(cast_floating(e, dtype));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(cast_floating(t, dtype).toTensor());
    return out;
  }
  return v;
}

c10::intrusive_ptr<FSDPParamGroup> group_of(const torch::nn::Module& module, const char* what) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_groups.find(&module);
  c10::intrusive_ptr<FSDPParamGroup> g;
  if (it != g_groups.end()) g = it->second.lock();
  HP_CHECK_T(c10::ValueError, g.defined(), "hyper_parallel::", what, ": fully_shard was not applied to this ",
             platform::module_type_name(module));
  return g;
}

// Names each fully_shard group inside `root` by its module's path from it.
void name_groups_under(torch::nn::Module& root) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [prefix, m] : nn::modules_with_names(root)) {
    const auto it = g_groups.find(m);
    if (it == g_groups.end()) continue;
    if (auto g = it->second.lock()) g->set_fqn(prefix);
  }
}

// Checks what fully_shard is given, before anything is planned.
void check_options(const DeviceMesh& dp_mesh, const FullyShardOptions& options) {
  HP_CHECK_T(c10::ValueError, dp_mesh.ndim() == 1 || dp_mesh.ndim() == 2, "hyper_parallel::fully_shard: fully_shard needs the 1-D data-parallel mesh ",
             "(e.g. mesh[\"dp\"]) or, for HSDP, the 2-D (replicate, shard) one (e.g. mesh[{\"dp_replicate\", \"dp_shard\"}]), got a ",
             dp_mesh.ndim(), "-D one");
  for (const auto* dtype : {&options.mp_policy.param_dtype, &options.mp_policy.reduce_dtype, &options.mp_policy.output_dtype})
    HP_CHECK_T(c10::TypeError, !dtype->has_value() || at::isFloatingType(**dtype), "hyper_parallel::fully_shard: the dtypes of a ",
               "MixedPrecisionPolicy are floating-point, got ", **dtype);
}

// How each of `originals` is sharded over dp_mesh; throws, naming it, for the first one that
// cannot be or that an earlier call took over. Changes nothing.
std::vector<FSDPParam> plan_params(const std::vector<at::Tensor>& originals, const std::vector<std::string>& fqns, const DeviceMesh& dp_mesh) {
  std::vector<FSDPParam> params;
  for (size_t k = 0; k < originals.size(); ++k) {
    if (const auto earlier = taken_by_earlier_call(originals[k]))
      HP_CHECK_T(c10::ValueError, false, "hyper_parallel::fully_shard: parameter '", fqns[k], "' is the tensor an earlier fully_shard call ",
                 "took over as ", *earlier, " (a weight tied across two calls would become two parameters); ",
                 "shard every module that uses it in one call, e.g. the one on their common parent");
    params.push_back(plan_param(originals[k], fqns[k], dp_mesh));
  }
  return params;
}

// The group of the planned `params`, their sharded tensors made; `described` names each original
// for a later call that meets it again.
c10::intrusive_ptr<FSDPParamGroup> build_group(std::vector<FSDPParam> params, const std::vector<at::Tensor>& originals,
                                               const std::vector<std::string>& described, const DeviceMesh& dp_mesh,
                                               const FullyShardOptions& options) {
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].sharded = make_sharded(params[k], originals[k], dp_mesh);
    if (originals[k].requires_grad()) params[k].sharded.set_requires_grad(true);
  }
  auto group = c10::make_intrusive<FSDPParamGroup>(std::move(params), dp_mesh, options);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t k = 0; k < originals.size(); ++k) {
    const c10::TensorImpl* key = originals[k].unsafeGetTensorImpl();
    g_taken.erase(key);
    g_taken.emplace(key, Taken{c10::weak_intrusive_ptr<c10::TensorImpl>(originals[k].getIntrusivePtr()), described[k]});
  }
  for (auto it = g_taken.begin(); it != g_taken.end();) it = it->second.tensor.expired() ? g_taken.erase(it) : std::next(it);
  return group;
}

}  // namespace

torch::nn::Module& fully_shard(torch::nn::Module& module, const DeviceMesh& dp_mesh, FullyShardOptions options) {
  platform::hookable(module, module.name());
  check_options(dp_mesh, options);
  // Plan every parameter first: nothing changes unless all of them can be sharded.
  std::vector<at::Tensor> originals;
  std::vector<std::string> fqns, described;
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;
  std::vector<std::vector<std::pair<torch::nn::Module*, std::string>>> aliases;
  std::map<const void*, size_t> planned;  // a tied parameter is one parameter, seen twice
  for (const auto& [prefix, owner] : nn::modules_with_names(module)) {
    for (const auto& item : owner->named_parameters(false)) {
      const auto seen = planned.find(item.value().unsafeGetTensorImpl());
      if (seen != planned.end()) {
        aliases[seen->second].emplace_back(owner, item.key());
        continue;
      }
      if (already_sharded(item.value(), dp_mesh, dp_mesh.root_mesh())) continue;
      const std::string fqn = prefix.empty() ? item.key() : prefix + "." + item.key();
      planned.emplace(item.value().unsafeGetTensorImpl(), originals.size());
      originals.push_back(item.value());
      fqns.push_back(fqn);
      described.push_back("'" + fqn + "' of a " + platform::module_type_name(module));
      owners.emplace_back(owner, item.key());
      aliases.emplace_back();
    }
  }
  std::vector<FSDPParam> params = plan_params(originals, fqns, dp_mesh);
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].owner = owners[k].first;
    params[k].name = owners[k].second;
    params[k].aliases = std::move(aliases[k]);
  }
  auto group = build_group(std::move(params), originals, described, dp_mesh, options);
  for (const FSDPParam& p : group->params()) p.install(p.sharded);  // keeps requires_grad
  const MixedPrecisionPolicy mp = options.mp_policy;
  platform::register_forward_pre_hook(module, [group, mp](nn::Module& m, const std::vector<c10::IValue>& args) -> c10::optional<std::vector<c10::IValue>> {
    // The root's first forward names every group under it by its path (as FSDP2's lazy init):
    // their collectives' labels then say which module's group a rank was in.
    if (group->claim_root()) name_groups_under(m);
    const std::vector<at::Tensor> compute = group->pre_forward();
    for (size_t k = 0; k < compute.size(); ++k) group->params()[k].install(compute[k]);
    if (!mp.cast_forward_inputs || !mp.param_dtype) return c10::nullopt;
    std::vector<c10::IValue> cast;
    for (const auto& a : args) cast.push_back(cast_floating(a, *mp.param_dtype));
    return cast;
  });
  platform::register_forward_hook(
      module,
      [group, mp](nn::Module&, const std::vector<c10::IValue>&, const c10::IValue& out) -> c10::optional<c10::IValue> {
        for (const FSDPParam& p : group->params()) p.install(p.sharded);
        group->post_forward(out);
        if (!mp.output_dtype || out.isNone()) return c10::nullopt;
        return cast_floating(out, *mp.output_dtype);
      },
      /*always_call=*/true);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto it = g_groups.begin(); it != g_groups.end();) it = it->second.expired() ? g_groups.erase(it) : std::next(it);
  g_groups.erase(&module);
  g_groups.emplace(&module, c10::weak_intrusive_ptr<FSDPParamGroup>(group));
  return module;
}

void unshard(torch::nn::Module& module) { group_of(module, "unshard")->unshard(); }

void reshard(torch::nn::Module& module) { group_of(module, "reshard")->reshard(); }

void set_requires_gradient_sync(torch::nn::Module& module, bool requires_sync, bool recurse) {
  std::vector<c10::intrusive_ptr<FSDPParamGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [prefix, m] : nn::modules_with_names(module)) {
      if (!recurse && m != &module) continue;
      const auto it = g_groups.find(m);
      if (it == g_groups.end()) continue;
      if (auto g = it->second.lock()) groups.push_back(std::move(g));
    }
  }
  HP_CHECK_T(c10::ValueError, !groups.empty(), "hyper_parallel::set_requires_gradient_sync: fully_shard was not applied to this ",
             platform::module_type_name(module), recurse ? " nor to any module inside it" : "");
  for (auto& g : groups) g->requires_gradient_sync = requires_sync;
}

bool has_fully_shard(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [prefix, m] : nn::modules_with_names(const_cast<torch::nn::Module&>(module))) {
    const auto it = g_groups.find(m);
    if (it != g_groups.end() && !it->second.expired()) return true;
  }
  return false;
}

void set_modules_to_forward_prefetch(torch::nn::Module& module, const std::vector<torch::nn::Module*>& modules) {
  auto group = group_of(module, "set_modules_to_forward_prefetch");
  std::vector<c10::weak_intrusive_ptr<FSDPParamGroup>> targets;
  for (torch::nn::Module* m : modules) targets.emplace_back(group_of(*m, "set_modules_to_forward_prefetch"));
  group->forward_prefetch = std::move(targets);
}

namespace {
FSDPParamGroup& as_group(const c10::intrusive_ptr<torch::CustomClassHolder>& g) { return static_cast<FSDPParamGroup&>(*g); }
}  // namespace

FullyShardGroup::FullyShardGroup(const std::vector<at::Tensor>& params, const std::vector<std::string>& fqns, const DeviceMesh& dp_mesh,
                                 FullyShardOptions options) {
  HP_CHECK_T(c10::ValueError, params.size() == fqns.size(), "hyper_parallel::FullyShardGroup: ", params.size(), " parameters but ", fqns.size(),
             " names");
  check_options(dp_mesh, options);
  std::map<const void*, std::string> seen;
  for (size_t k = 0; k < params.size(); ++k) {
    const auto [it, fresh] = seen.emplace(params[k].unsafeGetTensorImpl(), fqns[k]);
    HP_CHECK_T(c10::ValueError, fresh, "hyper_parallel::FullyShardGroup: parameters '", it->second, "' and '", fqns[k],
               "' are one tensor (a tied weight is given once)");
  }
  std::vector<std::string> described;
  for (const auto& f : fqns) described.push_back("'" + f + "'");
  group_ = build_group(plan_params(params, fqns, dp_mesh), params, described, dp_mesh, options);
}

std::vector<at::Tensor> FullyShardGroup::sharded_parameters() const {
  std::vector<at::Tensor> out;
  for (const FSDPParam& p : as_group(group_).params()) out.push_back(p.sharded);
  return out;
}

std::vector<at::Tensor> FullyShardGroup::pre_forward() { return as_group(group_).pre_forward(); }

void FullyShardGroup::post_forward(const c10::IValue& output) { as_group(group_).post_forward(output); }

void FullyShardGroup::unshard(bool async_op) {
  if (async_op) as_group(group_).issue_unshard();
  else as_group(group_).unshard();
}

void FullyShardGroup::reshard() { as_group(group_).reshard(); }

std::vector<at::Tensor> FullyShardGroup::unsharded_parameters() const {
  FSDPParamGroup& g = as_group(group_);
  HP_CHECK_T(c10::ValueError, g.is_unsharded(), "hyper_parallel::FullyShardGroup::unsharded_parameters: the group is sharded; unshard() it first");
  g.unshard();  // completes a gather in flight
  std::vector<at::Tensor> out;
  for (const FSDPParam& p : g.params()) out.push_back(p.compute_tensor());
  return out;
}

bool FullyShardGroup::claim_root() { return as_group(group_).claim_root(); }

void FullyShardGroup::set_fqn(const std::string& fqn) { as_group(group_).set_fqn(fqn); }

void FullyShardGroup::set_requires_gradient_sync(bool requires_sync) { as_group(group_).requires_gradient_sync = requires_sync; }

void FullyShardGroup::set_reshard_after_backward(bool reshard_after_backward) {
  as_group(group_).reshard_after_backward = reshard_after_backward;
}

void FullyShardGroup::set_modules_to_forward_prefetch(const std::vector<FullyShardGroup>& groups) {
  std::vector<c10::weak_intrusive_ptr<FSDPParamGroup>> targets;
  for (const FullyShardGroup& g : groups)
    targets.emplace_back(c10::intrusive_ptr<FSDPParamGroup>::reclaim_copy(&as_group(g.group_)));
  as_group(group_).forward_prefetch = std::move(targets);
}

}  // namespace hyper_parallel
