#pragma once
// The reductions of collectives and Partial placements (no torch here: placement.h needs only this).

namespace hyper_parallel {

enum class ReduceOp { SUM, AVG, MAX, MIN };
/// "sum", "avg", "max", "min" (as PyTorch prints Partial placements).
const char* reduce_op_name(ReduceOp op);

}  // namespace hyper_parallel
