// The boxed fallback at kDTensorKey: every aten op on a DTensor lands here, below autograd. It
// finds the op's sharding decision (cached), redistributes the inputs it needs, runs the op on
// the local shards and wraps the results.
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/sharding_rule.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <mutex>
#include <sstream>
#include <unordered_map>

#include "dtensor_impl.h"
#include "redistribute.h"

namespace hyper_parallel {

// ---------------------------------------------------------------------------------------------
// OpInfo

OpInfo::OpInfo(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs)
    : op_(op), args_(args), nargs_(nargs) {}

int64_t OpInfo::written_arg() const {
  if (written_arg_ == -2) {
    written_arg_ = -1;
    const auto& a = op_.schema().arguments();
    for (size_t i = 0; i < a.size(); ++i) {
      const auto* alias = a[i].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        written_arg_ = static_cast<int64_t>(i);
        break;
      }
    }
  }
  return written_arg_;
}

std::string OpInfo::name() const {
  const auto& n = op_.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

const DTensorSpec* OpInfo::spec(size_t arg, int64_t elem) const {
  for (const auto& in : inputs_)
    if (in.arg == arg && in.elem == elem) return in.spec;
  return nullptr;
}

int64_t OpInfo::input_index(size_t arg, int64_t elem) const {
  for (size_t k = 0; k < inputs_.size(); ++k)
    if (inputs_[k].arg == arg && inputs_[k].elem == elem) return static_cast<int64_t>(k);
  return -1;
}

void OpInfo::add_input(size_t arg, int64_t elem, const DTensorSpec* spec) {
  inputs_.push_back({arg, elem, spec});
}

std::string OpInfo::describe() const {
  std::ostringstream os;
  os << name() << " with inputs (";
  for (size_t k = 0; k < inputs_.size(); ++k) {
    const auto& in = inputs_[k];
    os << (k ? ", " : "") << schema().arguments()[in.arg].name();
    if (in.elem >= 0) os << "[" << in.elem << "]";
    os << ": " << to_string(in.spec->placements) << " " << c10::IntArrayRef(in.spec->shape) << " " << in.spec->dtype;
  }
  os << ")";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Rule registry and decision cache

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<std::string, ShardingRule>& registry() {
  static std::unordered_map<std::string, ShardingRule> r;
  return r;
}
std::atomic<uint64_t> g_registry_version{0};

struct Decision {
  std::vector<Placements> input_placements;  // one per input, resolved
  std::vector<bool> redistribute;            // per input: placements differ
  // Per return slot: one spec (Tensor) or one per element (Tensor[]); null for non-tensors.
  // Mutable: a return's dtype is learnt from the first local result when no meta run gave it.
  mutable std::vector<std::vector<std::shared_ptr<const DTensorSpec>>> outputs;
  std::vector<std::vector<std::vector<int64_t>>> local_shapes;
  std::vector<int64_t> written_return_arg;  // per return slot: the argument it aliases, or -1
  std::vector<int64_t> view_return_arg;     // per return slot: the argument it is a view of, or -1
  std::vector<bool> view_base_moved;        // per return slot: that argument is redistributed first
  std::vector<size_t> written_inputs;       // indices into OpInfo::inputs() the op writes
  std::function<void(torch::jit::Stack&)> adjust_args;
  std::function<void(const c10::OperatorHandle&, torch::jit::Stack*)> kernel;
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Cache {
  uint64_t version = 0;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Decision>, KeyHash> map;
};
// Per thread: no lock on the hot path (autograd may run backward on other threads).
thread_local Cache t_cache;

const ShardingRule* find_rule(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto& n = op.operator_name();
  auto& r = registry();
  if (!n.overload_name.empty()) {
    auto it = r.find(n.name + "." + n.overload_name);
    if (it != r.end()) return &it->second;
  }
  auto it = r.find(n.name);
  return it == r.end() ? nullptr : &it->second;
}

// ---- key building: the spec content, shapes and integer arguments; not float values.
enum Tag : int64_t { kNone = 1, kDT, kPlain, kList, kInt, kBool, kDouble, kScalar, kString, kOther, kIntList };

void key_spec(std::vector<int64_t>& k, const DTensorSpec& s) {
  k.push_back(kDT);
  k.push_back(reinterpret_cast<int64_t>(s.mesh.impl()));
  k.push_back(static_cast<int64_t>(s.dtype));
  k.push_back(s.ndim());
  for (auto x : s.shape) k.push_back(x);
  for (auto x : s.stride) k.push_back(x);
  k.push_back(s.storage_offset);
  for (const auto& p : s.placements) k.push_back(static_cast<int64_t>(p.hash()));
}

void key_plain(std::vector<int64_t>& k, const at::Tensor& t) {
  k.push_back(kPlain);
  k.push_back(static_cast<int64_t>(t.scalar_type()));
  k.push_back(t.dim());
  for (auto x : t.sizes()) k.push_back(x);
}

void key_value(std::vector<int64_t>& k, const c10::IValue& v) {
  if (v.isNone()) k.push_back(kNone);
  else if (v.isInt()) { k.push_back(kInt); k.push_back(v.toInt()); }
  else if (v.isBool()) { k.push_back(kBool); k.push_back(v.toBool()); }
  else if (v.isDouble()) k.push_back(kDouble);
  else if (v.isScalar()) { k.push_back(kScalar); k.push_back(static_cast<int64_t>(v.toScalar().type())); }
  else if (v.isIntList()) {
    k.push_back(kIntList);
    auto l = v.toIntList();
    k.push_back(static_cast<int64_t>(l.size()));
    for (int64_t x : l) k.push_back(x);
  } else if (v.isString()) { k.push_back(kString); k.push_back(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef()))); }
  else if (v.isDevice()) { k.push_back(kOther); k.push_back(static_cast<int64_t>(v.toDevice().type())); }
  else k.push_back(kOther);
}

[[noreturn]] void mixed_error(const OpInfo& info, size_t arg, const at::Tensor& t) {
  TORCH_CHECK(false, "hyper_parallel: ", info.name(), " got a plain tensor (argument '",
              info.schema().arguments()[arg].name(), "', shape ", t.sizes(),
              ") mixed with DTensors; convert it with DTensor::from_local or distribute_tensor, "
              "or run the op inside an ImplicitReplicationGuard to treat it as replicated");
}

// A plain tensor among DTensors: a 0-dim tensor is a scalar; otherwise an error unless implicit
// replication is on, when it becomes a Replicate input.
//
// During autograd's backward the plain tensors are libtorch's own (zeros for unused outputs of a
// split, targets and indices saved from the forward, masks of decompositions): they are the same
// on every rank, so they are replicated there as inside an ImplicitReplicationGuard (PyTorch's
// implicit replication); a plain tensor could only have met a DTensor in the forward under that
// guard anyway.
bool accept_plain(OpInfo& info, size_t arg, int64_t elem, const at::Tensor& t, std::vector<int64_t>& key) {
  const bool implicit = ImplicitReplicationGuard::enabled() ||
                        torch::autograd::get_current_graph_task_exec_info() != nullptr;
  if (t.dim() == 0 && !implicit) {
    key_plain(key, t);
    return false;
  }
  if (!implicit) mixed_error(info, arg, t);
  auto s = std::make_unique<DTensorSpec>();
  s->mesh = info.mesh();
  s->placements = Placements(static_cast<size_t>(info.mesh().ndim()), Replicate());
  s->shape = t.sizes().vec();
  s->stride = contiguous_strides(s->shape);
  s->dtype = t.scalar_type();
  key_spec(key, *s);
  info.add_input(arg, elem, s.get());
  info.owned_specs().push_back(std::move(s));
  return true;
}

at::TensorOptions meta_options(at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(at::kMeta);
}

at::Tensor meta_of(const at::Tensor& t) {
  DTensorImpl* d = dtensor_impl(t);
  if (d == nullptr) return at::empty_strided(t.sizes(), t.strides(), meta_options(t.scalar_type()));
  const DTensorSpec& s = d->spec();
  if (s.storage_offset == 0) return at::empty_strided(s.shape, s.stride, meta_options(s.dtype));
  // A view keeps its offset, so the meta run reports the offsets of the views it makes.
  int64_t extent = 1;
  for (size_t k = 0; k < s.shape.size(); ++k) {
    if (s.shape[k] == 0) { extent = 0; break; }
    extent += (s.shape[k] - 1) * s.stride[k];
  }
  return at::empty({s.storage_offset + extent}, meta_options(s.dtype)).as_strided(s.shape, s.stride, s.storage_offset);
}

// Runs the op on meta tensors of the global shapes: the global shapes and strides of its returns.
std::vector<c10::IValue> run_on_meta(const OpInfo& info) {
  torch::jit::Stack s;
  s.reserve(info.num_args());
  for (size_t i = 0; i < info.num_args(); ++i) {
    const auto& v = info.arg(i);
    if (v.isTensor()) {
      s.emplace_back(v.toTensor().defined() ? meta_of(v.toTensor()) : v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList()) l.push_back(meta_of(t));
      s.emplace_back(l);
    } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
      auto in = v.toList();
      c10::impl::GenericList out(in.elementType());
      for (const c10::IValue& e : in) out.push_back(e.isTensor() && e.toTensor().defined() ? c10::IValue(meta_of(e.toTensor())) : e);
      s.emplace_back(out);
    } else {
      s.push_back(v);
    }
  }
  try {
    info.op().callBoxed(&s);
  } catch (const c10::NotImplementedError& e) {
    TORCH_CHECK(false, "hyper_parallel: cannot infer the output shapes of ", info.describe(),
                ": the op has no meta kernel and its sharding rule gives no output shapes (",
                e.what_without_backtrace(), ")");
  } catch (const c10::Error& e) {
    // The op itself refuses these inputs (a dtype or shape mismatch): the same error a plain
    // tensor would get, with the placements.
    TORCH_CHECK(false, "hyper_parallel: ", info.describe(), ": ", e.what_without_backtrace());
  }
  return s;
}

