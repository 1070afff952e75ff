#pragma once
// The sharding-rule interface: how an aten op runs on DTensors. Every rule receives the op and
// the specs of its tensor inputs and answers with the placements the inputs must have, the
// placements (and, when the op has no meta kernel, the global shapes) of its outputs, and
// optionally a local kernel that replaces the op on the local shards. The library registers
// rules for the ops listed in dtensor/ops/*; users may register rules for their own ops.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <hyper_parallel/dtensor/dtensor_spec.h>

namespace hyper_parallel {

/// What a rule sees of one call: the op, its arguments, the specs of its tensor inputs, and the
/// mesh's shape and this rank's coordinate in it. A rule is a pure function of these (it has no
/// process group, so it cannot communicate; a kernel that must, receives the mesh when it runs).
class OpInfo {
 public:
  /// A tensor input: a DTensor, or a plain tensor taken as Replicate inside an
  /// ImplicitReplicationGuard. 0-dim plain tensors are scalars and are not inputs.
  struct TensorInput {
    size_t arg;         ///< argument index in the schema
    int64_t elem;       ///< index in a Tensor[] argument, -1 for a Tensor argument
    const DTensorSpec* spec;
  };

  /// The call of `op` on `nargs` arguments at `args`, on `mesh`; the dispatcher fills its inputs.
  OpInfo(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs, const DeviceMesh& mesh);
  /// A call described by data alone, to test a rule in one process: `inputs` name the arguments
  /// that are DTensors (their specs' mesh is not read), on a mesh of `mesh_shape` at `coordinate`.
  /// e.g. `OpInfo info(op, args.data(), args.size(), {{0, -1, &x}}, {2}, {1});`
  OpInfo(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs, std::vector<TensorInput> inputs,
         std::vector<int64_t> mesh_shape, std::vector<int64_t> coordinate);

  const c10::OperatorHandle& op() const { return op_; }
  const c10::FunctionSchema& schema() const { return op_.schema(); }
  /// "aten::add.Tensor".
  std::string name() const;
  const c10::IValue& arg(size_t i) const { return args_[i]; }
  const c10::IValue* args() const { return args_; }
  size_t num_args() const { return nargs_; }
  c10::ArrayRef<TensorInput> inputs() const { return inputs_; }
  /// Number of ranks along each mesh dimension.
  const std::vector<int64_t>& mesh_shape() const;
  int64_t mesh_ndim() const { return static_cast<int64_t>(mesh_shape().size()); }
  /// This rank's index along each mesh dimension.
  const std::vector<int64_t>& coordinate() const;
  /// The spec of argument `arg` (element `elem` of a list), or nullptr when it is not an input.
  const DTensorSpec* spec(size_t arg, int64_t elem = -1) const;
  /// The spec of argument `arg`, which the rule needs to be a DTensor: a c10::ValueError naming
  /// the op and the argument when it is not (e.g. a 0-dim plain tensor taken as a scalar).
  const DTensorSpec& input_spec(size_t arg, int64_t elem = -1) const;
  /// The name of input `k` (its argument's name, with the element of a list), e.g. "tensors[1]".
  std::string input_name(size_t k) const;
  /// Index into inputs() of argument `arg`, or -1.
  int64_t input_index(size_t arg, int64_t elem = -1) const;
  /// Argument written by the op (self of an in-place op, out of an out= op), or -1.
  int64_t written_arg() const;
  /// The op and its inputs in the compact form of every DTensor error and trace, e.g.
  /// "aten::mm(self: f32[8,16] S(0), mat2: f32[16,4] R) on mesh(tp=2)".
  std::string describe() const;

