#pragma once
// The arguments of a boxed call, walked once here for everyone (internal): a tensor argument may
// be a Tensor, an element of a Tensor[], or an element of a generic list (Tensor?[] of index_put).
// The mesh lookup, the decision key, the meta run and the local arguments all walk them the same
// way, so the walk is written once.
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <cstddef>
#include <cstdint>

namespace hyper_parallel {

enum class ArgKind { Tensor, TensorList, GenericList, Other };

/// How an argument holds tensors. Int/double/bool lists are Other: they hold none.
inline ArgKind arg_kind(const c10::IValue& v) {
  if (v.isTensor()) return ArgKind::Tensor;
  if (v.isTensorList()) return ArgKind::TensorList;
  if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) return ArgKind::GenericList;
  return ArgKind::Other;
}

/// The tensor an argument holds: the argument itself (`elem` -1), or element `elem` of its
/// Tensor[] or generic list (Tensor?[] of index_put).
inline at::Tensor tensor_arg(const c10::IValue& v, int64_t elem) {
  if (elem < 0) return v.toTensor();
  if (v.isTensorList()) return v.toTensorList().get(static_cast<size_t>(elem));
  return v.toListRef()[static_cast<size_t>(elem)].toTensor();
}

/// Calls, in argument order, `v.tensor(arg, elem, t)` for every tensor (elem -1 outside a list;
/// undefined tensors included), `v.list(arg, size)` before a list's elements and
/// `v.value(ivalue)` for every other argument and non-tensor list element. `tensor` may return
/// false to stop the walk.
template <class Visitor>
void visit_args(const c10::IValue* args, size_t nargs, Visitor& v) {
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& a = args[i];
    switch (arg_kind(a)) {
      case ArgKind::Tensor:
        if (!v.tensor(i, -1, a.toTensor())) return;
        break;
      case ArgKind::TensorList: {
        const auto l = a.toTensorList();
        v.list(i, l.size());
        for (size_t j = 0; j < l.size(); ++j)
          if (!v.tensor(i, static_cast<int64_t>(j), l.get(j))) return;
        break;
      }
      case ArgKind::GenericList: {
        const auto& l = a.toListRef();
        v.list(i, l.size());
        for (size_t j = 0; j < l.size(); ++j) {
          if (!l[j].isTensor()) v.value(l[j]);
          else if (!v.tensor(i, static_cast<int64_t>(j), l[j].toTensor())) return;
        }
        break;
      }
      case ArgKind::Other:
        v.value(a);
        break;
    }
  }
}

/// Appends to `out` a copy of the arguments with every tensor replaced by `fn(arg, elem, t)`.
template <class Fn>
void map_tensor_args_onto(torch::jit::Stack& out, const c10::IValue* args, size_t nargs, Fn&& fn) {
  out.reserve(out.size() + nargs);
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& a = args[i];
    switch (arg_kind(a)) {
      case ArgKind::Tensor:
        out.emplace_back(fn(i, int64_t{-1}, a.toTensor()));
        break;
      case ArgKind::TensorList: {
        const auto in = a.toTensorList();
        c10::List<at::Tensor> l;
        l.reserve(in.size());
        for (size_t j = 0; j < in.size(); ++j) l.push_back(fn(i, static_cast<int64_t>(j), in.get(j)));
        out.emplace_back(std::move(l));
        break;
      }
      case ArgKind::GenericList: {
        const auto in = a.toList();
        c10::impl::GenericList l(in.elementType());
        l.reserve(in.size());
        for (size_t j = 0; j < in.size(); ++j) {
          c10::IValue e = in.get(j);
          l.push_back(e.isTensor() ? c10::IValue(fn(i, static_cast<int64_t>(j), e.toTensor())) : e);
        }
        out.emplace_back(std::move(l));
        break;
      }
      case ArgKind::Other:
        out.push_back(a);
        break;
    }
  }
}

/// A copy of the arguments with every tensor replaced by `fn(arg, elem, t)`.
template <class Fn>
torch::jit::Stack map_tensor_args(const c10::IValue* args, size_t nargs, Fn&& fn) {
  torch::jit::Stack out;
  map_tensor_args_onto(out, args, nargs, std::forward<Fn>(fn));
  return out;
}

}  // namespace hyper_parallel
