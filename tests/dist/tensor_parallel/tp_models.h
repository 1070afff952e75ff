#pragma once
// Small models and helpers for the test plan's cases (A*, B*, C*, D*).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <hyper_parallel/hyper_parallel.h>

#include "../../common/test_util.h"

namespace tp_test {
namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

/// Collects the warnings raised in its scope.
struct WarningCapture : c10::WarningHandler {
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  bool contains(const std::string& s) const {
    for (const auto& m : messages)
      if (m.find(s) != std::string::npos) return true;
    return false;
  }
  std::vector<std::string> messages;
};

class MlpImpl : public hnn::ModuleBase<MlpImpl> {
 public:
  MlpImpl(int64_t dim, int64_t hidden) {
    linear1 = register_module("linear1", hnn::Linear(dim, hidden));
    linear2 = register_module("linear2", hnn::Linear(hidden, dim));
  }
  at::Tensor forward(const at::Tensor& x) { return linear2(at::relu(linear1(x))); }
  hnn::Linear linear1{nullptr}, linear2{nullptr};
};
HP_MODULE(Mlp);

/// Two positional inputs (for PrepareModuleInput arity and None slots) and a named one.
class TwoInputsImpl : public hnn::ModuleBase<TwoInputsImpl> {
 public:
  at::Tensor forward(const at::Tensor& a, const at::Tensor& b, const hnn::Kwargs& kw) {
    at::Tensor out = a * 2 + b;
    for (const auto& [k, v] : kw)
      if (k == "bias") out = out + v.toTensor();
    return out;
  }
};
HP_MODULE(TwoInputs);

/// Two outputs (for PrepareModuleOutput with a None slot).
class TwoOutputsImpl : public hnn::ModuleBase<TwoOutputsImpl> {
 public:
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) { return {x * 3, x - 1}; }
};
HP_MODULE(TwoOutputs);

/// Same weights on every rank and in the reference: seeded construction.
template <class Holder, class... Args>
Holder seeded(uint64_t seed, Args&&... args) {
  hp_test::manual_seed(seed);
  return Holder(std::forward<Args>(args)...);
}

inline int64_t rank() { return hp::get_rank(); }
inline int64_t tp_size() { return hp::get_world_size(); }

/// Slice `t` as torch.chunk piece `rank` of `parts` along `dim`.
inline at::Tensor piece(const at::Tensor& t, int64_t dim, int64_t r = rank(), int64_t parts = tp_size()) {
  return t.chunk(parts, dim)[r].contiguous();
}

/// A DTensor parameter's whole value (or a plain one's).
inline at::Tensor full(const at::Tensor& t) {
  return hp::is_dtensor(t) ? hp::DTensor(t).full_tensor() : t;
}

using hp_test::close;
using hp_test::random;

}  // namespace tp_test
