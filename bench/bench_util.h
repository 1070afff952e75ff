#pragma once
// Timing and JSON output shared by the benchmarks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hyper_parallel {
namespace qwen3 {
struct Config;
}
}  // namespace hyper_parallel
namespace qwen3 = hyper_parallel::qwen3;

namespace hp_bench {

/// Median over `reps` repetitions of the mean time per call of `fn`, in microseconds.
inline double time_us(const std::function<void()>& fn, int iters, int reps = 11) {
  for (int i = 0; i < iters / 4 + 1; ++i) fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Baseline and candidate timed in alternating repetitions (drift hits both alike):
/// {baseline_us, candidate_us}. `between` runs before each timed repetition (e.g. a barrier).
inline std::pair<double, double> time_pair(const std::function<void()>& base, const std::function<void()>& cand, int iters,
                                           int reps = 11, const std::function<void()>& between = nullptr) {
  for (int i = 0; i < iters / 4 + 1; ++i) {
    base();
    cand();
  }
  std::vector<double> tb, tc;
  for (int r = 0; r < reps; ++r) {
    if (between) between();
    tb.push_back(time_us(base, iters, 1));
    if (between) between();
    tc.push_back(time_us(cand, iters, 1));
  }
  std::sort(tb.begin(), tb.end());
  std::sort(tc.begin(), tc.end());
  return {tb[tb.size() / 2], tc[tc.size() / 2]};
}

/// One JSON line: {"name": ..., <params>, "value": ..., "unit": ..., ["baseline", "ratio"]}.
/// `params` is a list of `"key": value` fragments, each followed by ", ".
inline void emit(const std::string& name, const std::string& params, double value, const char* unit, double baseline = -1,
                 double ratio = -1) {
  std::printf("{\"name\": \"%s\", %s\"value\": %.4g, \"unit\": \"%s\"", name.c_str(), params.c_str(), value, unit);
  if (baseline >= 0) std::printf(", \"baseline\": %.4g, \"ratio\": %.4g", baseline, ratio);
  std::printf("}\n");
  std::fflush(stdout);
}

/// The tensor-parallel benchmarks, run on every rank of a job started by hprun; rank 0 prints.
void run_tp_benchmarks(const std::string& filter);
/// Collective latencies per size on the world group (rank 0 prints).
void run_collective_benchmarks(const std::string& filter);
/// fully_shard against DDP-style replication (fsdp_benchmarks.cpp), on every rank of a 2- or 4-rank job.
void run_fsdp_benchmarks(const std::string& filter);
/// Causal attention steps at cp = world size in each mode and the cp gradient reduction
/// (cp_benchmarks.cpp), on every rank; rank 0 prints one "cp_step" line per mode.
void run_cp_benchmarks(const std::string& filter);
/// The same attention step on the whole sequence in this process: milliseconds, and its
/// allocation peak in `peak_bytes`.
double single_attention_step(int threads, int64_t& peak_bytes);
/// The Gated DeltaNet step of run_cp_benchmarks on the whole sequence in this process, alike.
double single_gdn_step(int threads, int64_t& peak_bytes);
/// The Qwen3 decoder layer the layer benchmarks run: hidden 256, intermediate 768, 8 heads, 4 kv
/// heads, head_dim 32, one layer (tp_benchmarks.cpp).
qwen3::Config decoder_layer_config();
/// Our side of bench/vs_pytorch.py (vs_pytorch_cases.cpp), on every rank of a job started by hprun.
void run_vs_pytorch_cases();

}  // namespace hp_bench
