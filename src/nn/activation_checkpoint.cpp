// Activation checkpointing (nn/activation_checkpoint.h): a forward wrapper whose autograd node
// keeps the module's inputs and parameters, and in backward runs the forward again with gradients
// (the generators rewound) and back-propagates through it.
#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/nn/layers.h>

#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/platform/platform.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/container/modulelist.h>

#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "../dtensor/op_interceptor.h"

namespace hyper_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using nn::ForwardFn;
using nn::Kwargs;

thread_local int t_recomputing = 0;

// What a checkpointed forward hands out besides its return value (checkpoint_side_output): the
// tensors in call order and, from the first forward, where each goes once it is in the graph.
struct SideOutputs {
  std::vector<at::Tensor> values;
  std::vector<std::function<void(const at::Tensor&)>> deliver;
};
thread_local SideOutputs* t_side_outputs = nullptr;

struct SideOutputScope {
  SideOutputs* previous;
  explicit SideOutputScope(SideOutputs* s) : previous(t_side_outputs) { t_side_outputs = s; }
  ~SideOutputScope() { t_side_outputs = previous; }
};

// Whether `op`'s outputs may be kept and handed back: listed, and returning new tensors.
bool keeps(const std::unordered_set<std::string>& save_ops, const c10::OperatorHandle& op) {
  if (save_ops.empty() || save_ops.count(op.operator_name().name) == 0) return false;
  const auto& schema = op.schema();
  if (schema.is_mutable()) return false;
  for (const auto& r : schema.returns())
    if (r.alias_info() != nullptr) return false;
  return true;
}

struct KeptOutputs {
  std::string op;
  std::vector<c10::IValue> values;
};

// The forward: runs every op, keeps the outputs of the listed ones.
struct Recorder : OpInterceptor {
  const std::unordered_set<std::string>& save_ops;
  std::deque<KeptOutputs>& kept;
  Recorder(const std::unordered_set<std::string>& s, std::deque<KeptOutputs>& k) : save_ops(s), kept(k) {}
  void on_op(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::function<void()>& compute) override {
    compute();
    if (!keeps(save_ops, op)) return;
    const size_t n = op.schema().returns().size();
    kept.push_back({op.operator_name().name, std::vector<c10::IValue>(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end())});
  }
};

// The recompute: the listed ops return what the forward kept (in the same order).
struct Replayer : OpInterceptor {
  const std::unordered_set<std::string>& save_ops;
  std::deque<KeptOutputs>& kept;
  Replayer(const std::unordered_set<std::string>& s, std::deque<KeptOutputs>& k) : save_ops(s), kept(k) {}
  void on_op(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::function<void()>& compute) override {
    if (!keeps(save_ops, op)) return compute();
    const std::string& name = op.operator_name().name;
    HP_CHECK_T(c10::ValueError, !kept.empty() && kept.front().op == name, "hyper_parallel::checkpoint_wrapper: the recomputed forward ",
               "called ", name, " where the forward called ", kept.empty() ? std::string("nothing more to keep") : kept.front().op,
               "; a checkpointed module must run the same ops each time (no control flow on values or state)");
    torch::jit::drop(*stack, op.schema().arguments().size());
    // A new tensor object on the kept data: autograd records this call's node on it.
    for (const auto& v : kept.front().values) stack->push_back(v.isTensor() ? c10::IValue(v.toTensor().detach()) : v);
    kept.pop_front();
  }
};

// One checkpointed call, shared by its autograd node.
struct CheckpointCall : torch::CustomClassHolder {
  ForwardFn forward;
  std::vector<c10::IValue> args;  // tensors replaced by None: they are saved by the node
  Kwargs kwargs;
  std::vector<size_t> tensor_args;    // positions in args, then kwargs (offset by args.size())
  std::vector<std::vector<std::pair<torch::nn::Module*, std::string>>> slots;  // per parameter, every slot holding it
  std::unordered_set<std::string> save_ops;
  std::deque<KeptOutputs> kept;
  bool preserve_rng = true;
  at::Tensor cpu_rng_state;
  bool output_is_tuple = false;
  size_t main_outputs = 0;  // the module's own outputs; the side outputs follow them
  std::vector<std::function<void(const at::Tensor&)>> deliver_side;

