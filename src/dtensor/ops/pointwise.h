#pragma once
// The pointwise strategy, shared with the families that reuse it (copy_, factories).
#include "rule_utils.h"

namespace hyper_parallel {
namespace ops {

/// How an op treats Partial(sum) inputs.
enum class Linearity {
  None,            ///< reduce Partial inputs first
  Unary,           ///< f(sum x_r) = sum f(x_r) for its single input
  Additive,        ///< all operands Partial stay Partial
  Multiplicative,  ///< exactly one Partial operand, the others replicated
  Numerator,       ///< the first operand Partial, the others replicated
  MaskedFill,      ///< self Partial, the mask replicated: the fill value is given once (off
                   ///< coordinate 0 it becomes 0)
};

/// Floating or complex: the dtypes whose casts commute (up to rounding) with a Partial's sum.
inline bool is_float_like(at::ScalarType t) { return at::isFloatingType(t) || at::isComplexType(t); }

/// Output sharding follows the first input that shards a dimension it holds (broadcast dims are
/// replicated); in-place/out= ops follow the written tensor; Partial survives per `linearity`.
/// The output shape is the broadcast of the inputs'.
OpSharding pointwise_sharding(const OpInfo& info, Linearity linearity);

}  // namespace ops
}  // namespace hyper_parallel
