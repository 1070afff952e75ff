#include <hyper_parallel/runtime/comm_debug_mode.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
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

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < (1 << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  return buf;
}
}  // namespace

CommDebugMode::CommDebugMode() {
  std::lock_guard<std::mutex> lock(g_mutex);
  active().push_back(this);
  g_active_count.fetch_add(1);
}

CommDebugMode::~CommDebugMode() {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& a = active();
  a.erase(std::remove(a.begin(), a.end(), this), a.end());
  g_active_count.fetch_sub(1);
}

void CommDebugMode::record(const char* kind, int64_t bytes) {
  if (g_active_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (CommDebugMode* m : active()) {
    m->counts_[kind] += 1;
    m->bytes_[kind] += bytes;
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

}  // namespace hyper_parallel
