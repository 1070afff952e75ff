#pragma once
// What one forward pass of a decoder hands each of its layers (internal to the models library):
// every per-call input travels as a keyword argument of the layer's call, never beside it, so
// that activation checkpointing, which keeps a module's arguments and replays them in backward,
// recomputes the layer with exactly the inputs its forward saw (a padded batch's mask among them).
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <initializer_list>
#include <string>

namespace hyper_parallel {
namespace models {

/// A generation cache given to a layer as the keyword "cache": a capsule, an object rather than a
/// tensor, which checkpoint_wrapper refuses by name (a replay in backward would write it again).
template <class CacheT>
struct CacheArgument : torch::CustomClassHolder {
  CacheArgument(CacheT* c, int64_t p) : cache(c), past(p) {}
  CacheT* cache;
  int64_t past;  // positions already in the cache before this call
};

/// The keywords a layer call may carry: the rotary tables "cos" and "sin" [B or 1, 1, S, D],
/// "blocked" ([S, T] or [B, 1, S, T], true at keys a query may not see: a cache or padding),
/// "keep" ([B, S, 1], 0 at padding) and "cache" (a CacheArgument).
template <class CacheT>
struct LayerKwargs {
  at::Tensor cos, sin, blocked, keep;
  CacheT* cache = nullptr;
  int64_t past = 0;

  /// The keywords named in `names` that are set, in a fixed order (what a layer passes on).
  nn::Kwargs select(std::initializer_list<const char*> names) const {
    nn::Kwargs out;
    for (const std::string name : names) {
      if (name == "cache") {
        if (cache != nullptr) out.emplace_back(name, c10::IValue::make_capsule(c10::make_intrusive<CacheArgument<CacheT>>(cache, past)));
        continue;
      }
      const at::Tensor& t = name == "cos" ? cos : name == "sin" ? sin : name == "blocked" ? blocked : keep;
      if (t.defined()) out.emplace_back(name, t);
    }
    return out;
  }

  /// Reads `kwargs`, refusing (as hyper_parallel::<caller>) a name outside `allowed` or a value of
  /// the wrong kind.
  static LayerKwargs parse(const nn::Kwargs& kwargs, std::initializer_list<const char*> allowed, const char* caller) {
    LayerKwargs out;
    for (const auto& [name, value] : kwargs) {
      bool known = false;
      for (const char* a : allowed) known = known || name == a;
      if (!known) {  // the list of names only for the message: every layer call parses its keywords
        std::string names;
        for (const char* a : allowed) names += std::string(names.empty() ? "" : ", ") + a;
        HP_CHECK_T(c10::ValueError, false, "hyper_parallel::", caller, ": takes the keywords ", names, "; got '", name, "'");
      }
      if (name == "cache") {
        auto* arg = value.isCapsule() ? dynamic_cast<CacheArgument<CacheT>*>(value.toCapsule().get()) : nullptr;
        HP_CHECK_T(c10::TypeError, arg != nullptr, "hyper_parallel::", caller, ": the keyword 'cache' must be this model's generation ",
                   "cache, got ", value.tagKind());
        out.cache = arg->cache;
        out.past = arg->past;
        continue;
      }
      HP_CHECK_T(c10::TypeError, value.isTensor(), "hyper_parallel::", caller, ": the keyword '", name, "' must be a tensor, got ",
                 value.tagKind());
      (name == "cos" ? out.cos : name == "sin" ? out.sin : name == "blocked" ? out.blocked : out.keep) = value.toTensor();
    }
    return out;
  }
};

}  // namespace models
}  // namespace hyper_parallel
