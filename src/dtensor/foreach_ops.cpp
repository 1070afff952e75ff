// torch's _foreach_* ops on lists holding DTensors. A pointwise op whose every element is laid out
// alike (the same mesh, placements and global shape for all its tensors, nothing Partial) is
// torch's own foreach kernel, called once on the local pieces: a pointwise op on equal pieces is
// the op on the whole. Any other call runs its per-tensor op on each element, dispatched as usual
// (so each element follows that op's sharding rule), after every element has been decided: a
// refused list is refused before any element changes.
#include "foreach_ops.h"

#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "copy_view_watch.h"
#include "dtensor_impl.h"
#include "op_args.h"

namespace hyper_parallel {
namespace {

constexpr char kForeachPrefix[] = "aten::_foreach_";
constexpr size_t kForeachPrefixLen = sizeof(kForeachPrefix) - 1;

// Where one argument of the per-tensor call comes from.
struct Source {
  enum Kind { Element, Whole, ScalarOfTensor, Default } kind = Default;
  size_t arg = 0;      // the foreach argument (Element, Whole, ScalarOfTensor)
  c10::IValue value;   // Default
};

// The per-tensor op of a foreach op, matched by schema: _foreach_pow.Scalar(Tensor[] self,
// Scalar exponent) is pow.Tensor_Scalar, not pow.Scalar(Scalar self, Tensor exponent), and the
// one-value-per-element `scalars` tensor of addcmul_.Tensor is a Scalar per element.
// `copy_back`: no in-place op exists (maximum_): the out-of-place one runs and its result is copied
// into the first list's element. `norm`: _foreach_norm is linalg_vector_norm.
struct PerTensorOp {
  c10::OperatorHandle op;
  std::vector<Source> sources;
  bool copy_back = false;
  bool norm = false;
};

// The element type of foreach argument `a` in the per-tensor call.
c10::TypePtr element_type(const c10::Argument& a) {
  const c10::TypePtr& t = a.type();
  if (auto list = t->cast<c10::ListType>()) return list->getElementType();
  if (a.name() == "scalars" && t->kind() == c10::TypeKind::TensorType) return c10::NumberType::get();
  return t;
}

// Every overload name of every aten op, by op name (built once).
const std::map<std::string, std::vector<std::string>>& overloads() {
  static const auto all = [] {
    std::map<std::string, std::vector<std::string>> m;
    for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) m[n.name].push_back(n.overload_name);
    for (auto& [name, list] : m) std::sort(list.begin(), list.end());
    return m;
  }();
  return all;
}

// How `candidate` takes the element call of `foreach`, or nullopt when it cannot: each positional
// foreach argument's element type fits the candidate's argument at that position, each keyword
// argument finds the candidate's argument of its name, and every other argument has a default.
c10::optional<std::vector<Source>> match(const c10::FunctionSchema& foreach, const c10::FunctionSchema& candidate) {
  const auto& fa = foreach.arguments();
  const auto& ca = candidate.arguments();
  size_t positional = 0;
  while (positional < fa.size() && !fa[positional].kwarg_only()) ++positional;
  if (ca.size() < positional) return c10::nullopt;
  std::vector<Source> sources(ca.size());
  std::vector<bool> used(fa.size(), false);
  auto source_of = [&](size_t k) {
    Source s;
    s.arg = k;
    const c10::TypePtr& t = fa[k].type();
    s.kind = t->cast<c10::ListType>() ? Source::Element : element_type(fa[k]) != t ? Source::ScalarOfTensor : Source::Whole;
    used[k] = true;
    return s;
  };
  for (size_t j = 0; j < ca.size(); ++j) {
    size_t k = j;
    if (j >= positional) {
      k = fa.size();
      for (size_t i = positional; i < fa.size(); ++i)
        if (fa[i].name() == ca[j].name()) k = i;
    }
    if (k < fa.size()) {
      if (!element_type(fa[k])->isSubtypeOf(*ca[j].type())) return c10::nullopt;
      sources[j] = source_of(k);
    } else {
      if (!ca[j].default_value().has_value()) return c10::nullopt;
      sources[j].value = *ca[j].default_value();
    }
  }
  for (size_t k = 0; k < fa.size(); ++k)
    if (!used[k]) return c10::nullopt;
  return sources;
}

// The overload of `base` that takes the element call with the fewest arguments of its own.
c10::optional<PerTensorOp> find_per_tensor(const c10::FunctionSchema& foreach, const std::string& base) {
  const auto it = overloads().find(base);
  if (it == overloads().end()) return c10::nullopt;
  c10::optional<PerTensorOp> best;
  for (const std::string& ov : it->second) {
    auto op = c10::Dispatcher::singleton().findSchema({base, ov});
    if (!op) continue;
    auto sources = match(foreach, op->schema());
    if (sources && (!best || sources->size() < best->sources.size())) best = PerTensorOp{*op, std::move(*sources)};
  }
  return best;
}

PerTensorOp make_per_tensor_op(const c10::OperatorHandle& foreach) {
  const std::string& name = foreach.operator_name().name;
  const std::string base = "aten::" + name.substr(kForeachPrefixLen);
  if (base == "aten::norm") {
    auto op = c10::Dispatcher::singleton().findSchema({"aten::linalg_vector_norm", ""});
    TORCH_INTERNAL_ASSERT(op.has_value(), "aten::linalg_vector_norm is not registered");
    PerTensorOp p{*op, {}};
    p.norm = true;
    return p;
  }
  if (auto p = find_per_tensor(foreach.schema(), base)) return *p;
  if (!base.empty() && base.back() == '_') {
    // The out-of-place op, its result copied into self: it takes self as an input.
    if (auto p = find_per_tensor(foreach.schema(), base.substr(0, base.size() - 1))) {
      p->copy_back = true;
      return *p;
    }
  }
  HP_CHECK_T(c10::NotImplementedError, false, "hyper_parallel::foreach: ", foreach.operator_name(),
             " on DTensors runs as its per-tensor op, but no overload of ", base, " takes one element of its arguments");
  return {foreach, {}};
}

const PerTensorOp& per_tensor_op(const c10::OperatorHandle& foreach) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, std::unique_ptr<const PerTensorOp>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{foreach.operator_name().name, foreach.operator_name().overload_name}];
  if (!slot) slot = std::make_unique<const PerTensorOp>(make_per_tensor_op(foreach));
  return *slot;
}

