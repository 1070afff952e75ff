#pragma once
// Counting collectives, as PyTorch's CommDebugMode does.
#include <cstdint>
#include <map>
#include <string>

namespace hyper_parallel {

/// RAII scope that counts every collective this process issues while it is alive (on any
/// thread, so autograd's backward is counted too). Kinds: "all_gather", "all_reduce",
/// "reduce_scatter", "all_to_all", "broadcast", "scatter", "barrier". Emulated collectives count
/// under their logical name (a reduce_scatter built from all-to-all is one "reduce_scatter").
/// Bytes are the bytes of the tensor this rank contributes (the input of the collective).
/// e.g. `{ hp::CommDebugMode comm; y = mlp(x); EXPECT_EQ(comm.get_comm_count("all_reduce"), 1); }`
class CommDebugMode {
 public:
  CommDebugMode();
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

  /// Called by the collectives.
  static void record(const char* kind, int64_t bytes);

 private:
  std::map<std::string, int64_t> counts_;
  std::map<std::string, int64_t> bytes_;
};

}  // namespace hyper_parallel