 private:
  friend struct OpInfoAccess;  // the dispatcher's side (src/dtensor/sharding_propagation.cpp)
  const c10::OperatorHandle& op_;
  const c10::IValue* args_;
  size_t nargs_;
  c10::SmallVector<TensorInput, 4> inputs_;  // no allocation for the usual one to four
  const DeviceMesh* mesh_;  // null for a call described by data alone
  // Read from the mesh when a rule first asks (a cached decision needs neither).
  mutable bool geometry_known_;
  mutable std::vector<int64_t> mesh_shape_, coordinate_;
  mutable int64_t written_arg_ = -2;  // -2: not looked up yet (only rules need it, on a cache miss)
  std::vector<std::unique_ptr<DTensorSpec>> owned_;
};

/// A rule's answer. Decisions are cached by (op, input specs, shapes, integer arguments): a
/// rule must depend on nothing else, and adjust_args/kernel must read floating-point values
/// from the arguments they receive.
struct OpSharding {
  /// Placements each input must have before the local op runs (one per OpInfo::inputs() entry;
  /// empty keeps them all as they are).
  std::vector<Placements> input_placements;
  /// Placements of each schema return (a Tensor[] return applies it to every element).
  /// Non-tensor returns are ignored.
  std::vector<Placements> output_placements;
  /// Global shapes of the tensor returns, for ops without a meta kernel; empty: the op runs once
  /// on meta tensors of the global shapes to find them.
  std::vector<std::vector<int64_t>> output_shapes;
  /// Global strides of those returns, as the plain op would give them (one per output_shapes
  /// entry; empty: contiguous). Ignored without output_shapes: the meta run gives the strides.
  std::vector<std::vector<int64_t>> output_strides;
  /// Rewrites the local arguments (e.g. global sizes into local sizes) before the local op.
  std::function<void(torch::jit::Stack& local_args)> adjust_args;
  /// Replaces the local op with local computation: receives the stack with the local arguments,
  /// leaves the returns. It cannot communicate (it has no mesh).
  std::function<void(const c10::OperatorHandle& op, torch::jit::Stack* stack)> kernel;
  /// Replaces the local op by the op handler registered under this name, called with
  /// `handler_params`: the only code that communicates (e.g. the all-reduces of a softmax over a
  /// sharded dim). Named, so a decision stays plain data.
  std::string handler;
  std::vector<int64_t> handler_params;
  /// What the handler communicates that the caller did not ask for, in the compact form (e.g.
  /// "self P(sum) -> R: all_reduce over tp, in place"): the ExplicitRedistribution guard refuses
  /// it like an input redistribution. Empty for a handler whose communication is the op itself.
  std::string implicit_communication;
};

using ShardingRule = std::function<OpSharding(const OpInfo&)>;

/// A kernel that communicates, registered by name: it replaces the local op on the stack of
/// local arguments, and receives the mesh and the integer parameters its rule chose.
using OpHandler = std::function<void(const c10::OperatorHandle& op, torch::jit::Stack* stack, const DeviceMesh& mesh,
                                     const std::vector<int64_t>& params)>;

/// Registers `handler` under `name` (e.g. "hp::softmax_over_shards"); a later registration
/// replaces an earlier one. A rule naming a handler nobody registered fails when it is decided.
void register_op_handler(const std::string& name, OpHandler handler);

/// The answer of the rule registered for `info.op()` (the one the dispatcher would use), e.g. to
/// test a rule in one process with an OpInfo described by data. c10::NotImplementedError when
/// the op has no rule.
OpSharding apply_sharding_rule(const OpInfo& info);

/// Registers `rule` for `op_name`: "aten::add.Tensor" for one overload, "aten::add" for every
/// overload that has no rule of its own. A later registration replaces an earlier one. A name
/// the dispatcher does not know (a typo, an op of another libtorch version, a custom op not yet
/// registered with TORCH_LIBRARY) is refused with c10::ValueError: a rule nothing can reach
/// would fail silently.
void register_sharding_rule(const std::string& op_name, ShardingRule rule);

/// Static registration, e.g. `static RegisterShardingRule r("aten::relu", pointwise_rule);`.
struct RegisterShardingRule {
  RegisterShardingRule(const std::string& op_name, ShardingRule rule) {
    register_sharding_rule(op_name, std::move(rule));
  }
};

/// Drops every cached decision (after registering a rule at run time).
void clear_sharding_cache();

}  // namespace hyper_parallel