  static c10::IValue& arg_at(std::vector<c10::IValue>& a, Kwargs& kw, size_t k) { return k < a.size() ? a[k] : kw[k - a.size()].second; }
  c10::IValue& arg_at(size_t k) { return arg_at(args, kwargs, k); }

  /// The module's forward on the kept arguments with `tensors` (their first tensor_args.size())
  /// in the tensor slots, every op passing `interceptor` when ops are kept.
  c10::IValue run(at::TensorList tensors, OpInterceptor* interceptor) {
    std::vector<c10::IValue> a = args;
    Kwargs kw = kwargs;
    for (size_t i = 0; i < tensor_args.size(); ++i) arg_at(a, kw, tensor_args[i]) = tensors[i];
    OpInterceptorScope scope(save_ops.empty() ? nullptr : interceptor);
    return forward(a, kw);
  }
};

// torch's CPU generator state (dropout on plain tensors draws from it), and setting it.
at::Tensor cpu_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_generator_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Rewinds the generators to the forward's and puts them back after; installs the recompute's
// parameter aliases and puts the slots' tensors back after.
struct RecomputeScope {
  CheckpointCall& call;
  at::Tensor cpu_state_now;
  std::vector<std::pair<std::pair<torch::nn::Module*, std::string>, at::Tensor>> restore;
  explicit RecomputeScope(CheckpointCall& c) : call(c) {
    if (call.preserve_rng) {
      cpu_state_now = cpu_generator_state();
      set_cpu_generator_state(call.cpu_rng_state);
    }
    ++t_recomputing;
  }
  void install(const std::pair<torch::nn::Module*, std::string>& slot, const at::Tensor& value) {
    restore.emplace_back(slot, slot.first->named_parameters(false)[slot.second]);
    nn::detail::set_parameter_unchecked(*slot.first, slot.second, value);
  }
  ~RecomputeScope() {
    --t_recomputing;
    for (auto it = restore.rbegin(); it != restore.rend(); ++it) nn::detail::set_parameter_unchecked(*it->first.first, it->first.second, it->second);
    if (call.preserve_rng) {
      set_cpu_generator_state(cpu_state_now);
    }
  }
};

std::vector<at::Tensor> flatten_outputs(const c10::IValue& out, const char* what) {
  if (out.isTensor()) return {out.toTensor()};
  HP_CHECK_T(c10::TypeError, out.isTuple(), "hyper_parallel::", what, ": a checkpointed module returns a tensor or a tuple of tensors, got ",
             out.tagKind());
  std::vector<at::Tensor> outs;
  for (const auto& e : out.toTupleRef().elements()) {
    HP_CHECK_T(c10::TypeError, e.isTensor(), "hyper_parallel::", what, ": a checkpointed module returns a tensor or a tuple of tensors, ",
               "got a tuple holding ", e.tagKind());
    outs.push_back(e.toTensor());
  }
  return outs;
}

struct CheckpointFn : torch::autograd::Function<CheckpointFn> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointCall> call, at::TensorList inputs) {
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    ctx->save_for_backward(inputs.vec());
    Recorder recorder(call->save_ops, call->kept);
    SideOutputs side;
    c10::IValue out;
    {
      SideOutputScope scope(&side);
      out = call->run(inputs, &recorder);
    }
    call->output_is_tuple = out.isTuple();
    std::vector<at::Tensor> outs = flatten_outputs(out, "checkpoint_wrapper");
    call->main_outputs = outs.size();
    outs.insert(outs.end(), side.values.begin(), side.values.end());
    call->deliver_side = std::move(side.deliver);
    for (const auto& t : outs)
      if (t.defined() && !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) ctx->mark_non_differentiable({t});
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<CheckpointCall>(ctx->saved_data["call"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const size_t n_args = call->tensor_args.size();
    std::vector<at::Tensor> leaves;  // what the recompute's gradients are read from, per input
    variable_list outs;
    {
      RecomputeScope scope(*call);
      for (size_t i = 0; i < saved.size(); ++i) {
        at::Tensor leaf;
        if (saved[i].defined()) {
          leaf = saved[i].detach();
          if (saved[i].requires_grad()) leaf.requires_grad_(true);
        }
        leaves.push_back(leaf);
        if (i >= n_args)
          for (const auto& slot : call->slots[i - n_args]) scope.install(slot, leaf);
      }
      at::AutoGradMode grad(true);
      Replayer replayer(call->save_ops, call->kept);
      SideOutputs side;
      {
        SideOutputScope side_scope(&side);
        outs = flatten_outputs(call->run(leaves, &replayer), "checkpoint_wrapper");
      }
      HP_CHECK_T(c10::ValueError, outs.size() == call->main_outputs && side.values.size() + outs.size() == grad_outputs.size(),
                 "hyper_parallel::checkpoint_wrapper: the recomputed forward returned ", outs.size(), " tensors and ", side.values.size(),
                 " side outputs where the forward returned ", call->main_outputs, " and ", grad_outputs.size() - call->main_outputs,
                 "; a checkpointed module must run the same ops each time (no control flow on values or state)");
      outs.insert(outs.end(), side.values.begin(), side.values.end());
    }
    call->kept.clear();
    variable_list roots, grads;
    for (size_t i = 0; i < outs.size() && i < grad_outputs.size(); ++i)
      if (outs[i].defined() && outs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outs[i]);
        grads.push_back(grad_outputs[i]);
      }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result{at::Tensor()};  // the call
    for (const auto& leaf : leaves) result.push_back(leaf.defined() && leaf.requires_grad() ? leaf.grad() : at::Tensor());
    return result;
  }
};

