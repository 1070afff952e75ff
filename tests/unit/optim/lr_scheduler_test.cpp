// torchtitan's linear_warmup_stable_decay against values worked out by hand from its formula
// (warmup (s + 1) / (w + 1); decay progress p = (s + 1 - start) / (d + 1); linear 1 - p, sqrt
// 1 - sqrt(p), cosine (1 + cos(pi p)) / 2, scaled into [lr_min, 1]), set on every parameter group
// of a real AdamW from its own base rate, and resumed from the step counter alone.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include <cmath>
#include <map>

#include <hyper_parallel/optim/lr_scheduler.h>

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_optim_lr_scheduler_test {

TEST(LRScheduler, WarmupStableDecayFactorsAreTheFormulas) {
  // 10 steps: 3 of warmup, decay_ratio 0.3 (3 steps: 7, 8, 9), the stable steps 3..6 between.
  hp::WarmupStableDecayOptions o;
  o.training_steps = 10;
  o.warmup_steps = 3;
  o.decay_ratio = 0.3;
  const std::vector<double> warmup_stable{0.25, 0.5, 0.75, 1, 1, 1, 1};
  for (size_t s = 0; s < warmup_stable.size(); ++s) EXPECT_DOUBLE_EQ(hp::warmup_stable_decay_factor(o, static_cast<int64_t>(s)), warmup_stable[s]) << s;
  // Decay progress 1/4, 2/4, 3/4 at steps 7, 8, 9; from step 10 (past the run) progress 1: lr_min.
  const std::map<std::string, std::vector<double>> decay{
      {"linear", {0.75, 0.5, 0.25, 0, 0}},
      {"sqrt", {0.5, 1 - std::sqrt(0.5), 1 - std::sqrt(0.75), 0, 0}},
      {"cosine", {0.5 + 0.5 * std::sqrt(0.5), 0.5, 0.5 - 0.5 * std::sqrt(0.5), 0, 0}}};
  for (const auto& [type, want] : decay)
    for (double lr_min : {0.0, 0.1}) {
      o.decay_type = type;
      o.lr_min = lr_min;
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(hp::warmup_stable_decay_factor(o, 7 + static_cast<int64_t>(i)), lr_min + (1 - lr_min) * want[i], 1e-15)
            << type << " lr_min " << lr_min << " step " << 7 + i;
    }
  // Without a decay ratio every step after the warmup decays: 10 - 3 = 7 steps, p = (s - 2) / 8.
  hp::WarmupStableDecayOptions all;
  all.training_steps = 10;
  all.warmup_steps = 3;
  EXPECT_DOUBLE_EQ(hp::warmup_stable_decay_factor(all, 3), 1 - 1.0 / 8);
  EXPECT_DOUBLE_EQ(hp::warmup_stable_decay_factor(all, 9), 1 - 7.0 / 8);
  // No warmup: step 0 starts stable (a decay ratio of 0: constant after the warmup).
  hp::WarmupStableDecayOptions flat;
  flat.training_steps = 5;
  flat.decay_ratio = 0.0;
  EXPECT_DOUBLE_EQ(hp::warmup_stable_decay_factor(flat, 0), 1.0);
  EXPECT_DOUBLE_EQ(hp::warmup_stable_decay_factor(flat, 4), 1.0);
}

TEST(LRScheduler, EveryGroupFollowsItsBaseRateAndResumesFromTheStep) {
  const at::Tensor w = at::ones({4, 4}, at::requires_grad()), b = at::zeros({4}, at::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{w}, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-3).weight_decay(0)));
  torch::optim::AdamW opt(std::move(groups));
  hp::WarmupStableDecayOptions o;
  o.training_steps = 8;
  o.warmup_steps = 2;
  o.decay_type = "cosine";
  o.lr_min = 0.1;
  auto sched = hp::linear_warmup_stable_decay(opt, o);
  std::vector<std::vector<double>> seen;
  for (int64_t s = 0; s < 8; ++s) {
    EXPECT_EQ(sched.last_step(), s);
    const double f = hp::warmup_stable_decay_factor(o, s);
    EXPECT_EQ(sched.get_last_lr(), (std::vector<double>{1e-2 * f, 3e-3 * f})) << "step " << s;
    seen.push_back(sched.get_last_lr());
    sched.step();
  }
  // A new optimizer and schedule resumed at step 5 set step 5's rates, then the same ones on.
  torch::optim::AdamW again({w}, torch::optim::AdamWOptions(1e-2));
  auto resumed = hp::linear_warmup_stable_decay(again, o);
  resumed.load_state(5);
  for (size_t s = 5; s < 8; ++s, resumed.step()) EXPECT_EQ(resumed.get_last_lr()[0], seen[s][0]) << "step " << s;
  torch::optim::AdamW plain({w}, torch::optim::AdamWOptions(1e-2));
  auto constant = hp::constant_lr(plain);
  constant.step();
  EXPECT_EQ(constant.get_last_lr()[0], 1e-2);
}

