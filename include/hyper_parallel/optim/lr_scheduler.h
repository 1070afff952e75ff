#pragma once
// Learning-rate schedules over a torch::optim optimizer, as torchtitan schedules its runs: a factor
// of each parameter group's base learning rate per step (PyTorch's LambdaLR), resumable from the
// step counter alone, so a run resumed at any layout continues the same schedule.
//   auto sched = hp::linear_warmup_stable_decay(opt, {/*training_steps=*/1000, /*warmup_steps=*/100});
//   for (...) { loss.backward(); opt.step(); sched.step(); }
#include <torch/optim/optimizer.h>

#include <c10/util/Optional.h>

#include <functional>
#include <string>
#include <vector>

namespace hyper_parallel {

/// A factor of the base learning rates per step: step s trains with base_lr · factor(s). Built, it
/// sets step 0's rates; step() (after the optimizer's) moves to the next step's.
class LRScheduler {
 public:
  /// `factor` of the step index; the groups' rates when built are their base rates (so build one
  /// schedule per optimizer, before it changes them).
  LRScheduler(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);
  /// Moves to the next step and sets its rates.
  void step();
  /// The step the rates now set are for (0 when built).
  int64_t last_step() const { return step_; }
  /// Resumes at step `s` (what last_step() said when the run was saved): sets that step's rates.
  void load_state(int64_t s);
  /// The rates now set, one per parameter group.
  std::vector<double> get_last_lr() const;
  const std::vector<double>& base_lrs() const { return base_; }

 private:
  void apply();
  torch::optim::Optimizer* optimizer_;
  std::function<double(int64_t)> factor_;
  std::vector<double> base_;
  int64_t step_ = 0;
};

/// torchtitan's linear_warmup_stable_decay: warmup_steps of factor (s + 1) / (warmup_steps + 1),
/// then 1 until the decay, which takes decay_ratio · training_steps steps (rounded; all the steps
/// after the warmup when not given) and falls as `decay_type` says ("linear": 1 - p, "sqrt":
/// 1 - sqrt(p), "cosine": (1 + cos(pi p)) / 2, p = (s + 1 - decay start) / (decay steps + 1)) from 1
/// to lr_min (a factor of the base rate); from step training_steps on, p = 1 (lr_min), as
/// torchtitan clamps the step.
struct WarmupStableDecayOptions {
  int64_t training_steps = 0;
  int64_t warmup_steps = 0;
  c10::optional<double> decay_ratio;
  std::string decay_type = "linear";
  double lr_min = 0.0;
};

/// The schedule's factor at step `s` (the formula above); c10::ValueError for options it cannot
/// follow (training_steps < 1, negative warmup, a decay ratio outside [0, 1], warmup and decay
/// longer than the run, an unknown decay_type, lr_min outside [0, 1]).
double warmup_stable_decay_factor(const WarmupStableDecayOptions& options, int64_t s);

/// An LRScheduler of that factor (options checked before the optimizer is touched).
LRScheduler linear_warmup_stable_decay(torch::optim::Optimizer& optimizer, const WarmupStableDecayOptions& options);

/// The base rates throughout.
LRScheduler constant_lr(torch::optim::Optimizer& optimizer);

}  // namespace hyper_parallel
