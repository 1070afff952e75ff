#include "op_execution.h"

#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>

#include "dtensor_impl.h"
#include "local_layout.h"
#include "op_args.h"
#include "op_report.h"
#include "redistribute.h"

namespace hyper_parallel {
namespace {

// The call's global arguments, moved off the stack while the local op runs (no allocation for
// the usual few).
using OriginalArgs = c10::SmallVector<c10::IValue, 8>;

// A write into a view whose local data is a copy would be lost: refuse it (on every rank: the
// flag comes from placements, which all ranks share). Other writes are noted for the copy-views
// of the written storage (copy_view_watch.h).
void check_and_note_writes(const OpInfo& info, const Decision& d) {
  check_writes(info, d);
  for (size_t k : d.written_inputs) {
    const auto& in = info.inputs()[k];
    if (DTensorImpl* impl = dtensor_impl(tensor_arg(info.arg(in.arg), in.elem))) note_dtensor_write(impl->local());
  }
}

at::Tensor local_of(const at::Tensor& t, const Decision& d, const OpInfo& info, size_t arg, int64_t elem) {
  const int64_t k = info.input_index(arg, elem);
  if (k < 0) return t;  // a 0-dim plain tensor, or undefined
  DTensorImpl* impl = dtensor_impl(t);
  const at::Tensor& local = impl ? impl->local() : t;
  return redistribute_local(local, *info.inputs()[static_cast<size_t>(k)].spec, d.plans[static_cast<size_t>(k)]);
}

// Whether local result `t` shares data with the local of a DTensor argument of the call.
bool aliases_an_input(const at::Tensor& t, const OpInfo& info, const OriginalArgs& original) {
  for (const auto& in : info.inputs()) {
    const at::Tensor a = tensor_arg(original[in.arg], in.elem);
    if (DTensorImpl* impl = dtensor_impl(a))
      if (impl->local().defined() && t.is_alias_of(impl->local())) return true;
  }
  return false;
}

// A new (not a view, not written) return as the plain op gives it: sharing no data with the
// inputs, and laid out as its global strides say, so later view decisions hold on every rank.
// Both hold already for nearly every local op; a copy otherwise. `_unsafe_view` is exempt: its
// schema declares no alias, but it is a view (of the fresh copy reshape() made) on plain tensors
// too.
at::Tensor as_new_result(at::Tensor t, const LocalLayout& layout, const OpInfo& info,
                         const OriginalArgs& original, bool exempt) {
  if (!t.defined() || exempt) return t;
  if (has_layout(t, layout) && !aliases_an_input(t, info, original)) return t;
  return copy_with_layout(t, layout.strides);
}

// Wraps local result `t` with `spec`, whose dtype is corrected from `t` (once per decision).
at::Tensor wrap(const at::Tensor& t, std::shared_ptr<const DTensorSpec>& spec, const std::vector<int64_t>& local_shape,
                const OpInfo& info) {
  if (!t.defined()) return t;
  HP_CHECK_T(c10::ValueError, t.sizes() == c10::IntArrayRef(local_shape), "hyper_parallel::dispatch: ", info.describe(),
             " produced a local result of shape ", t.sizes(), " where ", short_string(spec->placements), " of the global shape ",
             c10::IntArrayRef(spec->shape), " needs ", c10::IntArrayRef(local_shape), " (", rule_name(info), " is wrong)");
  if (spec->dtype != t.scalar_type()) {
    auto s = std::make_shared<DTensorSpec>(*spec);
    s->dtype = t.scalar_type();
    spec = std::move(s);
  }
  return make_dtensor(t, spec);
}

// Wraps the returns at the top of `stack`; `original` are the call's (global) arguments.
void wrap_returns(const OpInfo& info, const Decision& d, const OriginalArgs& original, torch::jit::Stack* stack) {
  const size_t nret = info.schema().returns().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= nret);
  const size_t rbase = stack->size() - nret;
  for (size_t r = 0; r < nret; ++r) {
    c10::IValue& v = (*stack)[rbase + r];
    if (d.written_return_arg[r] >= 0) {
      // The very same tensor (autograd's in-place wrappers return their own self anyway); an
      // in-place view op gave it new sizes and strides, and its local data is the local result.
      at::Tensor local = v.isTensor() ? v.toTensor() : at::Tensor();
      v = original[static_cast<size_t>(d.written_return_arg[r])];
      if (d.inplace_view && local.defined() && !d.outputs[r].empty() && d.outputs[r][0]) {
        DTensorImpl* self = dtensor_impl(v.toTensor());
        HP_CHECK_T(c10::ValueError, local.sizes() == c10::IntArrayRef(d.local_shapes[r][0]), "hyper_parallel::dispatch: ",
                   info.describe(), " produced a local result of shape ", local.sizes(), " where ",
                   c10::IntArrayRef(d.local_shapes[r][0]), " was expected (", rule_name(info), " is wrong)");
        self->set_local_and_spec(local, d.outputs[r][0]);
      }
      continue;
    }
    // A view's local result must be a view of its base's local data; otherwise it is a copy.
    DTensorImpl* base = nullptr;
    if (d.view_return_arg[r] >= 0) {
      const auto& a = original[static_cast<size_t>(d.view_return_arg[r])];
      if (a.isTensor()) base = dtensor_impl(a.toTensor());
    }
    // Under c10::InferenceMode a view of a normal tensor must be a normal tensor (autograd's view
    // tracking gives it the base's version counter), as libtorch's own views are.
    const bool normal_view = base != nullptr && c10::InferenceMode::is_enabled() && !base->is_inference();
    const bool is_view = d.view_return_arg[r] >= 0;
    std::shared_ptr<const CopySource> source;
    auto wrap_output = [&](const at::Tensor& result, std::shared_ptr<const DTensorSpec>& spec, const std::vector<int64_t>& shape,
                           const LocalLayout& strides) {
      c10::optional<c10::InferenceMode> normal;
      if (normal_view) normal.emplace(false);
      const at::Tensor local = is_view ? result : as_new_result(result, strides, info, original, d.unsafe_view);
      at::Tensor w = wrap(local, spec, shape, info);
      if (base != nullptr && w.defined() && (d.view_base_moved[r] || base->is_copy_view() || !local.is_alias_of(base->local()))) {
        // A copy of a copy-view follows the same source; one source serves a list of views.
        if (!source) source = base->is_copy_view() ? base->copy_source() : std::make_shared<const CopySource>(base->local(), info.name());
        static_cast<DTensorImpl*>(w.unsafeGetTensorImpl())->set_copy_source(source);
      }
      return w;
    };
    if (v.isTensor()) {
      if (!d.outputs[r].empty() && d.outputs[r][0])
        v = wrap_output(v.toTensor(), d.outputs[r][0], d.local_shapes[r][0], d.local_strides[r][0]);
    } else if (v.isTensorList()) {
      auto l = v.toTensorList();
      HP_CHECK_T(c10::ValueError, l.size() == d.outputs[r].size(), "hyper_parallel::dispatch: ", info.describe(), " returned ",
                 l.size(), " local tensors where the global op returns ", d.outputs[r].size(), " (", rule_name(info), " is wrong)");
      for (size_t j = 0; j < l.size(); ++j)
        l.set(j, wrap_output(l.get(j), d.outputs[r][j], d.local_shapes[r][j], d.local_strides[r][j]));
      v = l;
    }
  }
}

}  // namespace

