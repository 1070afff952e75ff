// Unboxed kernels at kDTensorKey for the ops a transformer step calls most.
//
// The boxed fallback (dispatch.cpp) serves every op, at a price paid on every call: torch boxes
// the call into a stack of IValues, the fallback walks it generically into an OpInfo and a key,
// then calls the local op boxed again, which unboxes it. For a call whose decision is cached and
// is the local op alone (Decision::unboxed), a kernel here writes the same decision key from its
// typed arguments, runs the local op unboxed and wraps the returns with the decision's specs.
//
// Every other call is boxed and handed to the fallback, which decides and checks as for any op:
// a cache miss, a plain tensor among the arguments (a scalar tensor, implicit replication,
// autograd's own tensors in backward), a stale copy-view, a redistribution, an interceptor, op
// tracing, or a local result that does not match the decision (the ops here write nothing, so
// running one again there is harmless, and the fallback raises the error the mismatch deserves).
#include "unboxed_kernels.h"

#include <hyper_parallel/runtime/comm_debug_mode.h>

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>

#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <hyper_parallel/dtensor/loss_parallel.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/permute_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/select_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/t_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/transpose_ops.h>
#include <ATen/ops/unsqueeze_ops.h>
#include <ATen/ops/where_ops.h>

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "dtensor_impl.h"
#include "local_layout.h"
#include "sharding_propagation.h"

namespace hyper_parallel {
namespace {

thread_local uint64_t t_unboxed_runs = 0;

// Writes the decision key of one call from its typed arguments, as collect_inputs writes it from
// the boxed ones (key_value there): a tensor is its spec's name, an integer or a bool its value, a
// floating-point value its tag alone. Notes the DTensor arguments by index. `ok()` turns false for
// anything the fallback must see: a plain tensor, a stale copy-view, a symbolic size.
class CallKey {
 public:
  explicit CallKey(const c10::FunctionSchema& schema) {
    push(reinterpret_cast<int64_t>(&schema));
    if (LossParallelGuard::enabled()) push(kKeyLossParallel);  // as collect_inputs keys it
  }

  bool ok() const { return ok_; }
  c10::ArrayRef<int64_t> key() const { return {key_, size_}; }
  /// The DTensor that argument `arg` is, or nullptr.
  DTensorImpl* dtensor_at(size_t arg) const {
    for (const auto& [a, d] : dtensors_)
      if (a == arg) return d;
    return nullptr;
  }
  /// Whether `t` shares data with the local data of a DTensor argument.
  bool aliases_an_input(const at::Tensor& t) const {
    for (const auto& e : dtensors_)
      if (t.is_alias_of(e.second->local())) return true;
    return false;
  }

  void add(const at::Tensor& t) {
    tensor(t);
    ++arg_;
  }
  void add(const std::optional<at::Tensor>& t) {
    if (t.has_value()) tensor(*t);
    else push(kKeyNone);
    ++arg_;
  }
  void add(int64_t v) { integer(v); }
  void add(bool v) {
    push(kKeyBool);
    push(v);
    ++arg_;
  }
  void add(double) { tag(kKeyDouble); }
  void add(const c10::SymInt& v) {
    if (auto i = v.maybe_as_int()) integer(*i);
    else refuse();
  }
  void add(const c10::Scalar& s) {
    if (s.isSymbolic()) return refuse();
    if (s.isFloatingPoint()) return tag(kKeyDouble);
    if (s.isComplex()) {
      push(kKeyScalar);
      push(static_cast<int64_t>(c10::ScalarType::ComplexDouble));
      ++arg_;
      return;
    }
    if (s.isBoolean()) return add(s.toBool());
    integer(s.toLong());
  }
  void add(c10::IntArrayRef v) { int_list(v); }
  void add(c10::SymIntArrayRef v) {
    auto ints = c10::asIntArrayRefSlowOpt(v);
    if (ints.has_value()) int_list(*ints);
    else refuse();
  }
  void add(const c10::OptionalArrayRef<int64_t>& v) {
    if (v.has_value()) int_list(*v);
    else tag(kKeyNone);
  }
  template <size_t N>
  void add(const std::array<bool, N>& v) {
    push(kKeyBoolList);
    push(static_cast<int64_t>(N));
    for (bool b : v) push(b);
    ++arg_;
  }
  void add(c10::string_view s) {
    push(kKeyString);
    push(static_cast<int64_t>(std::hash<std::string>()(std::string(s.data(), s.size()))));
    ++arg_;
  }
  // The enums an IValue holds as integers.
  void add(const std::optional<c10::ScalarType>& v) { optional_int(v); }
  void add(const std::optional<c10::Layout>& v) { optional_int(v); }
  void add(const std::optional<c10::MemoryFormat>& v) { optional_int(v); }
  void add(const std::optional<bool>& v) {
    if (v.has_value()) add(*v);
    else tag(kKeyNone);
  }
  void add(const std::optional<c10::Device>& v) {
    if (!v.has_value()) return tag(kKeyNone);
    push(kKeyOther);
    push(static_cast<int64_t>(v->type()));
    ++arg_;
  }

