#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/process_group.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace hyper_parallel {
namespace {
// Process-wide, not thread-local: autograd may run backward on its own threads.
std::mutex g_mutex;
std::vector<CommDebugMode*>& active() {
  static std::vector<CommDebugMode*> modes;
  return modes;
}
// Fast path: no lock when nothing listens.
std::atomic<int> g_active_count{0};
std::atomic<int> g_tracing_count{0};

// HP_LOG=dtensor (a comma-separated list): op lines go to stderr, once each per process.
bool log_dtensor() {
  static const bool on = [] {
    const char* v = std::getenv("HP_LOG");
    if (v == nullptr) return false;
    const std::string s = std::string(",") + v + ",";
    return s.find(",dtensor,") != std::string::npos;
  }();
  return on;
}

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < (1 << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  return buf;
}

std::string display(const std::string& fqn) { return fqn.empty() ? "<root>" : fqn; }
}  // namespace

namespace detail {
std::atomic<int> g_op_tracing{0};
}  // namespace detail

namespace {
// HP_LOG=dtensor: op lines and the module tracking they need, for the whole process (from load).
[[maybe_unused]] const bool g_log_at_load = [] {
  if (!log_dtensor()) return false;
  detail::g_op_tracing.fetch_add(1);
  new call_context::Tracking();  // never ends: the process logs until it exits
  return true;
}();
}  // namespace

CommDebugMode::CommDebugMode(bool trace) : trace_(trace) {
  if (trace_) tracking_ = std::make_unique<call_context::Tracking>();
  std::lock_guard<std::mutex> lock(g_mutex);
  active().push_back(this);
  g_active_count.fetch_add(1);
  if (trace_) {
    g_tracing_count.fetch_add(1);
    detail::g_op_tracing.fetch_add(1);
  }
}

CommDebugMode::~CommDebugMode() {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& a = active();
  a.erase(std::remove(a.begin(), a.end(), this), a.end());
  g_active_count.fetch_sub(1);
  if (trace_) {
    g_tracing_count.fetch_sub(1);
    detail::g_op_tracing.fetch_sub(1);
  }
}

void CommDebugMode::record(const char* kind, int64_t bytes, const Group& group, int64_t full_bytes) {
  if (g_active_count.load(std::memory_order_relaxed) == 0) return;
  const bool tracing = g_tracing_count.load(std::memory_order_relaxed) != 0;
  std::vector<std::string> enclosing;
  const std::string phase = call_context::phase();
  if (tracing) {
    enclosing = call_context::enclosing_fqns();
    if (enclosing.empty()) enclosing.push_back("");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  for (CommDebugMode* m : active()) {
    m->counts_[kind] += 1;
    m->bytes_[kind] += bytes;
    Stats& g = m->groups_[group.ranks()][phase][kind];
    g.count += 1;
    g.bytes += bytes;
    g.full_bytes += full_bytes;
    if (!m->trace_) continue;
    for (size_t i = 0; i < enclosing.size(); ++i) {
      const std::string& fqn = enclosing[i];
      const bool known = m->modules_.count(fqn) != 0;
      // A backward's FQN prefixes may name containers never called: only modules seen count,
      // besides the innermost one.
      if (!known && i + 1 != enclosing.size() && phase == "backward") continue;
      if (!known) m->module_order_.push_back(fqn);
      Stats& s = m->modules_[fqn][phase][kind];
      s.count += 1;
      s.bytes += bytes;
    }
  }
}

void CommDebugMode::record_op(const std::string& line) {
  const std::string fqn = call_context::current_fqn();
  if (log_dtensor()) {
    static std::mutex m;
    static std::unordered_set<std::string> printed;
    std::lock_guard<std::mutex> lock(m);
    const std::string key = fqn + "\n" + line;
    if (printed.insert(key).second) {
      const std::string rank = is_initialized() ? std::to_string(get_rank()) : "-";
      std::fprintf(stderr, "[hp dtensor rank %s] %s (%s): %s\n", rank.c_str(), display(fqn).c_str(), call_context::phase(),
                   line.c_str());
    }
  }
  if (g_tracing_count.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::string> enclosing = call_context::enclosing_fqns();
  if (enclosing.empty()) enclosing.push_back("");
  // A backward's FQN prefixes may name containers never called: only its own module is added.
  const bool backward = call_context::in_backward();
  std::lock_guard<std::mutex> lock(g_mutex);
  for (CommDebugMode* m : active()) {
    if (!m->trace_ || !m->seen_ops_.insert({fqn, line}).second) continue;
    for (const std::string& e : enclosing) {
      if (m->modules_.count(e) != 0 || (backward && e != fqn)) continue;
      m->module_order_.push_back(e);
      m->modules_[e];
    }
    m->module_ops_[fqn].push_back(line);
    m->op_trace_.push_back(display(fqn) + ": " + line);
  }
}

namespace {
// Counts and bytes are read the same way, under the lock their writers take.
int64_t total_of(const std::map<std::string, int64_t>& m) {
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t n = 0;
  for (const auto& kv : m) n += kv.second;
  return n;
}
int64_t entry_of(const std::map<std::string, int64_t>& m, const std::string& kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = m.find(kind);
  return it == m.end() ? 0 : it->second;
}
std::map<std::string, int64_t> copy_of(const std::map<std::string, int64_t>& m) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return m;
}
}  // namespace

int64_t CommDebugMode::get_total_counts() const { return total_of(counts_); }
int64_t CommDebugMode::get_comm_count(const std::string& kind) const { return entry_of(counts_, kind); }
std::map<std::string, int64_t> CommDebugMode::get_comm_counts() const { return copy_of(counts_); }
int64_t CommDebugMode::get_total_bytes() const { return total_of(bytes_); }
int64_t CommDebugMode::get_comm_bytes(const std::string& kind) const { return entry_of(bytes_, kind); }
std::map<std::string, int64_t> CommDebugMode::get_comm_bytes() const { return copy_of(bytes_); }
void CommDebugMode::reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  counts_.clear();
  bytes_.clear();
  groups_.clear();
  module_order_.clear();
  modules_.clear();
  module_ops_.clear();
  seen_ops_.clear();
  op_trace_.clear();
}
std::string CommDebugMode::summary() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string s;
  for (const auto& kv : counts_) {
    if (!s.empty()) s += ", ";
    s += kv.first + ": " + std::to_string(kv.second) + " (" + human_bytes(bytes_.at(kv.first)) + ")";
  }
  return s.empty() ? "no collectives" : s;
}

