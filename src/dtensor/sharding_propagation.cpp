// Sharding propagation: the decision key, the cache, and building a decision from a rule (the
// registry of rules and handlers is sharding_registry.cpp).
#include "sharding_propagation.h"

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/loss_parallel.h>

#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/memory_tracker.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/graph_task.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "dtensor_impl.h"
#include "local_layout.h"
#include "op_args.h"

namespace hyper_parallel {

// ---------------------------------------------------------------------------------------------
// The decision key: spec contents, shapes and integer arguments; not floating-point values.

namespace {

template <class Key>
void key_spec_contents(Key& k, const DTensorSpec& s) {
  k.push_back(reinterpret_cast<int64_t>(s.mesh.impl()));
  k.push_back(static_cast<int64_t>(s.dtype));
  k.push_back(s.ndim());
  for (auto x : s.shape) k.push_back(x);
  for (auto x : s.stride) k.push_back(x);
  k.push_back(s.storage_offset);
  for (const auto& p : s.placements) k.push_back(static_cast<int64_t>(p.hash()));
}

// FNV-1a over the integers, then mixed so that the low bits a power-of-two table takes depend on
// the high ones too.
uint64_t hash_key(c10::ArrayRef<int64_t> key) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t x : key) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const { return static_cast<size_t>(hash_key(v)); }
};

}  // namespace

// Specs with the same contents get the same name, once per spec object: the decision key then
// holds one integer per DTensor input instead of its shape, strides and placements. Names are
// never reused (a cleared table only gives new ones), so equal names always mean equal contents.
//
// The mesh is named by its address, as before the names; its shape goes in too, so that a mesh
// made later at a freed mesh's address cannot take the name of a spec on the old one.
int64_t name_spec(const DTensorSpec& s) {
  std::vector<int64_t> contents;
  key_spec_contents(contents, s);
  for (int64_t n : s.mesh.shape()) contents.push_back(n);
  static std::mutex mutex;
  static std::unordered_map<std::vector<int64_t>, int64_t, KeyHash> names;
  static int64_t last = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (names.size() >= (1u << 20)) names.clear();  // shapes that keep changing
  auto [it, inserted] = names.try_emplace(std::move(contents), last + 1);
  if (inserted) ++last;
  s.key_id.value.store(it->second, std::memory_order_relaxed);
  return it->second;
}

namespace {

void key_plain(DecisionKey& k, const at::Tensor& t) {
  k.push_back(kKeyPlain);
  k.push_back(static_cast<int64_t>(t.scalar_type()));
  k.push_back(t.dim());
  for (auto x : t.sizes()) k.push_back(x);
}

void key_value(DecisionKey& k, const c10::IValue& v) {
  if (v.isNone()) k.push_back(kKeyNone);
  else if (v.isInt()) { k.push_back(kKeyInt); k.push_back(v.toInt()); }
  else if (v.isBool()) { k.push_back(kKeyBool); k.push_back(v.toBool()); }
  else if (v.isDouble()) k.push_back(kKeyDouble);
  else if (v.isScalar()) { k.push_back(kKeyScalar); k.push_back(static_cast<int64_t>(v.toScalar().type())); }
  else if (v.isIntList()) {
    k.push_back(kKeyIntList);
    auto l = v.toIntList();
    k.push_back(static_cast<int64_t>(l.size()));
    for (int64_t x : l) k.push_back(x);
  } else if (v.isBoolList()) {
    // native_layer_norm_backward's output_mask: which returns are defined, so the decision's specs.
    k.push_back(kKeyBoolList);
    auto l = v.toBoolList();
    k.push_back(static_cast<int64_t>(l.size()));
    for (bool x : l) k.push_back(x);
  } else if (v.isDoubleList()) {
    k.push_back(kKeyDoubleList);
    k.push_back(static_cast<int64_t>(v.toDoubleList().size()));
  } else if (v.isString()) { k.push_back(kKeyString); k.push_back(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef()))); }
  else if (v.isDevice()) { k.push_back(kKeyOther); k.push_back(static_cast<int64_t>(v.toDevice().type())); }
  else k.push_back(kKeyOther);
}

