#pragma once
// Reports on one op's decision (internal): the ExplicitRedistribution guard's check and the
// sharding trace's line (runtime/comm_debug_mode.h).
#include "sharding_propagation.h"

namespace hyper_parallel {

/// Throws (or warns) under an ExplicitRedistribution guard; nothing otherwise. Called for a
/// decision that communicates (Decision::communicates: a local chunk of a Replicate input moves
/// nothing). Cheap when no guard is alive.
void check_explicit_redistribution(const OpInfo& info, const Decision& d);

/// Records the op's trace line (CommDebugMode(trace) or HP_LOG=dtensor): called after the op ran,
/// while its arguments are alive, so the output dtypes a rule left to the local result are known.
void trace_op(const OpInfo& info, const Decision& d);

/// Records an explicitly requested redistribution (DTensor::redistribute) in the trace.
void trace_redistribute(const DTensorSpec& src, const Placements& dst);

}  // namespace hyper_parallel