// Built at a step, a scheduler sets that step's rates at once; a group added after it was built
// has no base rate, and step() says so instead of scheduling it from a rate read out of bounds.
TEST(LRScheduler, BuiltAtAStepAndRefusingAGroupAddedAfter) {
  hp::WarmupStableDecayOptions o;
  o.training_steps = 10;
  o.warmup_steps = 4;
  torch::optim::AdamW opt({torch::ones({2}, torch::requires_grad())}, torch::optim::AdamWOptions(1.0));
  auto sched = hp::linear_warmup_stable_decay(opt, o, /*last_step=*/3);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.8);  // (3 + 1) / (4 + 1)
  EXPECT_EQ(sched.last_step(), 3);
  EXPECT_NE(sched.schedule().find("linear_warmup_stable_decay training_steps=10 warmup_steps=4"), std::string::npos) << sched.schedule();
  opt.add_param_group(torch::optim::OptimizerParamGroup({torch::ones({2}, torch::requires_grad())},
                                                        std::make_unique<torch::optim::AdamWOptions>(0.5)));
  try {
    sched.step();
    ADD_FAILURE() << "stepped a schedule over a group it has no base rate for";
  } catch (const c10::ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("hyper_parallel::LRScheduler::step: the optimizer has 2 parameter groups, the schedule was built for 1"), std::string::npos) << m;
    EXPECT_NE(m.find("add_param_group"), std::string::npos) << m;
    EXPECT_NE(m.find("rebuild the scheduler"), std::string::npos) << m;
  }
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), 0.5) << "the refused step changed a rate";
  auto rebuilt = hp::linear_warmup_stable_decay(opt, o, 3);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), 0.5 * 0.8);
}

TEST(LRScheduler, OptionsItCannotFollowAreRefusedByName) {
  auto refused = [](hp::WarmupStableDecayOptions o, const std::string& says) {
    try {
      hp::warmup_stable_decay_factor(o, 0);
      ADD_FAILURE() << says << ": no error";
    } catch (const c10::ValueError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("hyper_parallel::linear_warmup_stable_decay: ", 0), 0u) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
    }
  };
  hp::WarmupStableDecayOptions o;
  o.training_steps = 10;
  refused({}, "training_steps must be >= 1");
  auto bad = o;
  bad.decay_type = "exp";
  refused(bad, "decay_type is linear, sqrt or cosine, got 'exp'");
  bad = o;
  bad.warmup_steps = 8;
  bad.decay_ratio = 0.5;
  refused(bad, "8 warmup and 5 decay steps exceed the 10 training steps");
  bad = o;
  bad.warmup_steps = 11;
  refused(bad, "11 warmup steps exceed the 10 training steps");
  bad = o;
  bad.lr_min = 2;
  refused(bad, "lr_min (a factor of the base rate) must be in [0, 1]");
}

}  // namespace t_unit_optim_lr_scheduler_test