std::shared_ptr<const Decision> decide(OpInfo& info) {
  const ShardingRule* rule = find_rule(info.op());
  TORCH_CHECK(rule != nullptr, "hyper_parallel: no sharding rule for ", info.describe(),
              "; register one with hyper_parallel::register_sharding_rule, or leave DTensor land "
              "first (full_tensor() / to_local())");
  OpSharding s = (*rule)(info);
  auto d = std::make_shared<Decision>();
  const auto& inputs = info.inputs();
  d->input_placements.resize(inputs.size());
  d->redistribute.resize(inputs.size());
  TORCH_INTERNAL_ASSERT(s.input_placements.empty() || s.input_placements.size() == inputs.size(),
                        "sharding rule of ", info.name(), " gave ", s.input_placements.size(),
                        " input placements for ", inputs.size(), " inputs");
  for (size_t k = 0; k < inputs.size(); ++k) {
    d->input_placements[k] = s.input_placements.empty()
                                 ? inputs[k].spec->placements
                                 : normalize_placements(s.input_placements[k], inputs[k].spec->ndim());
    d->redistribute[k] = d->input_placements[k] != inputs[k].spec->placements;
  }
  const auto& rets = info.schema().returns();
  const auto& args = info.schema().arguments();
  d->written_return_arg.assign(rets.size(), -1);
  d->view_return_arg.assign(rets.size(), -1);
  for (size_t r = 0; r < rets.size(); ++r) {
    const auto* ra = rets[r].alias_info();
    // A list of views (split, unbind, chunk) carries its alias set on the element type.
    if (ra != nullptr && ra->beforeSets().empty() && !ra->containedTypes().empty()) ra = &ra->containedTypes()[0];
    if (ra == nullptr) continue;
    for (size_t a = 0; a < args.size(); ++a) {
      const auto* aa = args[a].alias_info();
      if (aa == nullptr || aa->beforeSets() != ra->beforeSets()) continue;
      if (ra->isWrite() && aa->isWrite()) d->written_return_arg[r] = static_cast<int64_t>(a);
      else if (!ra->isWrite()) d->view_return_arg[r] = static_cast<int64_t>(a);
      break;
    }
  }
  d->view_base_moved.assign(rets.size(), false);
  for (size_t r = 0; r < rets.size(); ++r) {
    if (d->view_return_arg[r] < 0) continue;
    const int64_t k = info.input_index(static_cast<size_t>(d->view_return_arg[r]));
    d->view_base_moved[r] = k >= 0 && d->redistribute[static_cast<size_t>(k)];
  }
  // Written arguments keep their layout: an in-place op cannot change placements.
  for (size_t k = 0; k < inputs.size(); ++k) {
    const auto& in = inputs[k];
    const auto* alias = args[in.arg].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    d->written_inputs.push_back(k);
    HP_CHECK_T(c10::ValueError, !d->redistribute[k], "hyper_parallel: ", info.describe(),
               " would have to change the placements of its in-place/out argument '",
               args[in.arg].name(), "' from ", to_string(in.spec->placements), " to ",
               to_string(d->input_placements[k]), "; use the out-of-place op");
  }

  d->outputs.resize(rets.size());
  d->local_shapes.resize(rets.size());
  std::vector<c10::IValue> meta;
  bool need_meta = false;
  for (size_t r = 0; r < rets.size(); ++r) {
    if (d->written_return_arg[r] >= 0) continue;
    const auto& type = rets[r].type();
    const bool is_tensor = type->kind() == c10::TypeKind::TensorType ||
                           type->isSubtypeOf(*c10::ListType::ofTensors());
    if (is_tensor && s.output_shapes.empty()) need_meta = true;
  }
  if (need_meta) meta = run_on_meta(info);
  const auto coord = info.mesh().get_coordinate();
  auto make_spec = [&](const Placements& pl, std::vector<int64_t> shape, std::vector<int64_t> stride,
                       at::ScalarType dtype, size_t r, int64_t offset = 0) {
    auto spec = std::make_shared<DTensorSpec>();
    spec->storage_offset = offset;
    spec->mesh = info.mesh();
    spec->placements = normalize_placements(pl, static_cast<int64_t>(shape.size()));
    spec->shape = std::move(shape);
    spec->stride = stride.empty() ? contiguous_strides(spec->shape) : std::move(stride);
    spec->dtype = dtype;
    d->local_shapes[r].push_back(coord ? spec->local_shape_and_offset(*coord).first : spec->shape);
    d->outputs[r].push_back(std::move(spec));
  };
  // The dtype of a return is not part of the decision's inputs in general (type promotion):
  // it is filled in from the local result when wrapping.
  const at::ScalarType unknown = at::ScalarType::Undefined;
  size_t shape_index = 0;
  for (size_t r = 0; r < rets.size(); ++r) {
    if (d->written_return_arg[r] >= 0) { ++shape_index; continue; }
    const auto& type = rets[r].type();
    const bool is_list = type->isSubtypeOf(*c10::ListType::ofTensors());
    if (type->kind() != c10::TypeKind::TensorType && !is_list) continue;
    TORCH_INTERNAL_ASSERT(r < s.output_placements.size(), "sharding rule of ", info.name(),
                          " gave no placements for return ", r);
    const Placements& pl = s.output_placements[r];
    if (!meta.empty()) {
      const c10::IValue& m = meta[r];
      if (is_list) {
        for (const at::Tensor& t : m.toTensorList())
          make_spec(pl, t.sizes().vec(), t.strides().vec(), t.scalar_type(), r, t.storage_offset());
      } else if (m.isTensor() && m.toTensor().defined()) {
        const at::Tensor& t = m.toTensor();
        make_spec(pl, t.sizes().vec(), t.strides().vec(), t.scalar_type(), r, t.storage_offset());
      } else {
        d->outputs[r].push_back(nullptr);
        d->local_shapes[r].emplace_back();
      }
    } else {
      TORCH_INTERNAL_ASSERT(!is_list && shape_index < s.output_shapes.size(), "sharding rule of ",
                            info.name(), " gave no output shape for return ", r);
      make_spec(pl, s.output_shapes[shape_index], {}, unknown, r);
    }
    ++shape_index;
  }
  d->adjust_args = std::move(s.adjust_args);
  d->kernel = std::move(s.kernel);
  return d;
}