void check_writes(const OpInfo& info, const Decision& d) {
  for (size_t k : d.written_inputs) {
    const auto& in = info.inputs()[k];
    DTensorImpl* impl = dtensor_impl(tensor_arg(info.arg(in.arg), in.elem));
    HP_CHECK_T(c10::NotImplementedError, impl == nullptr || !impl->is_copy_view(), "hyper_parallel::dispatch: ",
               info.describe(), " writes in place into a view of a DTensor whose local data is a copy "
               "(making the view needed communication, e.g. a narrow/select/split along a sharded dim): "
               "the write would not reach the viewed DTensor. In-place operations that require "
               "placement changes are not supported; write into the base with an out-of-place op and "
               "copy_, or redistribute the base first");
  }
}

void execute(const OpInfo& info, const Decision& d, torch::jit::Stack* stack) {
  check_and_note_writes(info, d);
  const size_t nargs = info.num_args();
  const size_t base = stack->size() - nargs;
  // The global arguments move off the stack and stay alive until the returns are wrapped (the
  // input specs in `info` point into them); from here on `info.arg()` is not read.
  OriginalArgs original(std::make_move_iterator(stack->begin() + static_cast<std::ptrdiff_t>(base)),
                        std::make_move_iterator(stack->end()));
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  {
    // Below autograd (as at::AutoDispatchBelowADInplaceOrView) and past the DTensor key, in one guard.
    const c10::impl::ExcludeDispatchKeyGuard local_only(c10::autograd_dispatch_keyset_with_ADInplaceOrView |
                                                        c10::DispatchKeySet(kDTensorKey));
    auto to_local = [&](size_t arg, int64_t elem, const at::Tensor& t) { return local_of(t, d, info, arg, elem); };
    if (d.adjust_args) {
      torch::jit::Stack local_args = map_tensor_args(original.data(), nargs, to_local);
      d.adjust_args(local_args);
      for (auto& v : local_args) stack->push_back(std::move(v));
    } else {
      map_tensor_args_onto(*stack, original.data(), nargs, to_local);
    }
    if (d.handler) (*d.handler)(info.op(), stack, OpInfoAccess::mesh(info), d.handler_params);
    else if (d.kernel) d.kernel(info.op(), stack);
    else info.op().callBoxed(stack);
  }
  wrap_returns(info, d, original, stack);
  if (C10_UNLIKELY(CommDebugMode::op_tracing())) trace_op(info, d);
}

}  // namespace hyper_parallel
