#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/errors.h>

#include <algorithm>

namespace hyper_parallel {
namespace nn {

namespace {
// libtorch keeps torch::nn::Module::buffers_ and children_ private (parameters_ is protected) and
// has no way to swap a buffer for another tensor, which distribute_module must do, or to put a
// module's children back (ModuleSnapshot). An explicit template
// instantiation may name a private member (C++ [temp.explicit]); this is the one place that does.
struct BuffersTag {
  using type = torch::OrderedDict<std::string, at::Tensor> torch::nn::Module::*;
  friend type member(BuffersTag);
};
template <class Tag, typename Tag::type M>
struct Expose {
  friend typename Tag::type member(Tag) { return M; }
};
template struct Expose<BuffersTag, &torch::nn::Module::buffers_>;
struct ChildrenTag {
  using type = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>> torch::nn::Module::*;
  friend type member(ChildrenTag);
};
template struct Expose<ChildrenTag, &torch::nn::Module::children_>;

torch::OrderedDict<std::string, at::Tensor>& buffers_of(torch::nn::Module& m) { return m.*member(BuffersTag{}); }
torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& children_of(torch::nn::Module& m) {
  return m.*member(ChildrenTag{});
}

// parameters_ is protected: reachable through a member pointer named in a derived class.
struct ParametersAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& of(torch::nn::Module& m) { return m.*(&ParametersAccess::parameters_); }
};

template <class V>
std::vector<std::pair<std::string, V>> items_of(const torch::OrderedDict<std::string, V>& d) {
  std::vector<std::pair<std::string, V>> out;
  for (const auto& item : d) out.emplace_back(item.key(), item.value());
  return out;
}

template <class V>
void assign(torch::OrderedDict<std::string, V>& d, std::vector<std::pair<std::string, V>> items) {
  d.clear();
  for (auto& [k, v] : items) d.insert(std::move(k), std::move(v));
}
}  // namespace

void HookHandle::remove() {
  if (auto alive = alive_.lock()) module_->remove_hook(id_);
  alive_.reset();
}

Module::~Module() = default;

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  const uint64_t id = next_hook_id_++;
  pre_hooks_.push_back({id, std::move(hook), nullptr});
  return HookHandle(alive_, this, id);
}

HookHandle Module::register_forward_pre_hook_with_kwargs(ForwardPreHookWithKwargs hook) {
  const uint64_t id = next_hook_id_++;
  pre_hooks_.push_back({id, nullptr, std::move(hook)});
  return HookHandle(alive_, this, id);
}

HookHandle Module::register_forward_hook(ForwardHook hook, bool always_call) {
  const uint64_t id = next_hook_id_++;
  forward_hooks_.push_back({id, std::move(hook), always_call});
  return HookHandle(alive_, this, id);
}

void Module::remove_hook(uint64_t id) {
  pre_hooks_.erase(std::remove_if(pre_hooks_.begin(), pre_hooks_.end(), [id](const PreHook& h) { return h.id == id; }),
                   pre_hooks_.end());
  forward_hooks_.erase(std::remove_if(forward_hooks_.begin(), forward_hooks_.end(),
                                      [id](const PostHook& h) { return h.id == id; }),
                       forward_hooks_.end());
}

void Module::run_forward_pre_hooks(std::vector<c10::IValue>& args, Kwargs& kwargs) {
  for (size_t i = 0; i < pre_hooks_.size(); ++i) {
    // Each hook is copied before it runs: it may register or remove hooks.
    const PreHook& h = pre_hooks_[i];
    if (h.with_kwargs) {
      auto hook = h.with_kwargs;
      if (auto r = hook(*this, args, kwargs)) {
        args = std::move(r->first);
        kwargs = std::move(r->second);
      }
    } else {
      auto hook = h.plain;
      if (auto r = hook(*this, args)) args = std::move(*r);
    }
  }
}

bool Module::run_forward_hooks(const std::vector<c10::IValue>& args, c10::IValue& output) {
  bool replaced = false;
  for (size_t i = 0; i < forward_hooks_.size(); ++i) {
    auto hook = forward_hooks_[i].hook;
    if (auto r = hook(*this, args, output)) {
      output = std::move(*r);
      replaced = true;
    }
  }
  return replaced;
}

