#include <hyper_parallel/platform/platform.h>
#include <hyper_parallel/runtime/errors.h>

#include <c10/util/Type.h>

namespace hyper_parallel {
namespace platform {

namespace {
const nn::Module* as_hp(const torch::nn::Module& m) { return dynamic_cast<const nn::Module*>(&m); }
}  // namespace

bool is_linear_module(const torch::nn::Module& module) {
  const nn::Module* m = as_hp(module);
  return m != nullptr && m->module_kind() == nn::ModuleKind::Linear;
}

bool is_embedding_module(const torch::nn::Module& module) {
  const nn::Module* m = as_hp(module);
  return m != nullptr && m->module_kind() == nn::ModuleKind::Embedding;
}

bool is_hookable(const torch::nn::Module& module) { return as_hp(module) != nullptr; }

// The module's name: its C++ type unless it was given one (a Python module's mirror carries the
// Python class).
std::string module_type_name(const torch::nn::Module& module) { return module.name(); }

nn::Module& hookable(torch::nn::Module& module, const std::string& fqn) {
  auto* m = dynamic_cast<nn::Module*>(&module);
  HP_CHECK_T(c10::TypeError, m != nullptr, "hyper_parallel::platform::hookable: module '", fqn.empty() ? "<root>" : fqn, "' is a ",
             module_type_name(module),
             ", which cannot carry forward hooks (libtorch's modules call forward directly); build it "
             "from hyper_parallel::nn (e.g. hyper_parallel::nn::Linear instead of torch::nn::Linear) "
             "or derive it from hyper_parallel::nn::Module");
  return *m;
}

nn::HookHandle register_forward_pre_hook(torch::nn::Module& module, nn::ForwardPreHook hook) {
  return hookable(module, module.name()).register_forward_pre_hook(std::move(hook));
}

nn::HookHandle register_forward_pre_hook(torch::nn::Module& module, nn::ForwardPreHookWithKwargs hook,
                                         bool with_kwargs) {
  nn::Module& m = hookable(module, module.name());
  if (with_kwargs) return m.register_forward_pre_hook_with_kwargs(std::move(hook));
  // Without kwargs: the hook sees the positional arguments only, kwargs pass through unchanged.
  return m.register_forward_pre_hook(
      [hook = std::move(hook)](nn::Module& mod, const std::vector<c10::IValue>& args) -> c10::optional<std::vector<c10::IValue>> {
        auto r = hook(mod, args, {});
        if (!r) return c10::nullopt;
        return std::move(r->first);
      });
}

nn::HookHandle register_forward_hook(torch::nn::Module& module, nn::ForwardHook hook, bool always_call) {
  return hookable(module, module.name()).register_forward_hook(std::move(hook), always_call);
}

}  // namespace platform
}  // namespace hyper_parallel