// The loss ops whose plain targets and class weights LossParallelGuard takes as replicated.
bool takes_replicated_targets(const OpInfo& info) {
  const std::string& name = info.schema().name();
  return name == "aten::nll_loss_forward" || name == "aten::nll_loss2d_forward";
}

[[noreturn]] void mixed_error(const OpInfo& info, size_t arg, const at::Tensor& t) {
  TORCH_CHECK(false, "hyper_parallel::dispatch: ", info.name(), " got a plain tensor (argument '",
              info.schema().arguments()[arg].name(), "', shape ", t.sizes(),
              ") mixed with DTensors; convert it with DTensor::from_local or distribute_tensor, "
              "or run the op inside an ImplicitReplicationGuard to treat it as replicated (loss_parallel takes only the loss ops' "
              "targets and class weights as replicated)");
}

}  // namespace

const DeviceMesh* find_mesh(const c10::IValue* args, size_t nargs) {
  struct {
    const DeviceMesh* mesh = nullptr;
    bool tensor(size_t, int64_t, const at::Tensor& t) {
      if (DTensorImpl* d = dtensor_impl(t)) mesh = &d->spec().mesh;
      return mesh == nullptr;
    }
    void list(size_t, size_t) {}
    void value(const c10::IValue&) {}
  } v;
  visit_args(args, nargs, v);
  return v.mesh;
}

const DeviceMesh& OpInfoAccess::mesh(const OpInfo& info) {
  TORCH_INTERNAL_ASSERT(info.mesh_ != nullptr, "an OpInfo described by data has no mesh");
  return *info.mesh_;
}

void OpInfoAccess::add_input(OpInfo& info, size_t arg, int64_t elem, const DTensorSpec* spec) {
  info.inputs_.push_back({arg, elem, spec});
}

void OpInfoAccess::add_input(OpInfo& info, size_t arg, int64_t elem, std::unique_ptr<DTensorSpec> spec) {
  info.inputs_.push_back({arg, elem, spec.get()});
  info.owned_.push_back(std::move(spec));
}

namespace {

// Walks the arguments once: the inputs of `info` and the decision key.
struct InputCollector {
  OpInfo& info;
  const DeviceMesh& mesh;
  DecisionKey& key;

  bool tensor(size_t arg, int64_t elem, const at::Tensor& t) {
    if (!t.defined()) {
      key.push_back(kKeyNone);
    } else if (DTensorImpl* d = dtensor_impl(t)) {
      HP_CHECK_T(c10::ValueError, d->spec().mesh == mesh, "hyper_parallel::dispatch: ", info.name(),
                 " got DTensors on different meshes: ", d->spec().mesh.to_string(), " and ", mesh.to_string());
      if (d->is_stale_copy_view()) stale_read(arg, elem, *d);
      key.push_back(kKeyDT);
      key.push_back(spec_key_name(d->spec()));
      OpInfoAccess::add_input(info, arg, elem, &d->spec());
    } else {
      plain(arg, elem, t);
    }
    return true;
  }
  void list(size_t, size_t size) {
    key.push_back(kKeyList);
    key.push_back(static_cast<int64_t>(size));
  }
  void value(const c10::IValue& v) { key_value(key, v); }

  [[noreturn]] void stale_read(size_t arg, int64_t elem, const DTensorImpl& d) {
    std::string name = "argument '" + info.schema().arguments()[arg].name() + "'";
    if (elem >= 0) name += "[" + std::to_string(elem) + "]";
    stale_copy_view_error(*d.copy_source(), "hyper_parallel::dispatch: " + info.name(), name + " (" + d.spec().short_string() + ")");
  }

