#pragma once
// The unboxed kernels at kDTensorKey (internal): the ops a transformer step calls most, run
// without boxing when their decision is cached and is the local op alone (unboxed_kernels.cpp).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdint>

namespace hyper_parallel {

/// The boxed fallback every op on DTensors reaches (dispatch.cpp). The unboxed kernels hand it
/// each call they do not run themselves.
void dtensor_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

/// Whether an op interceptor is installed on this thread (dispatch.cpp).
bool op_interceptor_installed();

/// Registers the unboxed kernels into `aten_impl`, a library of aten kernels at kDTensorKey.
void register_unboxed_kernels(torch::Library& aten_impl);

/// How many calls the unboxed kernels ran themselves on this thread (tests read it to know that
/// the path they compare was taken).
uint64_t unboxed_runs_on_this_thread();

}  // namespace hyper_parallel