 private:
  // A key longer than this (long integer lists) goes to the fallback.
  static constexpr size_t kMaxKey = 64;

  void push(int64_t v) {
    if (C10_LIKELY(size_ < kMaxKey)) key_[size_++] = v;
    else ok_ = false;
  }
  void tensor(const at::Tensor& t) {
    if (!t.defined()) return push(kKeyNone);
    DTensorImpl* d = dtensor_impl(t);
    if (d == nullptr || d->is_stale_copy_view()) return refuse();
    push(kKeyDT);
    push(spec_key_name(d->spec()));
    dtensors_.emplace_back(arg_, d);
  }
  void integer(int64_t v) {
    push(kKeyInt);
    push(v);
    ++arg_;
  }
  void tag(int64_t t) {
    push(t);
    ++arg_;
  }
  void int_list(c10::IntArrayRef v) {
    push(kKeyIntList);
    push(static_cast<int64_t>(v.size()));
    for (int64_t x : v) push(x);
    ++arg_;
  }
  template <class E>
  void optional_int(const std::optional<E>& v) {
    if (v.has_value()) integer(static_cast<int64_t>(*v));
    else tag(kKeyNone);
  }
  void refuse() {
    ok_ = false;
    ++arg_;
  }

  int64_t key_[kMaxKey];
  size_t size_ = 0;
  c10::SmallVector<std::pair<size_t, DTensorImpl*>, 4> dtensors_;
  size_t arg_ = 0;
  bool ok_ = true;
};

// The local data of a DTensor argument; other arguments as they are.
inline const at::Tensor& local_arg(const at::Tensor& t) {
  DTensorImpl* d = dtensor_impl(t);
  return d != nullptr ? d->local() : t;
}
inline std::optional<at::Tensor> local_arg(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return std::nullopt;
  return local_arg(*t);
}
template <class T>
const T& local_arg(const T& v) {
  return v;
}

// Wraps local result `t` of return `r` as the decision says, as wrap_returns (op_execution.cpp)
// does for a new or view return; false where the fallback must look (then `t` is dropped).
bool wrap_result(at::Tensor& t, const Decision& d, size_t r, const CallKey& call) {
  const auto& spec = d.outputs[r][0];
  if (spec == nullptr) return !t.defined();
  if (!t.defined()) return true;
  if (t.sizes() != c10::IntArrayRef(d.local_shapes[r][0]) || t.scalar_type() != spec->dtype) return false;
  if (d.view_return_arg[r] >= 0) {
    // A view of its base's local data, of a base that is not a copy-view itself; under
    // c10::InferenceMode a view of a normal tensor must be made normal (the fallback does that).
    DTensorImpl* base = call.dtensor_at(static_cast<size_t>(d.view_return_arg[r]));
    if (base == nullptr || base->is_copy_view() || !t.is_alias_of(base->local())) return false;
    if (c10::InferenceMode::is_enabled() && !base->is_inference()) return false;
  } else if (!d.unsafe_view) {
    const LocalLayout& layout = d.local_strides[r][0];
    if (!has_layout(t, layout) || call.aliases_an_input(t)) t = copy_with_layout(t, layout.strides);
  }
  t = make_dtensor(std::move(t), spec);
  return true;
}

bool wrap_results(at::Tensor& t, const Decision& d, const CallKey& call) { return wrap_result(t, d, 0, call); }
template <class... T>
bool wrap_results(std::tuple<T...>& results, const Decision& d, const CallKey& call) {
  return std::apply(
      [&](auto&... t) {
        size_t r = 0;
        return (wrap_result(t, d, r++, call) && ...);
      },
      results);
}

// The decision an unboxed kernel used last on this thread, kept with its key: a step calls an op
// again and again with the same specs, and comparing one key is cheaper than hashing it into the
// cache. A decision stays right for its key until a rule is registered or the cache cleared
// (g_registry_version); holding it keeps it alive if the cache is emptied meanwhile.
struct LastDecision {
  DecisionKey key;
  std::shared_ptr<const Decision> decision;
  uint64_t version = 0;
};

const Decision* cached_decision(c10::ArrayRef<int64_t> key, LastDecision& last) {
  const uint64_t version = g_registry_version.load(std::memory_order_relaxed);
  if (last.decision != nullptr && last.version == version && c10::ArrayRef<int64_t>(last.key).equals(key))
    return last.decision.get();
  const std::shared_ptr<const Decision>* d = find_decision(key);
  if (d == nullptr) return nullptr;
  last.key.assign(key.begin(), key.end());
  last.decision = *d;
  last.version = version;
  return d->get();
}

const c10::BoxedKernel& boxed_fallback() {
  static const c10::BoxedKernel k = c10::BoxedKernel::makeFromFunction<&dtensor_fallback>();
  return k;
}

template <class Op, class Sig = typename Op::schema>
struct UnboxedKernel;

template <class Op, class Ret, class... Args>
struct UnboxedKernel<Op, Ret(Args...)> {
  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle h = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return h;
  }

