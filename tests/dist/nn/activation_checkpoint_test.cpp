// Activation checkpointing composed with tensor parallelism, sequence parallelism, fully_shard
// and dropout: gradients equal those without checkpointing bitwise, and the collectives are those
// without plus the recomputed forwards' tensor-parallel ones.
#include <gtest/gtest.h>

#include "training_util.h"

using namespace training_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_nn_activation_checkpoint_test {
namespace {

struct TrainSetup {
  hp::ActivationCheckpointPolicy policy = hp::ActivationCheckpointPolicy::none();
  bool fsdp = false;  // dp x tp = 2 x 2, else tp over the world
  double dropout = 0.0;
};

struct TrainRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // local pieces, by name, after the last step
  std::map<std::vector<int64_t>, std::map<std::string, std::map<std::string, hp::CommDebugMode::Stats>>> comm;  // last step
  std::map<std::string, std::map<std::string, std::map<std::string, hp::CommDebugMode::Stats>>> modules;  // last step, traced
  std::vector<int64_t> dp_group;  // its ranks, with fully_shard
};

// Two training steps (forward, backward, SGD) from the same seed.
TrainRun train(const TrainSetup& s, bool trace = false) {
  const int64_t world = hp::get_world_size();
  hp::DeviceMesh mesh = s.fsdp ? hp::init_device_mesh("cpu", {2, world / 2}, {"dp", "tp"})
                               : hp::init_device_mesh("cpu", {world}, {"tp"});
  hp_test::manual_seed(11);
  qwen3::CausalLM model(small_config(s.dropout));
  model->train();
  const auto wrapped = hp::apply_activation_checkpointing(*model, s.policy);
  if (s.policy.mode != hp::ActivationCheckpointPolicy::Mode::None)
    EXPECT_EQ(wrapped.size(), static_cast<size_t>(2 / s.policy.every));
  qwen3::parallelize_qwen3_tp(*model, mesh["tp"], /*sequence_parallel=*/true);
  int64_t dp_rank = 0, dp = 1;
  if (s.fsdp) {
    for (const auto& layer : *model->layers) hp::fully_shard(*layer, mesh["dp"]);
    hp::fully_shard(*model, mesh["dp"]);
    dp_rank = mesh["dp"].get_local_rank();
    dp = 2;
  }
  TrainRun run;
  if (s.fsdp) run.dp_group = mesh["dp"].get_group().ranks();
  torch::optim::SGD opt(hp::unique_parameters(*model), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 2; ++step) {
    const at::Tensor ids = token_batch(64, 4, 8, 40 + step);
    hp::CommDebugMode comm(trace);
    at::Tensor loss = qwen3::causal_lm_loss(model(dp_rows(ids.narrow(1, 0, 8), dp_rank, dp)), dp_rows(ids.narrow(1, 1, 8), dp_rank, dp));
    opt.zero_grad();
    loss.backward();
    run.losses.push_back(loss.item<double>());
    run.comm = comm.get_comm_group_stats();
    if (trace) run.modules = comm.get_comm_module_stats();
    if (step == 1)
      for (const auto& p : model->named_parameters()) run.grads.emplace_back(p.key(), hp::local_tensor(p.value().grad()).clone());
    opt.step();
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << "step " << step;
  }
  return run;
}

void expect_bitwise(const TrainRun& a, const TrainRun& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t k = 0; k < a.grads.size(); ++k) {
    EXPECT_EQ(a.grads[k].first, b.grads[k].first);
    EXPECT_TRUE(at::equal(a.grads[k].second, b.grads[k].second)) << a.grads[k].first << " max diff "
                                                                 << (a.grads[k].second - b.grads[k].second).abs().max().item<float>();
  }
}

