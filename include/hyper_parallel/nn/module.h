#pragma once
// hyper_parallel::nn::Module: torch::nn::Module plus forward hooks, parameter replacement and a
// declared kind (Linear-like, Embedding-like), which the tensor-parallel styles need and
// libtorch's C++ modules lack. Modules are used through holders made by HP_MODULE (like
// TORCH_MODULE), whose call operator runs: forward pre-hooks, forward, forward hooks.
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <hyper_parallel/runtime/call_context.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hyper_parallel {
namespace nn {

/// Named ("keyword") arguments, in order: a module's forward takes them as a trailing
/// `const Kwargs&` parameter. e.g. `attn(x, Kwargs{{"mask", mask}})`.
using Kwargs = std::vector<std::pair<std::string, c10::IValue>>;

/// What a module is, for the styles that only apply to some kinds (Colwise/Rowwise: Linear and Embedding).
enum class ModuleKind { Other, Linear, Embedding };

class Module;

/// Removes the hook it was returned for (idempotent).
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<int> alive, Module* module, uint64_t id) : alive_(std::move(alive)), module_(module), id_(id) {}
  void remove();

 private:
  std::weak_ptr<int> alive_;
  Module* module_ = nullptr;
  uint64_t id_ = 0;
};

/// Receives the positional arguments; returns replacements or nullopt to keep them.
using ForwardPreHook = std::function<c10::optional<std::vector<c10::IValue>>(Module&, const std::vector<c10::IValue>&)>;
/// Receives the positional and named arguments; returns replacements for both or nullopt.
using ForwardPreHookWithKwargs = std::function<c10::optional<std::pair<std::vector<c10::IValue>, Kwargs>>(
    Module&, const std::vector<c10::IValue>&, const Kwargs&)>;
/// Receives the positional arguments and the output (a tuple for several results); returns a
/// replacement output or nullopt.
using ForwardHook = std::function<c10::optional<c10::IValue>(Module&, const std::vector<c10::IValue>&, const c10::IValue&)>;
/// The module's own forward on packed arguments (what a ForwardWrapper calls, now or later).
using ForwardFn = std::function<c10::IValue(const std::vector<c10::IValue>&, const Kwargs&)>;
/// Runs in place of the module's forward, between the pre-hooks and the forward hooks, and
/// decides how `forward` runs (activation checkpointing runs it without saving activations and
/// again in backward).
using ForwardWrapper = std::function<c10::IValue(Module&, const std::vector<c10::IValue>&, const Kwargs&, const ForwardFn& forward)>;

