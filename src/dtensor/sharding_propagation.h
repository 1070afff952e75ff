#pragma once
// Sharding propagation (internal): the rule registry, the decision key of a call, and the
// per-thread cache of decisions. A decision is plain data about one (op, input specs, shapes,
// integer arguments) combination: what each input must become (with its redistribution plan),
// the output specs and local shapes, and which returns alias which arguments.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <hyper_parallel/dtensor/redistribute_plan.h>
#include <hyper_parallel/dtensor/sharding_rule.h>

#include "local_layout.h"

namespace hyper_parallel {

struct Decision {
  std::vector<Placements> input_placements;  // one per input, resolved
  std::vector<bool> redistribute;            // per input: placements differ
  bool any_redistribute = false;             // some input is redistributed, or implicit_communication
  bool communicates = false;                 // one of those steps is a collective (not a local chunk)
  std::string implicit_communication;        // the rule's (OpSharding::implicit_communication)
  // Per input: the redistribution steps (empty when unchanged); planned once per decision.
  std::vector<std::vector<RedistributeStep>> plans;
  // Per return slot: one spec (Tensor) or one per element (Tensor[]); null for non-tensors.
  // Mutable: a return's dtype is learnt from the first local result when no meta run gave it.
  mutable std::vector<std::vector<std::shared_ptr<const DTensorSpec>>> outputs;
  std::vector<std::vector<std::vector<int64_t>>> local_shapes;
  // Per return slot and element: the strides the local result of a new (not a view, not
  // written) return must have to be laid out as its global strides say; empty: any layout.
  std::vector<std::vector<LocalLayout>> local_strides;
  std::vector<int64_t> written_return_arg;  // per return slot: the argument it aliases, or -1
  std::vector<int64_t> view_return_arg;     // per return slot: the argument it is a view of, or -1
  std::vector<bool> view_base_moved;        // per return slot: that argument is redistributed first
  std::vector<size_t> written_inputs;       // indices into OpInfo::inputs() the op writes
  bool unsafe_view = false;                 // aten::_unsafe_view: a view its schema does not declare
  bool inplace_view = false;                // squeeze_, t_, ...: the written return gets a new geometry
  std::function<void(torch::jit::Stack&)> adjust_args;
  std::function<void(const c10::OperatorHandle&, torch::jit::Stack*)> kernel;
  const OpHandler* handler = nullptr;  // registered handlers live as long as the process
  std::vector<int64_t> handler_params;
  // The decision is the local op on the inputs' local data, with new or view returns and nothing
  // else (no redistribution, rewritten arguments, kernel, handler or written argument): the
  // unboxed kernels may run it without boxing the call (unboxed_kernels.cpp).
  bool unboxed = false;
};

// ---------------------------------------------------------------------------------------------
// The decision key. collect_inputs writes it from the boxed arguments; the unboxed kernels write
// the same key for the same call from their typed arguments, so both find one cached decision.

enum DecisionKeyTag : int64_t {
  kKeyNone = 1, kKeyDT, kKeyPlain, kKeyList, kKeyInt, kKeyBool, kKeyDouble, kKeyScalar, kKeyString, kKeyOther,
  kKeyIntList, kKeyReplicatedPlain, kKeyBoolList, kKeyDoubleList, kKeyLossParallel
};

/// Gives `s` its name (see spec_key_name) and returns it.
int64_t name_spec(const DTensorSpec& s);

/// A call's key, on the stack for the usual few arguments.
using DecisionKey = c10::SmallVector<int64_t, 24>;

/// The name of spec `s` in a decision key, given on first use: specs with equal contents share a
/// name, and a name is never reused. A DTensor input is kKeyDT followed by its spec's name.
inline int64_t spec_key_name(const DTensorSpec& s) {
  const int64_t id = s.key_id.value.load(std::memory_order_relaxed);
  return C10_LIKELY(id != 0) ? id : name_spec(s);
}

/// This thread's cached decision for `key`, or nullptr. The pointer stays valid until
/// propagate() next runs on this thread (which may empty the cache); copy the decision to keep it.
const std::shared_ptr<const Decision>* find_decision(c10::ArrayRef<int64_t> key);

/// The dispatcher's side of OpInfo: its mesh and its inputs.
struct OpInfoAccess {
  static const DeviceMesh& mesh(const OpInfo& info);
  static void add_input(OpInfo& info, size_t arg, int64_t elem, const DTensorSpec* spec);
  /// An input whose spec the OpInfo keeps (a plain tensor taken as Replicate).
  static void add_input(OpInfo& info, size_t arg, int64_t elem, std::unique_ptr<DTensorSpec> spec);
};

/// The mesh of the first DTensor among `nargs` arguments, or nullptr.
const DeviceMesh* find_mesh(const c10::IValue* args, size_t nargs);

/// Bumped by every registration and by clear_sharding_cache(): the per-thread decision caches
/// compare it on each call (a relaxed load on the hot path).
extern std::atomic<uint64_t> g_registry_version;

/// The op handler registered under `name`, or nullptr.
const OpHandler* find_handler(const std::string& name);

/// The rule registered for `op` (its overload, else its name), or nullptr.
const ShardingRule* find_rule(const c10::OperatorHandle& op);

/// "the sharding rule registered for 'aten::add'": the name the rule of `info.op()` was registered
/// under, for the errors a rule's wrong answer gets.
std::string rule_name(const OpInfo& info);

/// Fills `info`'s inputs (DTensors, and plain tensors taken as Replicate under implicit
/// replication) and `key`, the key of its decision. Throws for a plain tensor mixed with
/// DTensors outside implicit replication, and for DTensors on different meshes.
void collect_inputs(OpInfo& info, DecisionKey& key);

/// The decision for `info`, whose key collect_inputs returned: from this thread's cache, else
/// from the op's rule (checked against the schema and the meta run). nullptr for a composite op
/// with no rule of its own: the caller decomposes it (it reaches DTensors undecomposed only when
/// autograd is off for the call, as under c10::InferenceMode).
std::shared_ptr<const Decision> propagate(OpInfo& info, c10::ArrayRef<int64_t> key);

}  // namespace hyper_parallel