// Wraps local result `t` with `spec`, whose dtype is corrected from `t` (once per decision).
at::Tensor wrap(const at::Tensor& t, std::shared_ptr<const DTensorSpec>& spec,
                const std::vector<int64_t>& local_shape, const OpInfo& info) {
  if (!t.defined()) return t;
  TORCH_CHECK(t.sizes() == c10::IntArrayRef(local_shape), "hyper_parallel: ", info.describe(),
              " produced a local result of shape ", t.sizes(), " where ",
              to_string(spec->placements), " of the global shape ", c10::IntArrayRef(spec->shape),
              " needs ", c10::IntArrayRef(local_shape), " (a sharding rule is wrong)");
  if (spec->dtype != t.scalar_type()) {
    auto s = std::make_shared<DTensorSpec>(*spec);
    s->dtype = t.scalar_type();
    spec = std::move(s);
  }
  return make_dtensor(t, spec);
}

at::Tensor local_of(const at::Tensor& t, const Decision& d, const OpInfo& info, size_t arg, int64_t elem) {
  const int64_t k = info.input_index(arg, elem);
  if (k < 0) return t;  // a 0-dim plain tensor
  const auto& in = info.inputs()[static_cast<size_t>(k)];
  DTensorImpl* impl = dtensor_impl(t);
  const at::Tensor& local = impl ? impl->local() : t;
  if (!d.redistribute[static_cast<size_t>(k)]) return local;
  return redistribute_local(local, *in.spec, d.input_placements[static_cast<size_t>(k)]);
}

