#pragma once
// Communication only where it is asked for by name (PyTorch's ExplicitRedistributionContext).
#include <c10/util/Optional.h>

#include <hyper_parallel/runtime/call_context.h>

namespace hyper_parallel {

/// RAII: while alive, an op on DTensors whose inputs would have to be redistributed through a
/// collective first (a Shard gathered, a Partial reduced because of the op, ...) raises on every rank (`raise`, the
/// default) or warns once per op, module and input specs (`warn`) before any communication.
/// Asked for by name, and so allowed: DTensor::redistribute, full_tensor, from_local / to_local and
/// their backward, the ParallelStyles' hooks (which redistribute by name), FSDP's collectives, and
/// ops whose own kernel communicates (the vocabulary-parallel softmax and loss under
/// loss_parallel). A Replicate input cut to its local chunk moves no data and is allowed (the trace
/// lists it). The error names the op with every input's spec, the transition each input
/// needed (collective, mesh dim, bytes), the module (FQN) and the phase. Process-wide, so
/// autograd's backward threads see it; guards nest.
/// e.g. `{ hp::ExplicitRedistribution explicit_only; loss = model(x); loss.backward(); }`
class ExplicitRedistribution {
 public:
  enum class Mode { raise, warn };
  explicit ExplicitRedistribution(Mode mode = Mode::raise);
  ~ExplicitRedistribution();
  ExplicitRedistribution(const ExplicitRedistribution&) = delete;
  ExplicitRedistribution& operator=(const ExplicitRedistribution&) = delete;

  /// The innermost live guard's mode, or nullopt.
  static c10::optional<Mode> current();

 private:
  int previous_;
  call_context::Tracking tracking_;  // the error names the module
};

}  // namespace hyper_parallel
