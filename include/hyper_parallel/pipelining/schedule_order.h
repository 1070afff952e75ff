#pragma once
// Pipeline schedules as data: for each rank of the pipeline group, the order in which it runs
// the forward and backward of each microbatch on each of its stages (PyTorch's per-rank action
// lists, HyperParallel's MetaStep lists). Rank r holds stages r, r + p, ..., r + (v - 1) p
// (PyTorch's "loop" placement of v virtual stages per rank). A list can be simulated with unit
// costs, in one process and without a model, to read off its bubble and its memory.
#include <cstdint>
#include <string>
#include <vector>

namespace hyper_parallel {

/// The schedules, by PyTorch's class names.
enum class ScheduleKind {
  GPipe,           ///< every forward, then every backward (m microbatches in flight)
  OneFOneB,        ///< Schedule1F1B: at most p - r microbatches in flight on rank r
  Interleaved1F1B  ///< ScheduleInterleaved1F1B: v virtual stages per rank, a bubble v times smaller
};

/// "gpipe", "1f1b" or "interleaved_1f1b" (also PyTorch's "GPipe", "1F1B", "Interleaved1F1B");
/// c10::ValueError naming the known ones otherwise.
ScheduleKind schedule_kind(const std::string& name);
/// The lower-case name schedule_kind() reads.
std::string schedule_name(ScheduleKind kind);

/// One computation of a schedule: the forward or backward of `microbatch` on stage `stage_index`
/// (a global stage index, 0 .. p v - 1).
struct PipelineAction {
  enum class Kind { forward, backward };
  int64_t stage_index = 0;
  Kind kind = Kind::forward;
  int64_t microbatch = 0;
  bool operator==(const PipelineAction& o) const {
    return stage_index == o.stage_index && kind == o.kind && microbatch == o.microbatch;
  }
};

/// For each of `num_ranks` ranks, the actions it runs, in order. `virtual_stages` > 1 only with
/// Interleaved1F1B, which runs the microbatches in r = max(1, m / p) rounds of m / r (PyTorch's
/// rule: m must be divisible by r, so any m <= p, or m a multiple of p, works); c10::ValueError
/// otherwise, and for p, m or v < 1. e.g. `pipeline_order(ScheduleKind::OneFOneB, 4, 8)[0]` starts F0 F1 F2 F3 B0.
std::vector<std::vector<PipelineAction>> pipeline_order(ScheduleKind kind, int64_t num_ranks, int64_t num_microbatches,
                                                        int64_t virtual_stages = 1);

/// What running an order takes when each forward costs `forward_cost` and each backward
/// `backward_cost` (per stage; a virtual stage is 1 / v of a rank's layers, so pass costs / v to
/// compare schedules at equal work) and transfers are free: each action starts when its rank is
/// free and its input is there (the previous stage's forward, the next stage's backward).
struct ScheduleTimeline {
  double makespan = 0;
  std::vector<double> busy;           ///< per rank
  std::vector<double> idle_fraction;  ///< per rank: 1 - busy / makespan
  /// Per rank: the most microbatches whose forward ran and whose backward had not (summed over
  /// the rank's stages): the activations it holds at its peak.
  std::vector<int64_t> max_in_flight;
};

/// Simulates `order` (from pipeline_order). c10::ValueError when it deadlocks (an action waits
/// for one that its rank or a peer can never reach), naming the first stuck action of each rank.
ScheduleTimeline simulate_schedule(const std::vector<std::vector<PipelineAction>>& order, int64_t num_microbatches,
                                   int64_t virtual_stages = 1, double forward_cost = 1.0, double backward_cost = 1.0);

/// The published bubble fraction: (p - 1) / (m + p - 1) for GPipe and 1F1B (GPipe's paper,
/// Megatron-LM), (p - 1) / (v m + p - 1) for interleaved 1F1B (Narayanan et al. 2021).
double bubble_fraction(ScheduleKind kind, int64_t num_ranks, int64_t num_microbatches, int64_t virtual_stages = 1);

}  // namespace hyper_parallel