// The number of elements of the call's lists, which must agree.
int64_t list_length(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs) {
  int64_t n = -1;
  for (size_t a = 0; a < nargs; ++a) {
    int64_t len = -1;
    if (args[a].isTensorList()) len = static_cast<int64_t>(args[a].toTensorList().size());
    else if (args[a].isList()) len = static_cast<int64_t>(args[a].toListRef().size());
    if (len < 0) continue;
    HP_CHECK_T(c10::ValueError, n < 0 || len == n, "hyper_parallel::foreach: ", op.operator_name(), ": argument '",
               op.schema().arguments()[a].name(), "' holds ", len, " elements, the first list ", n);
    n = len;
  }
  return std::max<int64_t>(n, 0);
}

// ---- one kernel over the local pieces

// The foreach ops that are elementwise (the result's element i of tensor k reads only element i of
// the operands' tensor k), by their name without "_foreach_" and a trailing "_". Not norm, max,
// powsum (reductions) or mm.
bool is_pointwise(const c10::OperatorHandle& op) {
  static const std::set<std::string> pointwise{
      "abs", "acos", "add", "addcdiv", "addcmul", "asin", "atan", "ceil", "clamp_max", "clamp_min", "copy", "cos",
      "cosh", "div", "erf", "erfc", "exp", "expm1", "floor", "frac", "lerp", "lgamma", "log", "log10", "log1p",
      "log2", "maximum", "minimum", "mul", "neg", "pow", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin",
      "sinh", "sqrt", "sub", "tan", "tanh", "trunc", "zero"};
  std::string base = op.operator_name().name.substr(kForeachPrefixLen);
  if (!base.empty() && base.back() == '_') base.pop_back();
  return pointwise.count(base) > 0;
}

