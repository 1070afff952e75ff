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
/// sets step `last_step`'s rates (0 for a new run); step() (after the optimizer's) moves to the next.
///
/// The base rates are the groups' rates when it is built: a fresh optimizer's, or after
/// load_train_state the run's base rates, which a train state saves and restores in place of the
/// scheduled ones (torch's initial_lr). So a scheduler built after the load and given the saved
/// step sets base · factor(step) at once, the rate the uninterrupted run uses, e.g.
/// `hp::load_train_state(dir, st); auto sched = hp::linear_warmup_stable_decay(opt, o, st.step);`
class LRScheduler {
 public:
  /// `factor` of the step index; `schedule` names it with its options (what a train state keeps,
  /// to refuse resuming under another schedule by mistake).
  LRScheduler(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor, int64_t last_step = 0,
              std::string schedule = "custom");
  /// Moves to the next step and sets its rates. c10::ValueError when the optimizer's parameter
  /// groups are no longer the ones it was built for (add_param_group): rebuild the scheduler.
  void step();
  /// The step the rates now set are for.
  int64_t last_step() const { return step_; }
  /// Resumes at step `s` (what last_step() said when the run was saved): sets that step's rates.
  void load_state(int64_t s);
  /// The same with the run's base rates (load_train_state gives the saved ones).
  void load_state(int64_t s, std::vector<double> base_lrs);
  /// The rates now set, one per parameter group.
  std::vector<double> get_last_lr() const;
  const std::vector<double>& base_lrs() const { return base_; }
  /// The schedule and its options, e.g. "linear_warmup_stable_decay training_steps=1000 ...".
  const std::string& schedule() const { return schedule_; }
  /// c10::ValueError (as hyper_parallel::<caller>) when the optimizer's groups changed since it was built.
  void check_groups(const char* caller) const;

 private:
  void apply(const char* caller);
  torch::optim::Optimizer* optimizer_;
  std::function<double(int64_t)> factor_;
  std::vector<double> base_;
  int64_t step_ = 0;
  std::string schedule_;
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

/// An LRScheduler of that factor (options checked before the optimizer is touched), at `last_step`.
LRScheduler linear_warmup_stable_decay(torch::optim::Optimizer& optimizer, const WarmupStableDecayOptions& options,
                                       int64_t last_step = 0);

/// The base rates throughout.
LRScheduler constant_lr(torch::optim::Optimizer& optimizer, int64_t last_step = 0);

}  // namespace hyper_parallel
