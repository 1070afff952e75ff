#include "foreach_ops.h"

#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace hyper_parallel {
namespace {

constexpr char kForeachPrefix[] = "aten::_foreach_";
constexpr size_t kForeachPrefixLen = sizeof(kForeachPrefix) - 1;

c10::optional<c10::OperatorHandle> find_op(const std::string& name, const std::string& overload) {
  return c10::Dispatcher::singleton().findSchema({name, overload});
}

// The per-tensor op of a foreach op: _foreach_mul_.Scalar -> mul_.Scalar, .List -> .Tensor,
// .ScalarList -> .Scalar; an op with no such overload (addcmul_, lerp_ of a list, clamp_min_)
// under its default overload. `copy_back`: no in-place op exists (maximum_): the out-of-place
// one runs and its result is copied into the first list's element.
struct PerTensorOp {
  c10::OperatorHandle op;
  bool copy_back = false;
  bool norm = false;  // _foreach_norm -> linalg_vector_norm(t, ord, None, False, dtype=dtype)
};

PerTensorOp per_tensor_op(const c10::OperatorHandle& foreach) {
  const std::string& name = foreach.operator_name().name;
  const std::string& overload = foreach.operator_name().overload_name;
  const std::string base = "aten::" + name.substr(kForeachPrefixLen);
  if (base == "aten::norm") {
    auto op = find_op("aten::linalg_vector_norm", "");
    TORCH_INTERNAL_ASSERT(op.has_value(), "aten::linalg_vector_norm is not registered");
    return {*op, false, true};
  }
  const std::string mapped = overload == "List" ? "Tensor" : overload == "ScalarList" ? "Scalar" : overload;
  for (const std::string& ov : {mapped, std::string()})
    if (auto op = find_op(base, ov)) return {*op};
  if (!base.empty() && base.back() == '_') {
    const std::string out_of_place = base.substr(0, base.size() - 1);
    for (const std::string& ov : {mapped, std::string()})
      if (auto op = find_op(out_of_place, ov)) return {*op, true};
  }
  HP_CHECK_T(c10::NotImplementedError, false, "hyper_parallel::run_foreach_per_tensor: ", name, ".", overload,
             " on DTensors runs as its per-tensor op, but no ", base, " (overload '", mapped, "' or default) exists");
  return {foreach};
}

}  // namespace

bool is_foreach_op(const c10::OperatorHandle& op) {
  return op.operator_name().name.compare(0, kForeachPrefixLen, kForeachPrefix) == 0;
}

void run_foreach_per_tensor(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end());
  torch::jit::drop(*stack, nargs);
  const PerTensorOp per = per_tensor_op(op);
  const auto& base_args = per.op.schema().arguments();

  // Every list argument has one element per call.
  int64_t n = -1;
  for (size_t a = 0; a < nargs; ++a) {
    int64_t len = -1;
    if (args[a].isTensorList()) len = static_cast<int64_t>(args[a].toTensorList().size());
    else if (args[a].isList()) len = static_cast<int64_t>(args[a].toListRef().size());
    if (len < 0) continue;
    HP_CHECK_T(c10::ValueError, n < 0 || len == n, "hyper_parallel::run_foreach_per_tensor: ", op.operator_name(), ": argument '",
               schema.arguments()[a].name(), "' holds ", len, " elements, the first list ", n);
    n = len;
  }
  HP_CHECK_T(c10::ValueError, per.norm || base_args.size() >= nargs, "hyper_parallel::run_foreach_per_tensor: ", op.operator_name(),
             " has more arguments than ", per.op.operator_name(), " it runs as");

  const bool returns_list = !schema.returns().empty();
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < std::max<int64_t>(n, 0); ++i) {
    torch::jit::Stack call;
    auto element = [&](size_t a) -> c10::IValue {
      if (args[a].isTensorList()) return args[a].toTensorList().get(static_cast<size_t>(i));
      if (args[a].isList()) return args[a].toListRef()[static_cast<size_t>(i)];
      return args[a];
    };
    if (per.norm) {
      // linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None)
      call = {element(0), nargs > 1 ? args[1] : c10::IValue(2), c10::IValue(), c10::IValue(false),
              nargs > 2 ? args[2] : c10::IValue()};
    } else {
      for (size_t a = 0; a < nargs; ++a) call.push_back(element(a));
      for (size_t a = nargs; a < base_args.size(); ++a) {
        HP_CHECK_T(c10::NotImplementedError, base_args[a].default_value().has_value(), "hyper_parallel::run_foreach_per_tensor: ",
                   per.op.operator_name(), " needs argument '", base_args[a].name(), "', which ", op.operator_name(), " does not give");
        call.push_back(*base_args[a].default_value());
      }
    }
    per.op.callBoxed(call);
    if (per.copy_back) {
      at::Tensor self = args[0].toTensorList().get(static_cast<size_t>(i));
      self.copy_(call.back().toTensor());
    } else if (returns_list) {
      outs.push_back(call.back().toTensor());
    }
  }
  if (returns_list) torch::jit::push(*stack, c10::IValue(c10::List<at::Tensor>(outs)));
}

}  // namespace hyper_parallel
