#pragma once
// A thread's op interceptor (internal): while one is installed, every aten op of this thread,
// on plain tensors and DTensors alike, passes through it below autograd (kDTensorKey is added to
// the thread's included dispatch keys, so the DTensor fallback sees every op). Selective
// activation checkpointing keeps the outputs of chosen ops in the forward and hands them back,
// instead of computing them again, in the recompute.
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>

namespace hyper_parallel {

class OpInterceptor {
 public:
  virtual ~OpInterceptor() = default;
  /// Called for each op with its arguments on `stack`; `compute` runs the op as if no
  /// interceptor were installed (replacing the arguments by the returns). Ops the op itself
  /// calls are not intercepted. Leaves the returns on the stack, computed or not.
  virtual void on_op(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::function<void()>& compute) = 0;
};

/// RAII: installs `interceptor` on this thread (nullptr: none) until the scope ends.
class OpInterceptorScope {
 public:
  explicit OpInterceptorScope(OpInterceptor* interceptor);
  ~OpInterceptorScope();
  OpInterceptorScope(const OpInterceptorScope&) = delete;
  OpInterceptorScope& operator=(const OpInterceptorScope&) = delete;

 private:
  OpInterceptor* previous_;
  bool was_included_;
};

}  // namespace hyper_parallel
