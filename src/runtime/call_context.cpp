#include <hyper_parallel/runtime/call_context.h>

#include <torch/csrc/autograd/graph_task.h>

#include <atomic>

namespace hyper_parallel {
namespace call_context {
namespace {

std::atomic<int> g_tracking{0};

struct Frame {
  const void* module;
  std::string fqn;
  std::string root_name;
};
thread_local std::vector<Frame> t_stack;

const std::string& empty() {
  static const std::string e;
  return e;
}

}  // namespace

bool tracking() { return g_tracking.load(std::memory_order_relaxed) != 0; }

Tracking::Tracking() { g_tracking.fetch_add(1); }
Tracking::~Tracking() { g_tracking.fetch_sub(1); }

void push_module(const void* module, std::string fqn, std::string root_name) {
  t_stack.push_back({module, std::move(fqn), std::move(root_name)});
}

void pop_module() {
  if (!t_stack.empty()) t_stack.pop_back();
}

const void* current_module() { return t_stack.empty() ? nullptr : t_stack.back().module; }

const std::string& current_fqn() { return t_stack.empty() ? empty() : t_stack.back().fqn; }

std::vector<std::string> enclosing_fqns() {
  std::vector<std::string> out;
  if (!t_stack.empty() && t_stack.back().module == nullptr) {
    // An override (a backward) knows only its FQN: its enclosing paths are the FQN's prefixes.
    const std::string& fqn = t_stack.back().fqn;
    out.push_back("");
    for (size_t dot = fqn.find('.'); dot != std::string::npos; dot = fqn.find('.', dot + 1)) out.push_back(fqn.substr(0, dot));
    if (!fqn.empty()) out.push_back(fqn);
    return out;
  }
  for (const Frame& f : t_stack)
    if (out.empty() || out.back() != f.fqn) out.push_back(f.fqn);
  return out;
}

std::string describe_current_module() {
  if (t_stack.empty()) return "no module";
  const Frame& f = t_stack.back();
  if (!f.fqn.empty()) return "module '" + f.fqn + "'";
  return "the root module" + (f.root_name.empty() ? std::string() : " (" + f.root_name + ")");
}

bool in_backward() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

const char* phase() { return in_backward() ? "backward" : "forward"; }

ModuleOverride::ModuleOverride(const std::string* fqn) {
  if (fqn == nullptr) return;
  t_stack.push_back({nullptr, *fqn, ""});
  pushed_ = true;
}

ModuleOverride::~ModuleOverride() {
  if (pushed_) pop_module();
}

}  // namespace call_context
}  // namespace hyper_parallel