void Module::run_forward_hooks_after_exception(const std::vector<c10::IValue>& args) noexcept {
  std::vector<ForwardHook> hooks;
  for (const PostHook& h : forward_hooks_)
    if (h.always_call) hooks.push_back(h.hook);
  const c10::IValue none;
  for (auto& hook : hooks) {
    try {
      hook(*this, args, none);
    } catch (const std::exception& e) {
      TORCH_WARN("forward hook with always_call=true of ", name(), " raised while handling an exception: ", e.what());
    } catch (...) {
      TORCH_WARN("forward hook with always_call=true of ", name(), " raised while handling an exception");
    }
  }
}

const at::Tensor& Module::parameter(const std::string& name) const {
  const at::Tensor* p = parameters_.find(name);
  HP_CHECK_T(c10::IndexError, p != nullptr, "hyper_parallel::nn::Module::parameter: ", Module::name(), " has no parameter '", name, "'");
  return *p;
}

at::Tensor Module::parameter_or_undefined(const std::string& name) const {
  const at::Tensor* p = parameters_.find(name);
  return p ? *p : at::Tensor();
}

namespace {
// fn: "replace_parameter" or "replace_buffer"; what: "parameter" or "buffer".
void check_compatible(const char* fn, const std::string& module, const char* what, const std::string& name,
                      const at::Tensor& old, const at::Tensor& value) {
  HP_CHECK_T(c10::ValueError, value.defined(), "hyper_parallel::nn::", fn, ": ", module, ": cannot replace ", what, " '", name,
             "' by an undefined tensor");
  HP_CHECK_T(c10::ValueError, !old.defined() || old.sizes() == value.sizes(), "hyper_parallel::nn::", fn, ": ", module,
             ": cannot replace ", what, " '", name, "' of shape ", old.sizes(), " by a tensor of shape ", value.sizes());
  HP_CHECK_T(c10::ValueError, !old.defined() || old.scalar_type() == value.scalar_type(), "hyper_parallel::nn::", fn, ": ", module,
             ": cannot replace ", what, " '", name, "' of dtype ", old.scalar_type(), " by a tensor of dtype ", value.scalar_type());
}
}  // namespace

bool detail::ModuleCallScope::enter(Module& m) {
  const torch::nn::Module* self = &m;
  const auto* parent = static_cast<const torch::nn::Module*>(call_context::current_module());
  // The path from the calling module: a breadth-first search of its submodules (a decoder layer
  // is called by the model, but registered inside its ModuleList). Only while tracking.
  if (parent != nullptr) {
    std::vector<std::pair<std::string, const torch::nn::Module*>> level{{"", parent}}, next;
    while (!level.empty()) {
      for (const auto& [prefix, mod] : level)
        for (const auto& child : mod->named_children()) {
          std::string path = prefix.empty() ? child.key() : prefix + "." + child.key();
          if (child.value().get() == self) {
            const std::string& base = call_context::current_fqn();
            call_context::push_module(self, base.empty() ? path : base + "." + path);
            return true;
          }
          next.emplace_back(std::move(path), child.value().get());
        }
      level.swap(next);
      next.clear();
    }
  }
  call_context::push_module(self, "", m.name());  // called from outside any module: a root
  return true;
}

std::vector<std::pair<std::string, torch::nn::Module*>> modules_with_names(torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::nn::Module*>> out{{"", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false)) out.emplace_back(item.key(), item.value().get());
  return out;
}

void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  at::Tensor* p = ParametersAccess::of(module).find(name);
  HP_CHECK_T(c10::IndexError, p != nullptr, "hyper_parallel::nn::replace_parameter: ", module.name(), " has no parameter '", name, "'");
  check_compatible("replace_parameter", module.name(), "parameter", name, *p, value);
  const bool requires_grad = p->requires_grad();
  if (value.requires_grad() != requires_grad) value.set_requires_grad(requires_grad);
  *p = std::move(value);
}