class Module : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  ~Module() override;

  /// Hooks run in registration order. e.g.
  /// `m->register_forward_pre_hook([](Module&, const auto& args) { return c10::nullopt; });`
  /// Virtual so that a module standing in for another frontend's module (the platform seam's
  /// Python mirror) attaches them to that module, in the order they are registered.
  virtual HookHandle register_forward_pre_hook(ForwardPreHook hook);
  virtual HookHandle register_forward_pre_hook_with_kwargs(ForwardPreHookWithKwargs hook);
  /// With `always_call` (as PyTorch's), the hook also runs when a pre-hook or forward throws,
  /// with a None output, before the exception propagates: the place to undo what a pre-hook did.
  virtual HookHandle register_forward_hook(ForwardHook hook, bool always_call = false);
  bool has_hooks() const { return !pre_hooks_.empty() || !forward_hooks_.empty() || forward_wrapper_ != nullptr; }
  /// Sets (or with nullptr removes) the wrapper the forward runs through; one per module.
  void set_forward_wrapper(ForwardWrapper wrapper) { forward_wrapper_ = std::move(wrapper); }
  const ForwardWrapper& forward_wrapper() const { return forward_wrapper_; }

  /// Runs the pre-hooks on the packed arguments (used by the call operator).
  void run_forward_pre_hooks(std::vector<c10::IValue>& args, Kwargs& kwargs);
  /// Runs the forward hooks; returns whether one replaced `output`.
  bool run_forward_hooks(const std::vector<c10::IValue>& args, c10::IValue& output);
  /// Runs the always_call hooks after a pre-hook or forward threw (a hook that throws in turn is
  /// reported as a warning: the first exception is the one that propagates).
  void run_forward_hooks_after_exception(const std::vector<c10::IValue>& args) noexcept;

  /// The registered parameter `name` (the registry is the one source of truth: layers read their
  /// parameters through it on every call). c10::IndexError when there is none
  /// (libtorch 1.13 has no KeyError).
  const at::Tensor& parameter(const std::string& name) const;
  /// The registered parameter or an undefined tensor.
  at::Tensor parameter_or_undefined(const std::string& name) const;
  /// Replaces parameter `name` (e.g. by a DTensor of the same global shape). Keeps its
  /// requires_grad. Throws c10::ValueError when the shape or dtype differs.
  void replace_parameter(const std::string& name, at::Tensor value);
  /// The same for a buffer.
  void replace_buffer(const std::string& name, at::Tensor value);
  /// Whether this module has a direct (non-recursive) parameter or buffer called `name`.
  bool has_parameter(const std::string& name) const { return parameters_.contains(name); }

  /// Linear-like modules have `weight` [out_features, in_features] and an optional `bias`;
  /// Embedding-like ones `weight` [num_embeddings, embedding_dim]. Override to let the
  /// Colwise/Rowwise styles shard a module of your own.
  virtual ModuleKind module_kind() const { return ModuleKind::Other; }

  /// Calls the module on one tensor with hooks (Sequential uses it); modules whose forward
  /// takes one tensor provide it through ModuleHolder/HP_MODULE.
  virtual at::Tensor call_tensor(const at::Tensor& input);

  /// (Re)initialises this module's own parameters and buffers (not its children's), as
  /// PyTorch's reset_parameters: what construction does, and what init_parameters calls after
  /// allocating a meta-built model's local shards. Draw through hyper_parallel::uniform_ /
  /// normal_ (dtensor/random.h), in the order the parameters were registered, so that one process,
  /// a meta-built model materialised at any layout and eager construction hold the same values.
  /// The default throws c10::NotImplementedError: a module with parameters of its own overrides it.
  virtual void reset_parameters();

  /// The state another layer keeps for this module, one object per type T, made on first use;
  /// it lives and dies with the module (tensor_parallel/ records here that it distributed the
  /// module, without nn/ knowing about tensor parallelism).
  /// T is copyable: a ModuleSnapshot keeps a copy of each state to put back.
  template <class T>
  T& state() {
    State& s = states_[std::type_index(typeid(T))];
    if (s.value == nullptr) {
      s.value = std::make_shared<T>();
      s.copy = [](const void* v) -> std::shared_ptr<void> { return std::make_shared<T>(*static_cast<const T*>(v)); };
    }
    return *static_cast<T*>(s.value.get());
  }
  /// The state of type T, or nullptr when none was made.
  template <class T>
  const T* find_state() const {
    const auto it = states_.find(std::type_index(typeid(T)));
    return it == states_.end() ? nullptr : static_cast<const T*>(it->second.value.get());
  }

 protected:
  /// Removes hook `id` (what HookHandle::remove calls); an override removes what its
  /// register_* overrides attached.
  virtual void remove_hook(uint64_t id);
  /// The id the next hook gets (overrides of register_* number their hooks with it).
  uint64_t take_hook_id() { return next_hook_id_++; }
  /// A handle that removes hook `id` from this module while it lives.
  HookHandle handle_for(uint64_t id) { return HookHandle(alive_, this, id); }

 private:
  friend class HookHandle;
  friend class ModuleSnapshot;
  struct PreHook {
    uint64_t id;
    ForwardPreHook plain;
    ForwardPreHookWithKwargs with_kwargs;
  };
  std::vector<PreHook> pre_hooks_;
  struct PostHook {
    uint64_t id;
    ForwardHook hook;
    bool always_call;
  };
  std::vector<PostHook> forward_hooks_;
  uint64_t next_hook_id_ = 1;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
  struct State {
    std::shared_ptr<void> value;
    std::function<std::shared_ptr<void>(const void*)> copy;
  };
  std::unordered_map<std::type_index, State> states_;
  ForwardWrapper forward_wrapper_;
};