c10::IValue checkpointed_forward(const CheckpointOptions& options, const std::string& label, nn::Module& module,
                                 const std::vector<c10::IValue>& args, const Kwargs& kwargs, const ForwardFn& forward) {
  // Nothing to save (no gradients), or inside an outer recompute (which already bounds memory).
  if (!at::GradMode::is_enabled() || t_recomputing > 0) return forward(args, kwargs);
  auto call = c10::make_intrusive<CheckpointCall>();
  call->forward = forward;
  call->args = args;
  call->kwargs = kwargs;
  call->save_ops = std::unordered_set<std::string>(options.save_ops.begin(), options.save_ops.end());
  call->preserve_rng = options.preserve_rng_state;
  std::vector<at::Tensor> inputs;
  bool any_grad = false;
  std::string object_arg;  // the first argument that is a mutable object, not a value
  for (size_t k = 0; k < args.size() + kwargs.size(); ++k) {
    c10::IValue& v = call->arg_at(k);
    if ((v.isCapsule() || v.isObject()) && object_arg.empty())
      object_arg = k < args.size() ? "positional argument " + std::to_string(k) : "keyword '" + kwargs[k - args.size()].first + "'";
    if (!v.isTensor()) continue;
    inputs.push_back(v.toTensor());
    any_grad = any_grad || v.toTensor().requires_grad();
    call->tensor_args.push_back(k);
    v = c10::IValue();
  }
  // Every distinct parameter in the module's slots now (fully_shard's gathered compute tensors
  // when its hooks ran): the recompute computes their gradients, which leave through this node.
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (const auto& [prefix, owner] : nn::modules_with_names(module))
    for (const auto& item : owner->named_parameters(false)) {
      const at::Tensor& p = item.value();
      auto [it, fresh] = index.emplace(p.unsafeGetTensorImpl(), call->slots.size());
      if (fresh) {
        call->slots.emplace_back();
        inputs.push_back(p);
        any_grad = any_grad || p.requires_grad();
      }
      call->slots[it->second].emplace_back(owner, item.key());
    }
  if (!any_grad) return forward(args, kwargs);
  // The recompute replays the arguments in backward, after the forward: an object the call reads
  // or writes (a generation cache) would have moved on by then, and the replay would write it again.
  HP_CHECK_T(c10::ValueError, object_arg.empty(), "hyper_parallel::checkpoint_wrapper: '", label, "' was called with ", object_arg,
             ", an object (per-call state such as a generation cache), which a checkpointed forward cannot replay in backward; ",
             "call it under at::NoGradGuard (generation) or without activation checkpointing");
  if (call->preserve_rng) {
    call->cpu_rng_state = cpu_generator_state();
  }
  variable_list outs = CheckpointFn::apply(call, at::TensorList(inputs));
  // The side outputs, now outputs of the node: a gradient that reaches one flows into the recompute.
  for (size_t i = 0; i < call->deliver_side.size(); ++i) call->deliver_side[i](outs.at(call->main_outputs + i));
  call->deliver_side.clear();
  outs.resize(call->main_outputs);
  if (!call->output_is_tuple) return outs.at(0);
  return c10::ivalue::Tuple::create(std::vector<c10::IValue>(outs.begin(), outs.end()));
}

}  // namespace