  // A plain tensor among DTensors: a 0-dim tensor is a scalar; otherwise an error unless implicit
  // replication is on, when it becomes a Replicate input.
  //
  // During autograd's backward the plain tensors are libtorch's own (zeros for unused outputs of a
  // split, targets and indices saved from the forward, masks of decompositions): they are the same
  // on every rank, so they are replicated there as inside an ImplicitReplicationGuard (PyTorch's
  // implicit replication); a plain tensor could only have met a DTensor in the forward under that
  // guard anyway.
  void plain(size_t arg, int64_t elem, const at::Tensor& t) {
    const bool loss_target = LossParallelGuard::enabled() && takes_replicated_targets(info);
    if (loss_target && arg == 1 && info.spec(0) != nullptr) {
      // A batch sharded on a mesh dim makes a whole plain target ambiguous (the whole batch's, or
      // this rank's rows?), as PyTorch says.
      const Placements& x = info.spec(0)->placements;
      const bool batch_sharded = std::any_of(x.begin(), x.end(), [](const Placement& p) { return p.is_shard() && p.dim() != 1; });
      HP_CHECK_T(c10::ValueError, !batch_sharded, "hyper_parallel::loss_parallel: loss_parallel() requires a DTensor (not a plain "
                 "torch.Tensor) target when the input ", to_string(x), " is sharded on a dim other than the class dim; wrap "
                 "the target with DTensor.from_local or distribute_tensor to make its sharding explicit");
    }
    const bool implicit = ImplicitReplicationGuard::enabled() ||
                          torch::autograd::get_current_graph_task_exec_info() != nullptr || loss_target;
    if (t.dim() == 0 && !implicit) return key_plain(key, t);
    // One element in a non-scalar shape: replicated, as PyTorch takes it (with its warning).
    if (!implicit && t.numel() == 1) {
      TORCH_WARN_ONCE("hyper_parallel::dispatch: found a non-scalar tensor with numel=1 and ndim!=0 (argument '",
                      info.schema().arguments()[arg].name(), "' of ", info.name(), "); it is taken as replicated. Make it a "
                      "scalar tensor, or a DTensor with distribute_tensor");
    } else if (!implicit) {
      mixed_error(info, arg, t);
    }
    auto s = std::make_unique<DTensorSpec>(mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()),
                                           t.sizes().vec(), t.scalar_type());
    // A spec made for this call alone: keyed by its contents (naming it would cost more).
    key.push_back(kKeyReplicatedPlain);
    key_spec_contents(key, *s);
    OpInfoAccess::add_input(info, arg, elem, std::move(s));
  }
};

}  // namespace

void collect_inputs(OpInfo& info, DecisionKey& key) {
  key.clear();
  InputCollector v{info, OpInfoAccess::mesh(info), key};
  key.push_back(reinterpret_cast<int64_t>(&info.schema()));
  // Rules check loss_parallel's contract: a decision made outside it is not reused inside.
  if (LossParallelGuard::enabled()) key.push_back(kKeyLossParallel);
  visit_args(info.args(), info.num_args(), v);
}

// ---------------------------------------------------------------------------------------------
// Building a decision