std::map<std::string, std::map<std::string, std::map<std::string, CommDebugMode::Stats>>> CommDebugMode::get_comm_module_stats() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return modules_;
}

std::map<std::vector<int64_t>, std::map<std::string, std::map<std::string, CommDebugMode::Stats>>>
CommDebugMode::get_comm_group_stats() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return groups_;
}

std::vector<std::string> CommDebugMode::get_op_trace() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return op_trace_;
}

std::string CommDebugMode::generate_comm_debug_tracing_table(int noise_level) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!trace_) return "CommDebugMode: construct it with trace = true for the per-module table\n";
  const std::vector<std::string>& order = module_order_;  // parents first: every record adds its enclosing modules
  char line[256];
  std::string out;
  std::snprintf(line, sizeof line, "%-44s %-9s %-15s %6s %12s\n", "module", "phase", "collective", "count", "bytes");
  out += line;
  for (const std::string& fqn : order) {
    const size_t depth = fqn.empty() ? 0 : 1 + static_cast<size_t>(std::count(fqn.begin(), fqn.end(), '.'));
    const std::string name = std::string(2 * depth, ' ') + display(fqn);
    const auto it = modules_.find(fqn);
    bool first = true;
    if (it != modules_.end())
      for (const char* phase : {"forward", "backward"}) {
        const auto p = it->second.find(phase);
        if (p == it->second.end()) continue;
        for (const auto& [kind, st] : p->second) {
          std::snprintf(line, sizeof line, "%-44s %-9s %-15s %6lld %12s\n", first ? name.c_str() : "", phase, kind.c_str(),
                        static_cast<long long>(st.count), human_bytes(st.bytes).c_str());
          out += line;
          first = false;
        }
      }
    if (first) {
      std::snprintf(line, sizeof line, "%-44s %-9s %-15s\n", name.c_str(), "", "(none)");
      out += line;
    }
    if (noise_level >= 1) {
      const auto ops = module_ops_.find(fqn);
      if (ops != module_ops_.end())
        for (const std::string& op : ops->second) out += std::string(2 * depth + 4, ' ') + op + "\n";
    }
  }
  return out;
}

}  // namespace hyper_parallel
