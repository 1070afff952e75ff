// The registry of sharding rules and op handlers (dtensor/sharding_rule.h), by operator name.
#include "sharding_propagation.h"

#include <hyper_parallel/runtime/errors.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace hyper_parallel {

std::atomic<uint64_t> g_registry_version{0};

namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, ShardingRule> rules;
  // Node-based: a handler's address stays valid when others are added (decisions keep it);
  // a replaced handler keeps its node.
  std::unordered_map<std::string, std::unique_ptr<OpHandler>> handlers;
  std::unordered_set<std::string> known_names;  // "ns::op" and "ns::op.overload" the dispatcher has
};
Registry& registry() {
  static Registry r;
  return r;
}

// Whether the dispatcher knows `name` ("aten::add" or "aten::add.Tensor"). The set is rebuilt on a
// miss: custom ops are registered (TORCH_LIBRARY) before their rules, possibly after ours.
bool dispatcher_knows(Registry& r, const std::string& name) {
  if (r.known_names.count(name) != 0) return true;
  r.known_names.clear();
  for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) {
    r.known_names.insert(n.name);
    if (!n.overload_name.empty()) r.known_names.insert(n.name + "." + n.overload_name);
  }
  return r.known_names.count(name) != 0;
}

}  // namespace

void register_sharding_rule(const std::string& op_name, ShardingRule rule) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  HP_CHECK_T(c10::ValueError, dispatcher_knows(r, op_name), "hyper_parallel::register_sharding_rule: no operator '",
             op_name, "' is registered with the dispatcher (write \"aten::add.Tensor\" for one overload or "
             "\"aten::add\" for all; register a custom op with TORCH_LIBRARY before its rule)");
  r.rules[op_name] = std::move(rule);
  g_registry_version.fetch_add(1);
}

void clear_sharding_cache() { g_registry_version.fetch_add(1); }

void register_op_handler(const std::string& name, OpHandler handler) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& slot = r.handlers[name];
  if (slot == nullptr) slot = std::make_unique<OpHandler>(std::move(handler));
  else *slot = std::move(handler);
  g_registry_version.fetch_add(1);
}

const OpHandler* find_handler(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.handlers.find(name);
  return it == r.handlers.end() ? nullptr : it->second.get();
}

const ShardingRule* find_rule(const c10::OperatorHandle& op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto& n = op.operator_name();
  if (!n.overload_name.empty()) {
    auto it = r.rules.find(n.name + "." + n.overload_name);
    if (it != r.rules.end()) return &it->second;
  }
  auto it = r.rules.find(n.name);
  return it == r.rules.end() ? nullptr : &it->second;
}

std::string rule_name(const OpInfo& info) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto& n = info.op().operator_name();
  const std::string full = n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
  return "the sharding rule registered for '" + (r.rules.count(full) != 0 ? full : n.name) + "'";
}

OpSharding apply_sharding_rule(const OpInfo& info) {
  const ShardingRule* rule = find_rule(info.op());
  HP_CHECK_T(c10::NotImplementedError, rule != nullptr, "hyper_parallel::dispatch: no sharding rule for ", info.describe(),
             "; register one with hyper_parallel::register_sharding_rule, or leave DTensor land "
             "first (full_tensor() / to_local())");
  return (*rule)(info);
}

}  // namespace hyper_parallel