namespace {

at::Tensor meta_of(const at::Tensor& t) {
  const auto meta = [](at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(at::kMeta); };
  if (!t.defined()) return t;
  DTensorImpl* d = dtensor_impl(t);
  if (d == nullptr) return at::empty_strided(t.sizes(), t.strides(), meta(t.scalar_type()));
  const DTensorSpec& s = d->spec();
  if (s.storage_offset == 0) return at::empty_strided(s.shape, s.stride, meta(s.dtype));
  // A view keeps its offset, so the meta run reports the offsets of the views it makes.
  int64_t extent = 1;
  for (size_t k = 0; k < s.shape.size(); ++k) {
    if (s.shape[k] == 0) { extent = 0; break; }
    extent += (s.shape[k] - 1) * s.stride[k];
  }
  return at::empty({s.storage_offset + extent}, meta(s.dtype)).as_strided(s.shape, s.stride, s.storage_offset);
}

// Runs the op on meta tensors of the global shapes: the global shapes and strides of its returns.
std::vector<c10::IValue> run_on_meta(const OpInfo& info) {
  const UncountedAllocations bookkeeping;  // whole tensors no real run allocates
  torch::jit::Stack s = map_tensor_args(info.args(), info.num_args(), [](size_t, int64_t, const at::Tensor& t) { return meta_of(t); });
  try {
    // Below autograd: shapes need no graph, and a custom op with a Meta kernel but no autograd
    // kernel runs there on 1.13 too (2.x falls through autograd for such ops).
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    info.op().callBoxed(&s);
  } catch (const c10::NotImplementedError& e) {
    TORCH_CHECK(false, "hyper_parallel::dispatch: cannot infer the output shapes of ", info.describe(),
                ": the op has no meta kernel and its sharding rule gives no output shapes (",
                e.what_without_backtrace(), ")");
  } catch (const c10::Error& e) {
    // The op itself refuses these inputs (a dtype or shape mismatch): the same error a plain
    // tensor would get, with the placements.
    TORCH_CHECK(false, "hyper_parallel::dispatch: ", info.describe(), ": ", e.what_without_backtrace());
  }
  return s;
}

// What each input must become, and its plan. Written arguments keep their layout: an in-place
// op cannot change placements.
void resolve_inputs(const OpInfo& info, const OpSharding& s, Decision& d) {
  const auto& inputs = info.inputs();
  HP_CHECK_T(c10::ValueError, s.input_placements.empty() || s.input_placements.size() == inputs.size(), "hyper_parallel::dispatch: ",
             info.describe(), ": ", rule_name(info), " gave ", s.input_placements.size(), " input placements for ", inputs.size(),
             " DTensor inputs (one per input, or none to keep them)");
  const auto mesh_ndim = static_cast<size_t>(info.mesh_ndim());
  for (size_t k = 0; k < s.input_placements.size(); ++k)
    HP_CHECK_T(c10::ValueError, s.input_placements[k].size() == mesh_ndim, "hyper_parallel::dispatch: ", info.describe(), ": ",
               rule_name(info), " gave input ", k, " the placements ", short_string(s.input_placements[k]), " on a mesh of ", mesh_ndim,
               " dimensions");
  const auto& args = info.schema().arguments();
  d.input_placements.resize(inputs.size());
  d.redistribute.resize(inputs.size());
  d.plans.resize(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const DTensorSpec& in = *inputs[k].spec;
    d.input_placements[k] = s.input_placements.empty() ? in.placements : normalize_placements(s.input_placements[k], in.ndim());
    d.redistribute[k] = d.input_placements[k] != in.placements;
    if (d.redistribute[k]) d.plans[k] = plan_redistribute(in.mesh.shape(), in.placements, d.input_placements[k], in.ndim());
    const auto* alias = args[inputs[k].arg].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    d.written_inputs.push_back(k);
    HP_CHECK_T(c10::ValueError, !d.redistribute[k], "hyper_parallel::dispatch: ", info.describe(),
               " would have to change the placements of its in-place/out argument '", args[inputs[k].arg].name(),
               "' from ", short_string(in.placements), " to ", short_string(d.input_placements[k]), "; use the out-of-place op");
  }
}

// Which argument each return writes (in-place/out) or views, from the schema's alias sets.
void alias_returns(const OpInfo& info, Decision& d) {
  const auto& rets = info.schema().returns();
  const auto& args = info.schema().arguments();
  // squeeze_, t_, ...: the written return gets new sizes and strides.
  d.inplace_view = info.op().hasTag(at::Tag::inplace_view);
  // Its schema declares no alias, but it is a view of its input on plain tensors too.
  d.unsafe_view = info.op().operator_name().name == "aten::_unsafe_view";
  d.written_return_arg.assign(rets.size(), -1);
  d.view_return_arg.assign(rets.size(), -1);
  d.view_base_moved.assign(rets.size(), false);
  for (size_t r = 0; r < rets.size(); ++r) {
    const auto* ra = rets[r].alias_info();
    // A list of views (split, unbind, chunk) carries its alias set on the element type.
    if (ra != nullptr && ra->beforeSets().empty() && !ra->containedTypes().empty()) ra = &ra->containedTypes()[0];
    if (ra == nullptr) continue;
    for (size_t a = 0; a < args.size(); ++a) {
      const auto* aa = args[a].alias_info();
      if (aa == nullptr || aa->beforeSets() != ra->beforeSets()) continue;
      if (ra->isWrite() && aa->isWrite()) d.written_return_arg[r] = static_cast<int64_t>(a);
      else if (!ra->isWrite()) d.view_return_arg[r] = static_cast<int64_t>(a);
      break;
    }
    if (d.view_return_arg[r] < 0) continue;
    const int64_t k = info.input_index(static_cast<size_t>(d.view_return_arg[r]));
    d.view_base_moved[r] = k >= 0 && d.redistribute[static_cast<size_t>(k)];
  }
}

bool is_tensor_return(const c10::Argument& ret) {
  const auto& type = ret.type();
  return type->kind() == c10::TypeKind::TensorType || type->isSubtypeOf(*c10::ListType::ofTensors());
}

// The specs and local shapes of the returns a decision makes (not the written ones): from the
// meta run, or from the rule's shapes for ops without a meta kernel (their dtype is learnt from
// the first local result).
void output_specs(const OpInfo& info, const OpSharding& s, Decision& d) {
  const auto& rets = info.schema().returns();
  d.outputs.resize(rets.size());
  d.local_shapes.resize(rets.size());
  d.local_strides.resize(rets.size());
  // An in-place view op's written return gets a new geometry: the meta run says which.
  bool need_meta = false;
  for (size_t r = 0; r < rets.size(); ++r)
    need_meta = need_meta || ((d.written_return_arg[r] < 0 || d.inplace_view) && is_tensor_return(rets[r]) && s.output_shapes.empty());
  const std::vector<c10::IValue> meta = need_meta ? run_on_meta(info) : std::vector<c10::IValue>{};
  const DeviceMesh& mesh = OpInfoAccess::mesh(info);
  auto add = [&](size_t r, const Placements& pl, std::vector<int64_t> shape, at::ScalarType dtype,
                 std::vector<int64_t> stride = {}, int64_t offset = 0) {
    auto spec = std::make_shared<const DTensorSpec>(mesh, pl, std::move(shape), dtype, std::move(stride), offset);
    d.local_shapes[r].push_back(spec->local_shape_and_offset(info.coordinate()).first);
    d.local_strides[r].push_back(d.view_return_arg[r] >= 0 ? LocalLayout{}
                                                           : local_layout_like(spec->shape, spec->stride, d.local_shapes[r].back()));
    d.outputs[r].push_back(std::move(spec));
  };
  auto add_meta = [&](size_t r, const Placements& pl, const at::Tensor& t) {
    add(r, pl, t.sizes().vec(), t.scalar_type(), t.strides().vec(), t.storage_offset());
  };
  size_t shape_index = 0;
  for (size_t r = 0; r < rets.size(); ++r) {
    if (d.written_return_arg[r] >= 0 && !(d.inplace_view && need_meta)) { ++shape_index; continue; }
    if (!is_tensor_return(rets[r])) continue;
    HP_CHECK_T(c10::ValueError, r < s.output_placements.size(), "hyper_parallel::dispatch: ", info.describe(), ": ", rule_name(info),
               " gave no output placements for return ", r);
    const Placements& pl = s.output_placements[r];
    HP_CHECK_T(c10::ValueError, pl.size() == static_cast<size_t>(info.mesh_ndim()), "hyper_parallel::dispatch: ", info.describe(),
               ": ", rule_name(info), " gave return ", r, " the placements ", short_string(pl), " on a mesh of ", info.mesh_ndim(),
               " dimensions");
    const bool is_list = rets[r].type()->kind() != c10::TypeKind::TensorType;
    if (need_meta) {
      const c10::IValue& m = meta[r];
      if (is_list) {
        for (const at::Tensor& t : m.toTensorList()) add_meta(r, pl, t);
      } else if (m.isTensor() && m.toTensor().defined()) {
        add_meta(r, pl, m.toTensor());
      } else {
        d.outputs[r].push_back(nullptr);
        d.local_shapes[r].emplace_back();
        d.local_strides[r].emplace_back();
      }
    } else {
      HP_CHECK_T(c10::ValueError, !is_list && shape_index < s.output_shapes.size(), "hyper_parallel::dispatch: ", info.describe(),
                 ": ", rule_name(info), " gave no output shape for return ", r);
      HP_CHECK_T(c10::ValueError, s.output_strides.empty() || shape_index < s.output_strides.size(), "hyper_parallel::dispatch: ",
                 info.describe(), ": ", rule_name(info), " gave no output strides for return ", r);
      add(r, pl, s.output_shapes[shape_index], at::ScalarType::Undefined,
          s.output_strides.empty() ? std::vector<int64_t>{} : s.output_strides[shape_index]);
    }
    ++shape_index;
  }
}

std::shared_ptr<const Decision> decide(const OpInfo& info) {
  OpSharding s = apply_sharding_rule(info);
  auto d = std::make_shared<Decision>();
  resolve_inputs(info, s, *d);
  alias_returns(info, *d);
  output_specs(info, s, *d);
  d->implicit_communication = std::move(s.implicit_communication);
  d->any_redistribute = !d->implicit_communication.empty();
  d->communicates = !d->implicit_communication.empty();
  for (size_t k = 0; k < d->redistribute.size(); ++k) {
    d->any_redistribute = d->any_redistribute || d->redistribute[k];
    for (const RedistributeStep& st : d->plans[k])
      d->communicates = d->communicates || (st.kind != RedistributeStep::Kind::Chunk && st.kind != RedistributeStep::Kind::ToPartial);
  }
  d->adjust_args = std::move(s.adjust_args);
  d->kernel = std::move(s.kernel);
  d->unboxed = !d->any_redistribute && !d->adjust_args && !d->kernel && s.handler.empty() && d->written_inputs.empty() &&
               !d->inplace_view;
  for (size_t r = 0; r < d->outputs.size(); ++r)
    d->unboxed = d->unboxed && d->written_return_arg[r] < 0 && d->outputs[r].size() == 1;
  if (!s.handler.empty()) {
    d->handler = find_handler(s.handler);
    HP_CHECK_T(c10::ValueError, d->handler != nullptr, "hyper_parallel::dispatch: ", info.describe(), ": ", rule_name(info), " names the op handler '",
                s.handler, "', which is not registered (hyper_parallel::register_op_handler)");
    d->handler_params = std::move(s.handler_params);
  }
  return d;
}

// One thread's decisions, looked up by a view of a key (no copy, no allocation): open addressing
// over a power-of-two table, each slot holding its key's hash, the key and the decision.
class DecisionCache {
 public:
  const std::shared_ptr<const Decision>* find(c10::ArrayRef<int64_t> key) const {
    if (slots_.empty()) return nullptr;
    const uint64_t h = hash_key(key);
    for (size_t i = h & mask(); slots_[i].decision != nullptr; i = (i + 1) & mask())
      if (slots_[i].hash == h && c10::ArrayRef<int64_t>(slots_[i].key).equals(key)) return &slots_[i].decision;
    return nullptr;
  }
  void insert(c10::ArrayRef<int64_t> key, std::shared_ptr<const Decision> d) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    place({hash_key(key), key.vec(), std::move(d)});
    ++size_;
  }
  size_t size() const { return size_; }
  void clear() {
    slots_.clear();
    size_ = 0;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    std::vector<int64_t> key;
    std::shared_ptr<const Decision> decision;  // null: an empty slot
  };
  size_t mask() const { return slots_.size() - 1; }
  void place(Slot s) {
    size_t i = s.hash & mask();
    while (slots_[i].decision != nullptr) i = (i + 1) & mask();
    slots_[i] = std::move(s);
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.clear();
    slots_.resize(old.empty() ? 64 : 2 * old.size());
    for (Slot& s : old)
      if (s.decision != nullptr) place(std::move(s));
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

struct Cache {
  uint64_t version = 0;
  DecisionCache map;
};
// Per thread: no lock on the hot path (autograd may run backward on other threads).
thread_local Cache t_cache;

// This thread's cache, emptied when a rule was registered or the cache cleared since its last use.
Cache& current_cache() {
  Cache& c = t_cache;
  const uint64_t version = g_registry_version.load(std::memory_order_relaxed);
  if (C10_UNLIKELY(c.version != version)) {
    c.map.clear();
    c.version = version;
  }
  return c;
}

}  // namespace

const std::shared_ptr<const Decision>* find_decision(c10::ArrayRef<int64_t> key) { return current_cache().map.find(key); }

std::shared_ptr<const Decision> propagate(OpInfo& info, c10::ArrayRef<int64_t> key) {
  Cache& cache = current_cache();
  if (const auto* d = cache.map.find(key)) return *d;
  if (find_rule(info.op()) == nullptr && info.op().hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))
    return nullptr;
  auto d = decide(info);
  // Shapes that keep changing (variable sequence lengths) would grow the cache without bound.
  // decide() may have run ops (the meta run) that reached this thread's cache: look it up again.
  Cache& after = current_cache();
  if (after.map.size() >= 65536) after.map.clear();
  if (after.map.find(key) == nullptr) after.map.insert(key, d);
  return d;
}

}  // namespace hyper_parallel