void dtensor_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  c10::IValue* args = stack->data() + base;

  OpInfo info(op, args, nargs);
  // The mesh: the first DTensor's.
  const DeviceMesh* mesh = nullptr;
  auto consider = [&](const at::Tensor& t) {
    if (DTensorImpl* d = dtensor_impl(t)) mesh = &d->spec().mesh;
    return mesh != nullptr;
  };
  for (size_t i = 0; i < nargs && mesh == nullptr; ++i) {
    const auto& v = args[i];
    if (v.isTensor()) consider(v.toTensor());
    else if (v.isTensorList()) { for (const at::Tensor& t : v.toTensorList()) if (consider(t)) break; }
    else if (v.isList()) { for (const c10::IValue& e : v.toListRef()) if (e.isTensor() && consider(e.toTensor())) break; }
  }
  TORCH_INTERNAL_ASSERT(mesh != nullptr, "DTensor fallback reached without a DTensor argument for ", info.name());
  info.set_mesh(mesh);

  std::vector<int64_t> key;
  key.reserve(64);
  key.push_back(reinterpret_cast<int64_t>(&schema));
  auto add_tensor = [&](size_t i, int64_t elem, const at::Tensor& t) {
    if (!t.defined()) { key.push_back(kNone); return; }
    if (DTensorImpl* d = dtensor_impl(t)) {
      HP_CHECK_T(c10::ValueError, d->spec().mesh == info.mesh(), "hyper_parallel: ", info.name(),
                 " got DTensors on different meshes: ", d->spec().mesh.to_string(), " and ",
                 info.mesh().to_string());
      key_spec(key, d->spec());
      info.add_input(i, elem, &d->spec());
    } else {
      accept_plain(info, i, elem, t, key);
    }
  };
  for (size_t i = 0; i < nargs; ++i) {
    const auto& v = args[i];
    if (v.isTensor()) {
      add_tensor(i, -1, v.toTensor());
    } else if (v.isTensorList()) {
      auto l = v.toTensorList();
      key.push_back(kList);
      key.push_back(static_cast<int64_t>(l.size()));
      for (size_t j = 0; j < l.size(); ++j) add_tensor(i, static_cast<int64_t>(j), l.get(j));
    } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
      const auto& l = v.toListRef();
      key.push_back(kList);
      key.push_back(static_cast<int64_t>(l.size()));
      for (size_t j = 0; j < l.size(); ++j) {
        if (l[j].isTensor()) add_tensor(i, static_cast<int64_t>(j), l[j].toTensor());
        else key_value(key, l[j]);
      }
    } else {
      key_value(key, v);
    }
  }

  const uint64_t version = g_registry_version.load(std::memory_order_relaxed);
  if (t_cache.version != version) {
    t_cache.map.clear();
    t_cache.version = version;
  }
  std::shared_ptr<const Decision> d;
  auto it = t_cache.map.find(key);
  if (it != t_cache.map.end()) {
    d = it->second;
  } else {
    // A composite op (linear, matmul, dropout, ...) reaches DTensors undecomposed only when autograd
    // is off for the call (c10::InferenceMode skips the Autograd keys, where its decomposition
    // normally runs). Decompose it here, as autograd would have: its pieces come back to us one by
    // one. Explicit rules win.
    if (find_rule(op) == nullptr && op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      const at::Tensor* first = nullptr;
      for (size_t i = 0; i < nargs && first == nullptr; ++i)
        if (args[i].isTensor() && dtensor_impl(args[i].toTensor()) != nullptr) first = &args[i].toTensor();
      const c10::Device device = first != nullptr ? dtensor_impl(*first)->local().device() : c10::Device(c10::kCPU);
      op.redispatchBoxed(c10::DispatchKeySet(c10::computeDispatchKey(c10::nullopt, c10::kStrided, device)), stack);
      return;
    }
    d = decide(info);
    // Shapes that keep changing (variable sequence lengths) would grow the cache without bound.
    if (t_cache.map.size() >= 65536) t_cache.map.clear();
    t_cache.map.emplace(std::move(key), d);
  }

  // A write into a view whose local data is a copy would be lost: refuse it (on every rank: the
  // flag comes from placements, which all ranks share).
  for (size_t k : d->written_inputs) {
    const auto& in = info.inputs()[k];
    const c10::IValue& v = args[in.arg];
    const at::Tensor& t = in.elem < 0 ? v.toTensor() : v.toTensorList().get(static_cast<size_t>(in.elem));
    DTensorImpl* impl = dtensor_impl(t);
    HP_CHECK_T(c10::NotImplementedError, impl == nullptr || !impl->is_copy_view(), "hyper_parallel: ",
               info.describe(), " writes in place into a view of a DTensor whose local data is a copy "
               "(making the view needed communication, e.g. a narrow/select/split along a sharded dim): "
               "the write would not reach the viewed DTensor. In-place operations that require "
               "placement changes are not supported; write into the base with an out-of-place op and "
               "copy_, or redistribute the base first");
  }

  // The local arguments.
  std::vector<c10::IValue> original(std::make_move_iterator(stack->begin() + static_cast<std::ptrdiff_t>(base)),
                                    std::make_move_iterator(stack->end()));
  torch::jit::Stack local_args;
  local_args.reserve(nargs);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard no_dtensor(kDTensorKey);
    for (size_t i = 0; i < nargs; ++i) {
      const auto& v = original[i];
      if (v.isTensor()) {
        local_args.emplace_back(local_of(v.toTensor(), *d, info, i, -1));
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> l;
        auto in = v.toTensorList();
        l.reserve(in.size());
        for (size_t j = 0; j < in.size(); ++j) l.push_back(local_of(in.get(j), *d, info, i, static_cast<int64_t>(j)));
        local_args.emplace_back(std::move(l));
      } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
        auto in = v.toList();
        c10::impl::GenericList l(in.elementType());
        for (size_t j = 0; j < in.size(); ++j) {
          c10::IValue e = in.get(j);
          l.push_back(e.isTensor() ? c10::IValue(local_of(e.toTensor(), *d, info, i, static_cast<int64_t>(j))) : e);
        }
        local_args.emplace_back(std::move(l));
      } else {
        local_args.push_back(v);
      }
    }
    if (d->adjust_args) d->adjust_args(local_args);
    stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
    for (auto& v : local_args) stack->push_back(std::move(v));
    if (d->kernel) d->kernel(op, stack);
    else op.callBoxed(stack);
  }

  // Wrap the returns.
  const size_t nret = schema.returns().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= nret);
  const size_t rbase = stack->size() - nret;
  for (size_t r = 0; r < nret; ++r) {
    c10::IValue& v = (*stack)[rbase + r];
    // A view's local result must be a view of its base's local data; otherwise it is a copy.
    DTensorImpl* base = nullptr;
    const bool base_moved = d->view_base_moved[r];
    if (d->view_return_arg[r] >= 0) {
      const auto a = static_cast<size_t>(d->view_return_arg[r]);
      if (original[a].isTensor()) base = dtensor_impl(original[a].toTensor());
    }
    // Under c10::InferenceMode a view of a normal tensor must be a normal tensor (autograd's view
    // tracking gives it the base's version counter), as libtorch's own views are.
    const bool normal_view = base != nullptr && c10::InferenceMode::is_enabled() && !base->is_inference();
    auto wrap_output = [&](const at::Tensor& local, std::shared_ptr<const DTensorSpec>& spec,
                           const std::vector<int64_t>& shape) {
      at::Tensor w;
      if (normal_view) {
        c10::InferenceMode normal(false);
        w = wrap(local, spec, shape, info);
      } else {
        w = wrap(local, spec, shape, info);
      }
      if (base != nullptr && w.defined() && (base_moved || base->is_copy_view() || !local.is_alias_of(base->local())))
        static_cast<DTensorImpl*>(w.unsafeGetTensorImpl())->set_copy_view(true);
      return w;
    };
    if (d->written_return_arg[r] >= 0) {
      // The very same tensor (autograd's in-place wrappers return their own self anyway).
      v = original[static_cast<size_t>(d->written_return_arg[r])];
    } else if (v.isTensor()) {
      if (!d->outputs[r].empty() && d->outputs[r][0]) v = wrap_output(v.toTensor(), d->outputs[r][0], d->local_shapes[r][0]);
    } else if (v.isTensorList()) {
      auto l = v.toTensorList();
      TORCH_CHECK(l.size() == d->outputs[r].size(), "hyper_parallel: ", info.describe(), " returned ",
                  l.size(), " local tensors where the global op returns ", d->outputs[r].size());
      for (size_t j = 0; j < l.size(); ++j) l.set(j, wrap_output(l.get(j), d->outputs[r][j], d->local_shapes[r][j]));
      v = l;
    }
  }
}

}  // namespace

void register_sharding_rule(const std::string& op_name, ShardingRule rule) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[op_name] = std::move(rule);
  g_registry_version.fetch_add(1);
}

void clear_sharding_cache() { g_registry_version.fetch_add(1); }

}  // namespace hyper_parallel

TORCH_LIBRARY_IMPL(_, Fake, m) {
  static_assert(hyper_parallel::kDTensorKey == c10::DispatchKey::Fake,
                "the fallback registration must name kDTensorKey");
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&hyper_parallel::dtensor_fallback>());
}