bool contiguous_whole(const DTensorSpec& s) {
  if (s.storage_offset != 0) return false;
  if (s.stride.empty()) return true;
  int64_t expect = 1;
  for (int64_t d = s.ndim() - 1; d >= 0; --d) {
    if (s.shape[static_cast<size_t>(d)] != 1 && s.stride[static_cast<size_t>(d)] != expect) return false;
    expect *= s.shape[static_cast<size_t>(d)];
  }
  return true;
}

// Per element, the spec its DTensors share (null for an element of plain tensors); nullopt when
// some element is not laid out alike, or a tensor the op reads whole is a DTensor that is not
// replicated: that call takes the per-tensor path.
c10::optional<std::vector<const DTensorImpl*>> uniform_layout(const c10::OperatorHandle& op, const c10::IValue* args,
                                                               size_t nargs, int64_t n) {
  if (!is_pointwise(op)) return c10::nullopt;
  const bool returns = !op.schema().returns().empty();
  const DeviceMesh* mesh = nullptr;
  for (size_t a = 0; a < nargs; ++a) {
    if (!args[a].isTensor()) continue;
    const DTensorImpl* d = dtensor_impl(args[a].toTensor());
    if (d == nullptr) continue;
    if (!d->spec().is_replicated() || d->is_copy_view()) return c10::nullopt;
    mesh = &d->spec().mesh;
  }
  std::vector<const DTensorImpl*> first(static_cast<size_t>(n), nullptr);
  std::vector<int8_t> plain(static_cast<size_t>(n), 0);  // 1: an element of plain tensors
  for (size_t a = 0; a < nargs; ++a) {
    if (!args[a].isTensorList()) continue;
    const auto list = args[a].toTensorList();
    for (size_t i = 0; i < list.size(); ++i) {
      const at::Tensor t = list.get(i);
      const DTensorImpl* d = dtensor_impl(t);
      if (d == nullptr) {
        if (first[i] != nullptr || mesh != nullptr) return c10::nullopt;
        plain[i] = 1;
        continue;
      }
      if (plain[i] || d->is_copy_view() || d->spec().has_partial()) return c10::nullopt;
      if (first[i] == nullptr) {
        if (mesh != nullptr && !(d->spec().mesh == *mesh)) return c10::nullopt;
        if (returns && !contiguous_whole(d->spec())) return c10::nullopt;
        first[i] = d;
        continue;
      }
      const DTensorSpec& s = first[i]->spec();
      if (&d->spec() != &s && (d->spec().placements != s.placements || d->spec().shape != s.shape || !(d->spec().mesh == s.mesh)))
        return c10::nullopt;
    }
  }
  return first;
}

void run_on_local_pieces(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t nargs,
                         const std::vector<const DTensorImpl*>& layout) {
  const size_t base = stack->size() - nargs;
  std::vector<at::Tensor> written;
  const int64_t written_arg = op.operator_name().name.back() == '_' ? 0 : -1;  // _foreach_add_, _foreach_copy_
  for (size_t a = 0; a < nargs; ++a) {
    c10::IValue& v = (*stack)[base + a];
    if (v.isTensor()) {
      if (const DTensorImpl* d = dtensor_impl(v.toTensor())) v = d->local();
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      c10::List<at::Tensor> local;
      local.reserve(list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        const at::Tensor t = list.get(i);
        const DTensorImpl* d = dtensor_impl(t);
        local.push_back(d ? d->local() : t);
        if (d != nullptr && static_cast<int64_t>(a) == written_arg) written.push_back(d->local());
      }
      v = std::move(local);
    }
  }
  {
    // Below autograd and past the DTensor key: torch's own kernel on plain tensors.
    const c10::impl::ExcludeDispatchKeyGuard local_only(c10::autograd_dispatch_keyset_with_ADInplaceOrView |
                                                        c10::DispatchKeySet(kDTensorKey));
    op.callBoxed(stack);
  }
  for (const at::Tensor& t : written) note_dtensor_write(t);
  if (op.schema().returns().empty()) return;
  c10::IValue& ret = stack->back();
  auto results = ret.toTensorList();
  for (size_t i = 0; i < results.size(); ++i) {
    const DTensorImpl* d = layout[i];
    if (d == nullptr) continue;
    const at::Tensor r = results.get(i);
    const DTensorSpec& s = d->spec();
    // The input's spec when it describes the result (same dtype, contiguous), else a copy.
    std::shared_ptr<const DTensorSpec> spec = d->spec_ptr();
    if (s.dtype != r.scalar_type() || !s.stride.empty()) spec = std::make_shared<DTensorSpec>(s.mesh, s.placements, s.shape, r.scalar_type());
    results.set(i, make_dtensor(r.is_contiguous() ? r : r.contiguous(), std::move(spec)));
  }
}