bool is_recomputing() { return t_recomputing > 0; }

void checkpoint_side_output(const at::Tensor& value, const std::function<void(const at::Tensor&)>& deliver) {
  if (t_side_outputs == nullptr) return deliver(value);
  t_side_outputs->values.push_back(value);
  // The recompute's side outputs are roots of its backward only; what the forward delivered stays.
  if (t_recomputing == 0) t_side_outputs->deliver.push_back(deliver);
}

namespace {
torch::nn::Module& wrap(torch::nn::Module& module, CheckpointOptions options, const std::string& label) {
  nn::Module& m = platform::hookable(module, label);
  m.set_forward_wrapper([options = std::move(options), label](nn::Module& self, const std::vector<c10::IValue>& args, const Kwargs& kwargs,
                                                              const ForwardFn& forward) {
    return checkpointed_forward(options, label, self, args, kwargs, forward);
  });
  return module;
}
}  // namespace

torch::nn::Module& checkpoint_wrapper(torch::nn::Module& module, CheckpointOptions options) {
  return wrap(module, std::move(options), module.name());
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::none() {
  ActivationCheckpointPolicy p;
  p.mode = Mode::None;
  return p;
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::full(int64_t every) {
  ActivationCheckpointPolicy p;
  p.mode = Mode::Full;
  p.every = every;
  return p;
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::selective(std::vector<std::string> save_ops) {
  ActivationCheckpointPolicy p;
  p.mode = Mode::Selective;
  p.save_ops = std::move(save_ops);
  return p;
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::parse(const std::string& text) {
  if (text == "none") return none();
  if (text == "selective") return selective();
  if (text == "full") return full();
  if (text.rfind("full:", 0) == 0) {
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(text.substr(5), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == text.size() - 5 && n > 0) return full(n);
  }
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::ActivationCheckpointPolicy::parse: '", text,
             "' is no activation checkpointing policy; use none, selective, full or full:N (every N-th block)");
  return none();
}

std::string ActivationCheckpointPolicy::to_string() const {
  switch (mode) {
    case Mode::None: return "none";
    case Mode::Selective: return every == 1 ? "selective" : "selective:" + std::to_string(every);
    case Mode::Full: return every == 1 ? "full" : "full:" + std::to_string(every);
  }
  return "none";
}

std::vector<std::string> apply_activation_checkpointing(torch::nn::Module& model, const ActivationCheckpointPolicy& policy) {
  HP_CHECK_T(c10::ValueError, policy.every >= 1, "hyper_parallel::apply_activation_checkpointing: every must be at least 1, got ",
             policy.every);
  HP_CHECK_T(c10::ValueError, policy.mode != ActivationCheckpointPolicy::Mode::Selective || !policy.save_ops.empty(),
             "hyper_parallel::apply_activation_checkpointing: a selective policy names the ops whose outputs are kept (save_ops)");
  std::vector<std::string> wrapped;
  if (policy.mode == ActivationCheckpointPolicy::Mode::None) return wrapped;
  // Blocks: the elements of ModuleLists, unless the policy says otherwise.
  std::unordered_set<const torch::nn::Module*> list_elements;
  for (const auto& [prefix, m] : nn::modules_with_names(model))
    if (dynamic_cast<const torch::nn::ModuleListImpl*>(m) != nullptr || dynamic_cast<const nn::ModuleListImpl*>(m) != nullptr)
      for (const auto& child : m->children()) list_elements.insert(child.get());
  std::vector<std::pair<std::string, torch::nn::Module*>> blocks;
  for (const auto& [fqn, m] : nn::modules_with_names(model))
    if (policy.is_block ? policy.is_block(fqn, *m) : list_elements.count(m) > 0) blocks.emplace_back(fqn, m);
  for (const auto& [fqn, m] : blocks) platform::hookable(*m, fqn);  // all or nothing
  CheckpointOptions options;
  if (policy.mode == ActivationCheckpointPolicy::Mode::Selective) options.save_ops = policy.save_ops;
  for (size_t k = 0; k < blocks.size(); ++k) {
    if ((static_cast<int64_t>(k) + 1) % policy.every != 0) continue;
    wrap(*blocks[k].second, options, blocks[k].first);
    wrapped.push_back(blocks[k].first);
  }
  return wrapped;
}

}  // namespace hyper_parallel