void detail::set_parameter_unchecked(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  at::Tensor* p = ParametersAccess::of(module).find(name);
  HP_CHECK_T(c10::IndexError, p != nullptr, "hyper_parallel::nn::detail::set_parameter_unchecked: ", module.name(), " has no parameter '", name,
             "'");
  const bool requires_grad = p->requires_grad();
  if (value.requires_grad() != requires_grad) value.set_requires_grad(requires_grad);
  *p = std::move(value);
}

void detail::reset_slots(torch::nn::Module& module, std::vector<std::pair<std::string, at::Tensor>> parameters,
                         std::vector<std::pair<std::string, at::Tensor>> buffers,
                         std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> children) {
  assign(ParametersAccess::of(module), std::move(parameters));
  assign(buffers_of(module), std::move(buffers));
  assign(children_of(module), std::move(children));
}

ModuleSnapshot::ModuleSnapshot(torch::nn::Module& root) {
  std::vector<torch::nn::Module*> seen;
  for (const auto& [name, m] : modules_with_names(root)) {
    if (std::find(seen.begin(), seen.end(), m) != seen.end()) continue;  // a module reached twice
    seen.push_back(m);
    Entry e;
    e.module = m;
    e.parameters = items_of(ParametersAccess::of(*m));
    for (const auto& [k, t] : e.parameters) e.requires_grad.push_back(t.defined() && t.requires_grad());
    e.buffers = items_of(buffers_of(*m));
    e.children = items_of(children_of(*m));
    if (auto* hp = dynamic_cast<Module*>(m)) {
      e.hookable = true;
      e.pre_hooks = hp->pre_hooks_;
      e.forward_hooks = hp->forward_hooks_;
      e.forward_wrapper = hp->forward_wrapper_;
      // States are copied: their owners change them in place.
      for (const auto& [type, st] : hp->states_) e.states.emplace(type, Module::State{st.copy(st.value.get()), st.copy});
    }
    entries_.push_back(std::move(e));
  }
}

void ModuleSnapshot::restore() {
  for (Entry& e : entries_) {
    for (size_t i = 0; i < e.parameters.size(); ++i) {
      at::Tensor& t = e.parameters[i].second;
      if (t.defined() && t.requires_grad() != e.requires_grad[i]) t.set_requires_grad(e.requires_grad[i]);
    }
    detail::reset_slots(*e.module, e.parameters, e.buffers, e.children);
    if (e.hookable) {
      auto* hp = dynamic_cast<Module*>(e.module);
      hp->pre_hooks_ = e.pre_hooks;
      hp->forward_hooks_ = e.forward_hooks;
      hp->forward_wrapper_ = e.forward_wrapper;
      hp->states_.clear();
      for (const auto& [type, st] : e.states) hp->states_.emplace(type, Module::State{st.copy(st.value.get()), st.copy});
    }
  }
}

void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  at::Tensor* b = buffers_of(module).find(name);
  HP_CHECK_T(c10::IndexError, b != nullptr, "hyper_parallel::nn::replace_buffer: ", module.name(), " has no buffer '", name, "'");
  check_compatible("replace_buffer", module.name(), "buffer", name, *b, value);
  *b = std::move(value);
}

void Module::replace_parameter(const std::string& name, at::Tensor value) {
  nn::replace_parameter(*this, name, std::move(value));
}

void Module::replace_buffer(const std::string& name, at::Tensor value) { nn::replace_buffer(*this, name, std::move(value)); }

at::Tensor Module::call_tensor(const at::Tensor&) {
  HP_CHECK_T(c10::TypeError, false, "hyper_parallel::nn::Module::call_tensor: ", name(), " cannot be called with a single tensor");
  return {};
}

void Module::reset_parameters() {
  HP_CHECK_T(c10::NotImplementedError, false, "hyper_parallel::nn::Module::reset_parameters: ", name(),
             " holds parameters or buffers of its own and does not override reset_parameters, so they cannot be initialised");
}

namespace detail {
void check_arity(const Module& m, size_t expected, size_t got) {
  HP_CHECK_T(c10::ValueError, expected == got, "hyper_parallel::nn::Module::operator(): ", m.name(), ".forward takes ", expected,
             " positional arguments but a forward pre-hook returned ", got);
}
}  // namespace detail

}  // namespace nn
}  // namespace hyper_parallel
