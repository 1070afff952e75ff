#include <hyper_parallel/optim/lr_scheduler.h>

#include <hyper_parallel/runtime/errors.h>

#include <cmath>

namespace hyper_parallel {

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor, int64_t last_step,
                         std::string schedule)
    : optimizer_(&optimizer), factor_(std::move(factor)), step_(last_step), schedule_(std::move(schedule)) {
  HP_CHECK_T(c10::ValueError, last_step >= 0, "hyper_parallel::LRScheduler: last_step must be >= 0, got ", last_step);
  for (const auto& group : optimizer.param_groups()) base_.push_back(group.options().get_lr());
  apply("LRScheduler");
}

void LRScheduler::step() {
  check_groups("LRScheduler::step");
  ++step_;
  apply("LRScheduler::step");
}

void LRScheduler::load_state(int64_t s) { load_state(s, base_); }

void LRScheduler::load_state(int64_t s, std::vector<double> base_lrs) {
  HP_CHECK_T(c10::ValueError, s >= 0, "hyper_parallel::LRScheduler::load_state: the step must be >= 0, got ", s);
  HP_CHECK_T(c10::ValueError, base_lrs.size() == optimizer_->param_groups().size(), "hyper_parallel::LRScheduler::load_state: ",
             base_lrs.size(), " base rates for ", optimizer_->param_groups().size(), " parameter groups");
  step_ = s;
  base_ = std::move(base_lrs);
  apply("LRScheduler::load_state");
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (const auto& group : optimizer_->param_groups()) out.push_back(group.options().get_lr());
  return out;
}

void LRScheduler::check_groups(const char* caller) const {
  const size_t now = optimizer_->param_groups().size();
  HP_CHECK_T(c10::ValueError, now == base_.size(), "hyper_parallel::", caller, ": the optimizer has ", now, " parameter groups, the ",
             "schedule was built for ", base_.size(), " (add_param_group after the scheduler was built); rebuild the scheduler ",
             "so that every group has its base rate");
}

void LRScheduler::apply(const char* caller) {
  check_groups(caller);
  const double f = factor_(step_);
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(base_[g] * f);
}

namespace {

struct Phases {
  int64_t warmup, stable, decay;
};

Phases phases_of(const WarmupStableDecayOptions& o) {
  HP_CHECK_T(c10::ValueError, o.training_steps >= 1, "hyper_parallel::linear_warmup_stable_decay: ", "training_steps must be >= 1, got ", o.training_steps);
  HP_CHECK_T(c10::ValueError, o.warmup_steps >= 0, "hyper_parallel::linear_warmup_stable_decay: ", "warmup_steps must be >= 0, got ", o.warmup_steps);
  HP_CHECK_T(c10::ValueError, !o.decay_ratio || (*o.decay_ratio >= 0 && *o.decay_ratio <= 1), "hyper_parallel::linear_warmup_stable_decay: ", "decay_ratio must be in [0, 1], got ",
             o.decay_ratio ? *o.decay_ratio : 0.0);
  HP_CHECK_T(c10::ValueError, o.decay_type == "linear" || o.decay_type == "sqrt" || o.decay_type == "cosine", "hyper_parallel::linear_warmup_stable_decay: ", "decay_type is linear, ",
             "sqrt or cosine, got '", o.decay_type, "'");
  HP_CHECK_T(c10::ValueError, o.lr_min >= 0 && o.lr_min <= 1, "hyper_parallel::linear_warmup_stable_decay: ", "lr_min (a factor of the base rate) must be in [0, 1], got ", o.lr_min);
  HP_CHECK_T(c10::ValueError, o.warmup_steps <= o.training_steps, "hyper_parallel::linear_warmup_stable_decay: ", o.warmup_steps,
             " warmup steps exceed the ", o.training_steps, " training steps");
  Phases p;
  p.warmup = o.warmup_steps;
  p.decay = o.decay_ratio ? static_cast<int64_t>(std::llround(static_cast<double>(o.training_steps) * *o.decay_ratio))
                          : o.training_steps - o.warmup_steps;
  p.stable = o.training_steps - p.warmup - p.decay;
  HP_CHECK_T(c10::ValueError, p.decay >= 0 && p.stable >= 0, "hyper_parallel::linear_warmup_stable_decay: ", o.warmup_steps, " warmup and ", p.decay, " decay steps exceed the ",
             o.training_steps, " training steps");
  return p;
}

}  // namespace

double warmup_stable_decay_factor(const WarmupStableDecayOptions& options, int64_t s) {
  const Phases p = phases_of(options);
  const int64_t decay_start = p.warmup + p.stable;
  s = std::min(s, decay_start + p.decay);  // past the run: the last step's factor
  if (s < p.warmup) return static_cast<double>(s + 1) / static_cast<double>(p.warmup + 1);
  if (s < decay_start || p.decay == 0) return 1.0;
  const double progress = static_cast<double>(s + 1 - decay_start) / static_cast<double>(p.decay + 1);
  double f = 0;
  if (options.decay_type == "linear") f = 1 - progress;
  else if (options.decay_type == "sqrt") f = 1 - std::sqrt(progress);
  else f = 0.5 * (1 + std::cos(M_PI * progress));
  return options.lr_min + (1 - options.lr_min) * f;
}

LRScheduler linear_warmup_stable_decay(torch::optim::Optimizer& optimizer, const WarmupStableDecayOptions& options, int64_t last_step) {
  phases_of(options);
  const std::string schedule = c10::str("linear_warmup_stable_decay training_steps=", options.training_steps, " warmup_steps=",
                                        options.warmup_steps, " decay_ratio=", options.decay_ratio ? c10::str(*options.decay_ratio) : "none",
                                        " decay_type=", options.decay_type, " lr_min=", options.lr_min);
  return LRScheduler(optimizer, [options](int64_t s) { return warmup_stable_decay_factor(options, s); }, last_step, schedule);
}

LRScheduler constant_lr(torch::optim::Optimizer& optimizer, int64_t last_step) {
  return LRScheduler(optimizer, [](int64_t) { return 1.0; }, last_step, "constant_lr");
}

}  // namespace hyper_parallel