  static Ret call(c10::DispatchKeySet ks, Args... args) {
    if (C10_LIKELY(!op_interceptor_installed() && !CommDebugMode::op_tracing())) {
      CallKey call(handle().schema());
      (call.add(args), ...);
      thread_local LastDecision last;
      const Decision* d = call.ok() ? cached_decision(call.key(), last) : nullptr;
      if (d != nullptr && d->unboxed) {
        std::optional<Ret> results;
        {
          // Below autograd and past the DTensor key, as the fallback runs the local op.
          const c10::impl::ExcludeDispatchKeyGuard local_only(c10::autograd_dispatch_keyset_with_ADInplaceOrView |
                                                              c10::DispatchKeySet(kDTensorKey));
          results.emplace(Op::call(local_arg(args)...));
        }
        if (wrap_results(*results, *d, call)) {
          ++t_unboxed_runs;
          return std::move(*results);
        }
      }
    }
    return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(boxed_fallback(), handle(), ks, args...);
  }

  static void register_into(torch::Library& m) {
    std::string name = Op::name;
    if (*Op::overload_name != '\0') name += std::string(".") + Op::overload_name;
    m.impl(name.c_str(), torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(call)));
  }
};

template <class... Ops>
void register_all(torch::Library& m) {
  (UnboxedKernel<Ops>::register_into(m), ...);
}

}  // namespace

void register_unboxed_kernels(torch::Library& aten_impl) {
  namespace ops = at::_ops;
  register_all<
      // elementwise, forward and backward
      ops::add_Tensor, ops::sub_Tensor, ops::mul_Tensor, ops::div_Tensor, ops::mul_Scalar, ops::neg, ops::exp,
      ops::rsqrt, ops::tanh, ops::sigmoid, ops::relu, ops::silu, ops::silu_backward, ops::gelu, ops::gelu_backward,
      ops::pow_Tensor_Scalar, ops::where_self, ops::_to_copy, ops::clone,
      // products
      ops::mm, ops::addmm, ops::bmm, ops::baddbmm,
      // normalisation, softmax, reductions
      ops::native_layer_norm, ops::native_layer_norm_backward, ops::_softmax, ops::_softmax_backward_data,
      ops::mean_dim, ops::sum_dim_IntList,
      // views that keep their arguments (view and expand take global sizes, which their rules rewrite)
      ops::t, ops::transpose_int, ops::unsqueeze, ops::permute, ops::select_int>(aten_impl);
}

uint64_t unboxed_runs_on_this_thread() { return t_unboxed_runs; }

}  // namespace hyper_parallel