/// What a change to a module tree may alter, taken before a change that must be all or nothing
/// (parallelize_module) and put back when it fails: every module's parameter, buffer and child
/// slots, its parameters' requires_grad, and for hyper_parallel::nn modules their hooks, forward
/// wrapper and states. Tensors changed in place are not covered (the styles replace, never write).
/// e.g. `ModuleSnapshot s(model); try { apply(); } catch (...) { s.restore(); throw; }`
class ModuleSnapshot {
 public:
  explicit ModuleSnapshot(torch::nn::Module& root);
  /// Puts every module of the tree back as it was when the snapshot was taken.
  void restore();

 private:
  struct Entry {
    torch::nn::Module* module;
    std::vector<std::pair<std::string, at::Tensor>> parameters, buffers;
    std::vector<bool> requires_grad;
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> children;
    bool hookable = false;
    std::vector<Module::PreHook> pre_hooks;
    std::vector<Module::PostHook> forward_hooks;
    ForwardWrapper forward_wrapper;
    std::unordered_map<std::type_index, Module::State> states;
  };
  std::vector<Entry> entries_;
};

/// `module` itself (named "") and every submodule with its FQN, in named_modules order. Unlike
/// named_modules(include_self=true) it works for a module that is not held by a shared_ptr.
std::vector<std::pair<std::string, torch::nn::Module*>> modules_with_names(torch::nn::Module& module);

/// Replaces parameter `name` of any module (libtorch's own too): same checks as
/// Module::replace_parameter.
void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value);
/// Replaces buffer `name` of any module.
void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value);

namespace detail {

/// Puts `value` in parameter slot `name` whatever its shape or dtype, keeping the slot's
/// requires_grad: for tensors that stand in for a parameter during one forward (fully_shard's
/// gathered compute tensors in another dtype, activation checkpointing's recompute aliases).
void set_parameter_unchecked(torch::nn::Module& module, const std::string& name, at::Tensor value);

/// Makes `module`'s own parameter, buffer and child slots exactly these, in this order, taking
/// each tensor as it is (requires_grad included): for a module that stands in for another
/// frontend's module (the platform seam's Python mirror), read again after that frontend's code
/// changed the module it mirrors.
void reset_slots(torch::nn::Module& module, std::vector<std::pair<std::string, at::Tensor>> parameters,
                 std::vector<std::pair<std::string, at::Tensor>> buffers,
                 std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> children);

template <class T>
constexpr bool is_kwargs_v = std::is_same_v<std::decay_t<T>, Kwargs>;

template <class T>
void pack(std::vector<c10::IValue>& pos, Kwargs& kw, T&& v) {
  if constexpr (is_kwargs_v<T>) kw = v;
  else if constexpr (std::is_base_of_v<at::Tensor, std::decay_t<T>>) pos.emplace_back(static_cast<const at::Tensor&>(v));  // DTensor
  else pos.emplace_back(std::forward<T>(v));
}

template <class T>
std::decay_t<T> get_arg(const std::vector<c10::IValue>& pos, const Kwargs& kw, size_t k) {
  if constexpr (is_kwargs_v<T>) return kw;
  else if constexpr (std::is_base_of_v<at::Tensor, std::decay_t<T>> && !std::is_same_v<std::decay_t<T>, at::Tensor>)
    return std::decay_t<T>(pos[k].toTensor());
  else return pos[k].to<std::decay_t<T>>();
}

template <class... Ts, size_t... I>
std::tuple<std::decay_t<Ts>...> unpack(const std::vector<c10::IValue>& pos, const Kwargs& kw,
                                       std::index_sequence<I...>) {
  constexpr std::array<bool, sizeof...(Ts) + 1> kw_at{is_kwargs_v<Ts>..., false};
  constexpr auto pos_index = [](size_t i, const std::array<bool, sizeof...(Ts) + 1>& k) {
    size_t n = 0;
    for (size_t j = 0; j < i; ++j) n += !k[j];
    return n;
  };
  return std::tuple<std::decay_t<Ts>...>{get_arg<Ts>(pos, kw, pos_index(I, kw_at))...};
}

void check_arity(const Module& m, size_t expected, size_t got);

template <class D, class = void>
struct has_tensor_forward : std::false_type {};
template <class D>
struct has_tensor_forward<D, std::void_t<decltype(std::declval<D&>().forward(std::declval<const at::Tensor&>()))>>
    : std::is_convertible<decltype(std::declval<D&>().forward(std::declval<const at::Tensor&>())), at::Tensor> {};

}  // namespace detail