// ---- each element as its per-tensor op

torch::jit::Stack element_call(const PerTensorOp& per, const c10::IValue* args, size_t nargs, size_t i) {
  auto element = [&](size_t a) -> c10::IValue {
    if (args[a].isTensorList()) return args[a].toTensorList().get(i);
    if (args[a].isList()) return args[a].toListRef()[i];
    return args[a];
  };
  torch::jit::Stack call;
  if (per.norm) {
    // linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None)
    return {element(0), nargs > 1 ? args[1] : c10::IValue(2), c10::IValue(), c10::IValue(false), nargs > 2 ? args[2] : c10::IValue()};
  }
  call.reserve(per.sources.size());
  for (const Source& s : per.sources) {
    switch (s.kind) {
      case Source::Element: call.push_back(element(s.arg)); break;
      case Source::Whole: call.push_back(args[s.arg]); break;
      case Source::ScalarOfTensor: {
        const at::Tensor& t = args[s.arg].toTensor();
        HP_CHECK_T(c10::ValueError, !is_dtensor(t), "hyper_parallel::foreach: the tensor of one value per element ('scalars') "
                   "must be a plain tensor, got a DTensor");
        call.push_back(t.reshape({-1})[static_cast<int64_t>(i)].item());
        break;
      }
      case Source::Default: call.push_back(s.value); break;
    }
  }
  return call;
}

}  // namespace

bool is_foreach_op(const c10::OperatorHandle& op) {
  return op.operator_name().name.compare(0, kForeachPrefixLen, kForeachPrefix) == 0;
}

void run_foreach(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // An out= overload would write its results into lists laid out by the caller, which neither
  // path checks: the functional or in-place op says what the result is.
  HP_CHECK_T(c10::NotImplementedError, op.operator_name().overload_name.find("out") == std::string::npos,
             "hyper_parallel::foreach: ", op.operator_name(), " (an out= overload) is not supported on DTensors; call ",
             op.operator_name().name, " without out=, or its in-place form");
  const size_t nargs = op.schema().arguments().size();
  const c10::IValue* args = stack->data() + (stack->size() - nargs);
  const int64_t n = list_length(op, args, nargs);
  if (auto layout = uniform_layout(op, args, nargs, n)) return run_on_local_pieces(op, stack, nargs, *layout);

  std::vector<c10::IValue> original(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end());
  torch::jit::drop(*stack, nargs);
  const PerTensorOp& per = per_tensor_op(op);
  // Every element is decided before any runs: a refusal leaves every element as it was.
  std::vector<torch::jit::Stack> calls;
  calls.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    calls.push_back(element_call(per, original.data(), nargs, static_cast<size_t>(i)));
    check_dtensor_call(per.op, calls.back());
  }
  const bool returns_list = !op.schema().returns().empty();
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < n; ++i) {
    torch::jit::Stack& call = calls[static_cast<size_t>(i)];
    per.op.callBoxed(call);
    if (per.copy_back) {
      at::Tensor self = original[0].toTensorList().get(static_cast<size_t>(i));
      self.copy_(call.back().toTensor());
    } else if (returns_list) {
      outs.push_back(call.back().toTensor());
    }
  }
  if (returns_list) torch::jit::push(*stack, c10::IValue(c10::List<at::Tensor>(outs)));
}

}  // namespace hyper_parallel