// Collectives with checkpointing: the same in forward; in backward those without plus, per
// recomputed block, its forward's tensor-parallel collectives (counted per module by tracing).
void expect_comm(const TrainRun& with, const TrainRun& without, const std::vector<std::string>& blocks, bool fsdp) {
  for (const auto& [group, phases] : without.comm) {
    for (const auto& [kind, st] : phases.at("forward")) {
      EXPECT_EQ(with.comm.at(group).at("forward").at(kind).count, st.count) << kind;
      EXPECT_EQ(with.comm.at(group).at("forward").at(kind).bytes, st.bytes) << kind;
    }
  }
  // kind -> count recomputed: a block's forward collectives, except fully_shard's all-gather,
  // which the recompute finds done (the pre-backward gather serves it).
  std::map<std::string, int64_t> extra;
  for (const auto& b : blocks) {
    for (const auto& [kind, st] : without.modules.at(b).at("forward")) extra[kind] += st.count;
    if (fsdp) --extra["all_gather"];
  }
  if (fsdp) {  // fully_shard's collectives (the dp group) are exactly those without checkpointing
    const auto& dp_group = without.dp_group;
    for (const auto& [phase, kinds] : without.comm.at(dp_group))
      for (const auto& [kind, st] : kinds) EXPECT_EQ(with.comm.at(dp_group).at(phase).at(kind).count, st.count) << phase << " " << kind;
  }
  std::map<std::string, int64_t> got, expected;
  for (const auto& [group, phases] : without.comm)
    if (phases.count("backward"))
      for (const auto& [kind, st] : phases.at("backward")) expected[kind] += st.count;
  for (const auto& [kind, n] : extra) expected[kind] += n;
  for (const auto& [group, phases] : with.comm)
    if (phases.count("backward"))
      for (const auto& [kind, st] : phases.at("backward")) got[kind] += st.count;
  EXPECT_EQ(got, expected);
}

void check_policy(bool fsdp) {
  for (const double dropout : {0.0, 0.25}) {
    SCOPED_TRACE(dropout > 0 ? "with dropout" : "without dropout");
    TrainSetup base;
    base.fsdp = fsdp;
    base.dropout = dropout;
    const TrainRun plain = train(base, /*trace=*/true);
    // Dropout draws in every step: the two steps' losses differ from a run without it.
    for (const auto& policy : {hp::ActivationCheckpointPolicy::full(), hp::ActivationCheckpointPolicy::full(2),
                               hp::ActivationCheckpointPolicy::selective()}) {
      SCOPED_TRACE(policy.to_string());
      TrainSetup s = base;
      s.policy = policy;
      const TrainRun ckpt = train(s);
      expect_bitwise(ckpt, plain);
      std::vector<std::string> blocks;
      for (int64_t k = 0; k < 2; ++k)
        if ((k + 1) % policy.every == 0) blocks.push_back("layers." + std::to_string(k));
      expect_comm(ckpt, plain, blocks, fsdp);
    }
  }
}

}  // namespace

TEST(ActivationCheckpointDist, TensorParallelGradientsBitwiseEqual) { check_policy(/*fsdp=*/false); }

TEST(ActivationCheckpointDist, FullyShardDpTimesTpGradientsBitwiseEqual) {
  ASSERT_EQ(hp::get_world_size(), 4);
  check_policy(/*fsdp=*/true);
}

// The checkpointed model trains as one process does (dropout off: one process draws the same).
TEST(ActivationCheckpointDist, TensorParallelWithCheckpointingMatchesOneProcess) {
  TrainSetup s;
  s.policy = hp::ActivationCheckpointPolicy::full();
  s.dropout = 0.1;
  const TrainRun ckpt = train(s);
  hp_test::manual_seed(11);
  qwen3::CausalLM ref(small_config(0.1));
  ref->train();
  torch::optim::SGD opt(hp::unique_parameters(*ref), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 2; ++step) {
    const at::Tensor ids = token_batch(64, 4, 8, 40 + step);
    at::Tensor loss = qwen3::causal_lm_loss(ref(ids.narrow(1, 0, 8)), ids.narrow(1, 1, 8));
    opt.zero_grad();
    loss.backward();
    EXPECT_NEAR(ckpt.losses[static_cast<size_t>(step)], loss.item<double>(), 1e-5);
    opt.step();
  }
}

TEST(ActivationCheckpointDist, PolicyNamesAndRefusals) {
  EXPECT_EQ(hp::ActivationCheckpointPolicy::parse("full:3").every, 3);
  EXPECT_EQ(hp::ActivationCheckpointPolicy::parse("selective").to_string(), "selective");
  EXPECT_EQ(hp::ActivationCheckpointPolicy::parse("none").mode, hp::ActivationCheckpointPolicy::Mode::None);
  for (const char* bad : {"ful", "full:0", "full:x", ""}) EXPECT_THROW(hp::ActivationCheckpointPolicy::parse(bad), c10::ValueError) << bad;
  qwen3::CausalLM model(small_config());
  auto p = hp::ActivationCheckpointPolicy::full();
  p.every = 0;
  EXPECT_THROW(hp::apply_activation_checkpointing(*model, p), c10::ValueError);
  EXPECT_THROW(hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::selective({})), c10::ValueError);
}

}  // namespace t_dist_nn_activation_checkpoint_test
