#pragma once
// Counting collectives, as PyTorch's CommDebugMode does, and tracing DTensor ops.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/call_context.h>
#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {

namespace detail {
/// How many listeners want op lines (tracing modes, and HP_LOG=dtensor for the whole process).
extern std::atomic<int> g_op_tracing;
}  // namespace detail

/// RAII scope that counts every collective this process issues while it is alive (on any
/// thread, so autograd's backward is counted too). Kinds: "all_gather", "all_reduce",
/// "reduce_scatter", "all_to_all", "broadcast", "scatter", "barrier", and the point-to-point
/// "send" and "recv" (bytes sent, bytes received). Emulated collectives count
/// under their logical name (a reduce_scatter built from all-to-all is one "reduce_scatter").
/// Bytes are the bytes of the tensor this rank contributes (the input of the collective).
/// e.g. `{ hp::CommDebugMode comm; y = mlp(x); EXPECT_EQ(comm.get_comm_count("all_reduce"), 1); }`
///
/// With `trace` it also tracks the module path (runtime/call_context.h): each collective counts
/// for every module enclosing it, per phase (forward, backward), and every op on DTensors is
/// recorded once per module, op and input specs, with its output spec and the redistributions
/// it needed (bytes per rank), e.g.
/// "layers.0.mlp.down_proj: aten::mm(self: f32[8,16] S(1), mat2: f32[16,32] S(0)) -> f32[8,32] P(sum)".
/// `HP_LOG=dtensor` in the environment prints every such line to stderr as it is first seen.
class CommDebugMode {
 public:
  explicit CommDebugMode(bool trace = false);
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  int64_t get_total_counts() const;
  int64_t get_comm_count(const std::string& kind) const;
  std::map<std::string, int64_t> get_comm_counts() const;
  int64_t get_total_bytes() const;
  int64_t get_comm_bytes(const std::string& kind) const;
  std::map<std::string, int64_t> get_comm_bytes() const;
  /// Forget what was counted so far.
  void reset();
  /// e.g. "all_reduce: 2 (8.0 KiB), reduce_scatter: 1 (4.0 KiB)".
  std::string summary() const;

  struct Stats {
    int64_t count = 0;
    int64_t bytes = 0;       ///< this rank's input, as everywhere in CommDebugMode
    /// The whole tensor the collective assembles or reduces (nccl-tests' "size"): an all_gather's
    /// output, the input of the others. Kept per group only (get_comm_group_stats).
    int64_t full_bytes = 0;
  };
  /// Group (its global ranks, in group order) -> phase ("forward"/"backward", from autograd's
  /// current graph task) -> kind -> count and bytes. Counted always, tracing or not; a mesh's
  /// dimension is the group `mesh.get_group(dim).ranks()`.
  /// e.g. `comm.get_comm_group_stats()[mesh.get_group("tp").ranks()]["forward"]["all_reduce"].count`
  std::map<std::vector<int64_t>, std::map<std::string, std::map<std::string, Stats>>> get_comm_group_stats() const;
  /// With tracing: module FQN ("" for the root) -> phase ("forward"/"backward") -> kind ->
  /// count and bytes, inclusive of submodules (PyTorch's get_comm_module_counts). A backward
  /// collective counts for the module whose forward recorded the autograd function that issued it;
  /// one issued by an op's input redistribution in backward counts for the root only.
  std::map<std::string, std::map<std::string, std::map<std::string, Stats>>> get_comm_module_stats() const;
  /// With tracing: the op lines, in first-seen order, each prefixed with its module ("<root>: ").
  std::vector<std::string> get_op_trace() const;
  /// With tracing: a table of every module (indented by depth, in call order) with its
  /// collectives, count and bytes per phase; `noise_level` 1 adds each module's op lines.
  std::string generate_comm_debug_tracing_table(int noise_level = 0) const;

  /// Called by the collectives: `bytes` this rank contributes, `full_bytes` as in Stats.
  static void record(const char* kind, int64_t bytes, const Group& group, int64_t full_bytes);
  /// Whether op lines are wanted now (a tracing mode is alive, or HP_LOG=dtensor): one relaxed
  /// load, as every DTensor op asks.
  static bool op_tracing() { return detail::g_op_tracing.load(std::memory_order_relaxed) != 0; }
  /// Records one op line for the current module (deduplicated per mode).
  static void record_op(const std::string& line);

 private:
  std::map<std::string, int64_t> counts_;
  std::map<std::string, int64_t> bytes_;
  std::map<std::vector<int64_t>, std::map<std::string, std::map<std::string, Stats>>> groups_;
  bool trace_ = false;
  std::unique_ptr<call_context::Tracking> tracking_;
  std::vector<std::string> module_order_;
  std::map<std::string, std::map<std::string, std::map<std::string, Stats>>> modules_;
  std::map<std::string, std::vector<std::string>> module_ops_;
  std::set<std::pair<std::string, std::string>> seen_ops_;
  std::vector<std::string> op_trace_;
};

}  // namespace hyper_parallel
