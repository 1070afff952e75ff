#pragma once
// Where the running code is, for errors and traces: the module path (the nn layer's module call
// pushes it) and the autograd phase. Modules are pushed only while something listens (an
// ExplicitRedistribution guard, a tracing CommDebugMode, HP_LOG=dtensor), so a module call costs
// one relaxed atomic load otherwise.
#include <string>
#include <vector>

namespace hyper_parallel {
namespace call_context {

/// Whether module paths are being tracked.
bool tracking();

/// RAII: while alive, module calls push their paths (counted; nests).
class Tracking {
 public:
  Tracking();
  ~Tracking();
  Tracking(const Tracking&) = delete;
  Tracking& operator=(const Tracking&) = delete;
};

/// Pushed and popped by the module call (nn/module.h) while tracking: the module's identity and
/// its FQN from the outermost module called ("" for that one, whose `root_name` is its type).
void push_module(const void* module, std::string fqn, std::string root_name = "");
void pop_module();
/// The innermost module being called on this thread, or nullptr.
const void* current_module();
/// Its FQN ("" at the outermost module, or outside every module).
const std::string& current_fqn();
/// Every module path enclosing the current point, outermost first ("" stands for the root). In
/// a ModuleOverride: the prefixes of its FQN (some may name containers that were never called).
std::vector<std::string> enclosing_fqns();
/// e.g. "module 'layers.0.mlp'", "the root module (qwen3::CausalLMImpl)", or "no module" when
/// nothing is tracked here.
std::string describe_current_module();

/// Whether autograd's engine is running a backward pass on this thread.
bool in_backward();
/// "forward" or "backward".
const char* phase();

/// RAII: the code in scope runs on behalf of module `fqn` (an autograd function's backward
/// attributes itself to the module its forward ran in). Does nothing when `fqn` is null.
class ModuleOverride {
 public:
  explicit ModuleOverride(const std::string* fqn);
  ~ModuleOverride();
  ModuleOverride(const ModuleOverride&) = delete;
  ModuleOverride& operator=(const ModuleOverride&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace call_context
}  // namespace hyper_parallel
