#pragma once
// The seed's platform seam: the only code that knows concrete module types and how hooks are
// attached. The tensor-parallel styles ask it, never the modules themselves.
#include <string>

#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {
namespace platform {

/// Linear-like: hyper_parallel::nn::Linear, or a module whose module_kind() says Linear.
bool is_linear_module(const torch::nn::Module& module);
/// Embedding-like: hyper_parallel::nn::Embedding, or module_kind() Embedding.
bool is_embedding_module(const torch::nn::Module& module);
/// Whether hooks can be attached: only hyper_parallel::nn modules run hooks (libtorch's own
/// modules call forward directly).
bool is_hookable(const torch::nn::Module& module);
/// The hook-capable view of `module`; c10::TypeError naming `fqn` and what to use instead when
/// it is a plain torch::nn module.
nn::Module& hookable(torch::nn::Module& module, const std::string& fqn);

/// Attaches a forward pre-hook; with_kwargs selects the hook that also sees named arguments.
nn::HookHandle register_forward_pre_hook(torch::nn::Module& module, nn::ForwardPreHook hook);
nn::HookHandle register_forward_pre_hook(torch::nn::Module& module, nn::ForwardPreHookWithKwargs hook,
                                         bool with_kwargs);
nn::HookHandle register_forward_hook(torch::nn::Module& module, nn::ForwardHook hook, bool always_call = false);

/// e.g. "hyper_parallel::nn::LinearImpl" or "torch::nn::LinearImpl", for messages.
std::string module_type_name(const torch::nn::Module& module);

}  // namespace platform
}  // namespace hyper_parallel
