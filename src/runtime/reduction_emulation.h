#pragma once
// The reductions of the collectives' front (internal): what a transport lacks (booleans, 16-bit
// sums, averages, NaN-keeping max/min, reduce_scatter) emulated the same way for every transport.
#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>

#include <functional>

#include <hyper_parallel/runtime/reduce_op.h>

#include "transport/transport.h"

namespace hyper_parallel {

// Tensors handed to the backend are written on its own threads, outside the caller's
// c10::InferenceMode: they must be normal tensors, not inference tensors (also those made when
// a Work completes; only the copy into an in-place target runs in the caller's mode).
struct NormalTensors {
  c10::InferenceMode guard{false};
};

// Whether transport `tr` reduces `dtype` with `op` exactly as the collectives define it, with
// nothing of reduce_on's emulations (an all_reduce, not a scatter).
bool reduces_natively(const TransportCapabilities& caps, at::ScalarType dtype, ReduceOp op);

// A reduction on transport `tr`: of `in` in place-like (all_reduce; rows == 1) or of the rows of
// `in` ([g, m]; reduce_scatter: the result is the reduction of row `rank`). `in` is contiguous,
// on the transport's device. Emulates what the transport lacks, the same for every transport:
// - bool: bytes, max for or, min for and;
// - 16-bit floats it cannot add, and averages of them it cannot take: in fp32, rounded once;
// - avg: a sum, then a division;
// - max/min whose NaN could vanish: a flag per element travels along and marks the NaN;
// - no reduce_scatter: an all_to_all, then a local reduction (torch's max/min keep a NaN).
// Returns what yields the result (flat, in `in`'s dtype) once the collective completed.
std::function<at::Tensor()> reduce_on(Transport& tr, const at::Tensor& in, ReduceOp op, bool scatter, int64_t g);

}  // namespace hyper_parallel
