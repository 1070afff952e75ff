#pragma once
// Pipeline schedules (PyTorch's ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B): one
// training step over microbatches on this rank's stages, in the order pipelining/schedule_order.h
// gives. The loss of a step is the mean over microbatches of each microbatch's loss, and every
// microbatch's backward is scaled by 1/m (PyTorch's scale_grads), so with equal microbatches of a
// mean loss the gradients are those of the whole batch in one process.
#include <ATen/core/Tensor.h>

#include <hyper_parallel/pipelining/schedule_order.h>
#include <hyper_parallel/pipelining/stage.h>

#include <functional>
#include <vector>

namespace hyper_parallel {

/// The loss of one microbatch: the last stage's output and the microbatch's target.
using PipelineLossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

/// Runs steps of a schedule over this rank's stages.
class PipelineSchedule {
 public:
  /// `stages`: this rank's stages (one, or v for interleaved_1f1b, in stage order); they must
  /// outlive the schedule. `n_microbatches` splits the batch dim (0) of the inputs and targets
  /// into equal microbatches.
  PipelineSchedule(std::vector<PipelineStage*> stages, int64_t n_microbatches, PipelineLossFn loss_fn, ScheduleKind kind);
  virtual ~PipelineSchedule() = default;

  /// One training step: the rank holding stage 0 passes the batch's `input` [B, ...], the rank
  /// holding the last stage its `target` [B, ...] (others pass undefined tensors). Gradients
  /// accumulate into the parameters' .grad (zero them between steps as usual). Returns, on the
  /// rank of the last stage, the step's loss (the mean of the microbatches' losses, detached),
  /// and fills `losses` with each microbatch's; an undefined tensor elsewhere. B must be divisible
  /// by the number of microbatches (c10::ValueError otherwise, on the ranks that hold B).
  /// e.g. `at::Tensor loss = schedule.step(pp_rank == 0 ? ids : at::Tensor(), last ? targets : at::Tensor());`
  at::Tensor step(const at::Tensor& input, const at::Tensor& target, std::vector<at::Tensor>* losses = nullptr);

  ScheduleKind kind() const { return kind_; }
  int64_t n_microbatches() const { return n_microbatches_; }
  /// This rank's actions per step.
  const std::vector<PipelineAction>& actions() const { return actions_; }
  /// The most microbatches this rank held activations of at once in the last step (all stages).
  int64_t max_in_flight() const { return max_in_flight_; }

 private:
  std::vector<PipelineStage*> stages_;
  int64_t n_microbatches_;
  PipelineLossFn loss_fn_;
  ScheduleKind kind_;
  std::vector<PipelineAction> actions_;
  int64_t max_in_flight_ = 0;
};

/// Every forward, then every backward: m microbatches of activations at the peak.
class ScheduleGPipe : public PipelineSchedule {
 public:
  ScheduleGPipe(PipelineStage& stage, int64_t n_microbatches, PipelineLossFn loss_fn)
      : PipelineSchedule({&stage}, n_microbatches, std::move(loss_fn), ScheduleKind::GPipe) {}
};

/// One forward, one backward after a warm-up: at most p microbatches of activations on stage 0.
class Schedule1F1B : public PipelineSchedule {
 public:
  Schedule1F1B(PipelineStage& stage, int64_t n_microbatches, PipelineLossFn loss_fn)
      : PipelineSchedule({&stage}, n_microbatches, std::move(loss_fn), ScheduleKind::OneFOneB) {}
};

/// v stages per rank (stage r, r + p, ...), a bubble of (p - 1) / (v m + p - 1).
class ScheduleInterleaved1F1B : public PipelineSchedule {
 public:
  ScheduleInterleaved1F1B(std::vector<PipelineStage*> stages, int64_t n_microbatches, PipelineLossFn loss_fn)
      : PipelineSchedule(std::move(stages), n_microbatches, std::move(loss_fn), ScheduleKind::Interleaved1F1B) {}
};

}  // namespace hyper_parallel