namespace detail {
/// While module paths are tracked (runtime/call_context.h), the call pushes its module's FQN.
class ModuleCallScope {
 public:
  explicit ModuleCallScope(Module& m) {
    if (C10_UNLIKELY(call_context::tracking())) active_ = enter(m);
  }
  ~ModuleCallScope() {
    if (active_) call_context::pop_module();
  }
  ModuleCallScope(const ModuleCallScope&) = delete;
  ModuleCallScope& operator=(const ModuleCallScope&) = delete;

 private:
  static bool enter(Module& m);
  bool active_ = false;
};
}  // namespace detail

/// Calls `m.forward(args...)` with `m`'s hooks around it. Without hooks it is a direct call.
template <class M, class... Args>
auto call_with_hooks(M& m, Args&&... args) -> std::decay_t<decltype(m.forward(std::forward<Args>(args)...))> {
  using R = decltype(m.forward(std::forward<Args>(args)...));
  const detail::ModuleCallScope scope(m);
  if (!m.has_hooks()) return m.forward(std::forward<Args>(args)...);
  std::vector<c10::IValue> pos;
  Kwargs kw;
  (detail::pack(pos, kw, args), ...);
  std::decay_t<R> out = [&]() -> std::decay_t<R> {
    try {
      m.run_forward_pre_hooks(pos, kw);
      constexpr size_t npos = (0 + ... + (detail::is_kwargs_v<Args> ? 0 : 1));
      detail::check_arity(m, npos, pos.size());
      if (m.forward_wrapper()) {
        M* self = &m;
        const ForwardFn forward = [self](const std::vector<c10::IValue>& p, const Kwargs& k) -> c10::IValue {
          auto unpacked = detail::unpack<Args...>(p, k, std::index_sequence_for<Args...>{});
          return c10::IValue(std::apply([self](auto&&... a) -> decltype(auto) { return self->forward(a...); }, unpacked));
        };
        return m.forward_wrapper()(m, pos, kw, forward).template to<std::decay_t<R>>();
      }
      auto unpacked = detail::unpack<Args...>(pos, kw, std::index_sequence_for<Args...>{});
      return std::apply([&m](auto&&... a) -> decltype(auto) { return m.forward(a...); }, unpacked);
    } catch (...) {
      m.run_forward_hooks_after_exception(pos);  // the arguments as the pre-hooks left them
      throw;
    }
  }();
  c10::IValue out_value(out);
  if (m.run_forward_hooks(pos, out_value)) out = out_value.to<std::decay_t<R>>();
  return out;
}

/// Holder whose call operator runs the hooks (HP_MODULE defines one per module type).
template <class Impl>
class ModuleHolder : public torch::nn::ModuleHolder<Impl> {
 public:
  using torch::nn::ModuleHolder<Impl>::ModuleHolder;
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return call_with_hooks(*this->get(), std::forward<Args>(args)...);
  }
};

/// Gives a module class (deriving from it) the one-tensor call that containers use.
template <class Derived>
class ModuleBase : public Module {
 public:
  using Module::Module;
  at::Tensor call_tensor(const at::Tensor& input) override {
    auto& self = static_cast<Derived&>(*this);
    if constexpr (detail::has_tensor_forward<Derived>::value)
      return call_with_hooks(self, input);
    else
      return Module::call_tensor(input);
  }
};

}  // namespace nn
}  // namespace hyper_parallel

/// Defines the holder `Name` of `NameImpl` (a hyper_parallel::nn::Module), like TORCH_MODULE.
#define HP_MODULE(Name)                                                    \
  class Name : public ::hyper_parallel::nn::ModuleHolder<Name##Impl> {    \
   public:                                                                 \
    using ::hyper_parallel::nn::ModuleHolder<Name##Impl>::ModuleHolder;   \
  }
