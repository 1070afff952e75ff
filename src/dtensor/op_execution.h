#pragma once
// Executing a sharding decision (internal): the local arguments (inputs redistributed as
// decided), the local op or the rule's kernel, and the returns wrapped as DTensors with their
// local shapes checked against the decision.
#include <ATen/core/stack.h>

#include "sharding_propagation.h"

namespace hyper_parallel {

/// Refuses (c10::NotImplementedError, on every rank) an in-place write the decision makes into a
/// view whose local data is a copy: the write would not reach the viewed DTensor.
void check_writes(const OpInfo& info, const Decision& d);

/// Replaces the call's arguments at the top of `stack` by its returns, computed on the local
/// data. Refuses what check_writes refuses.
void execute(const OpInfo& info, const Decision& d, torch::jit::Stack* stack);

}  // namespace hyper_parallel
