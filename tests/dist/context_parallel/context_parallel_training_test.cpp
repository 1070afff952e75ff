// Qwen3 training with context parallelism against one process: 10 AdamW steps in which the loss
// (the mean over the cp ranks of each rank's mean over its tokens) and every parameter's gradient
// equal the whole model's on the whole sequence. The model takes this rank's shard of the ids,
// their positions (rotary angles follow the load-balanced order) and the labels sharded alike.
// Layouts: cp = 2 in each mode, with the gradients all-reduced over cp or FSDP sharding over cp;
// cp x tp = 2 x 2 (heads split by tp first, ulysses then replicating the one key head per tp
// rank), with sequence parallelism, FSDP over cp and full activation checkpointing (the
// recompute runs the cp collectives again); cp = 4 with ring attention.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include "../nn/training_util.h"

using namespace training_test;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_context_parallel_context_parallel_training_test {
namespace {

struct Layout {
  int64_t cp = 2, tp = 1;
  std::string mode = "ring";
  bool load_balance = true, fsdp = false, checkpointing = false, sequence_parallel = true;
};

constexpr int64_t kSeq = 16, kRows = 2;

void train_matches_one_process(const Layout& l) {
  ASSERT_EQ(l.cp * l.tp, hp::get_world_size());
  SCOPED_TRACE(c10::str(l.mode, " cp=", l.cp, " tp=", l.tp, " load_balance=", l.load_balance, " fsdp=", l.fsdp,
                        " checkpointing=", l.checkpointing, " sp=", l.sequence_parallel));
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {l.cp, l.tp}, {"cp", "tp"});
  const hp::DeviceMesh cp = mesh["cp"];
  const qwen3::Config c = small_config();
  hp_test::manual_seed(11);
  qwen3::CausalLM ref(c), model(c);
  {
    at::NoGradGuard no_grad;
    auto ref_params = ref->named_parameters();
    for (auto& p : model->named_parameters()) p.value().copy_(ref_params[p.key()]);
  }
  if (l.tp > 1) qwen3::parallelize_qwen3_tp(*model, mesh["tp"], l.sequence_parallel);
  qwen3::parallelize_qwen3_cp(*model, cp, l.mode, l.load_balance);
  if (l.checkpointing) hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy{});
  if (l.fsdp) {
    for (const auto& layer : *model->layers) hp::fully_shard(*layer, cp);
    hp::fully_shard(*model, cp);
  }
  torch::optim::AdamW opt(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ref_opt(hp::unique_parameters(*ref), torch::optim::AdamWOptions(1e-3));
  // This rank's positions, for the rotary angles.
  const hnn::Kwargs positions{{"position_ids", hp::context_parallel_positions(kSeq, cp, l.load_balance).unsqueeze(0)}};
  for (int step = 0; step < 10; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor tokens = token_batch(c.vocab_size, kRows, kSeq, 900 + static_cast<uint64_t>(step));
    const at::Tensor inputs = tokens.narrow(1, 0, kSeq), targets = tokens.narrow(1, 1, kSeq);
    const at::Tensor ids = hp::context_parallel_shard(inputs, cp, 1, l.load_balance);
    const at::Tensor labels = hp::context_parallel_shard(targets, cp, 1, l.load_balance);
    const at::Tensor loss = qwen3::causal_lm_loss(model(ids, positions), labels);
    loss.backward();
    if (!l.fsdp) hp::all_reduce_gradients(*model, cp);
    at::Tensor total = at::tensor(loss.item<double>(), at::kDouble);
    hp::all_reduce_(total, hp::ReduceOp::SUM, cp.get_group(0));
    const at::Tensor ref_loss = qwen3::causal_lm_loss(ref(inputs), targets);
    ref_loss.backward();
    EXPECT_NEAR(total.item<double>() / static_cast<double>(l.cp), ref_loss.item<double>(), 2e-6);
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
      EXPECT_TRUE(hp_test::close(whole(p.value().grad()), ref_params[p.key()].grad(), 1e-4, 2e-6)) << p.key();
    }
    opt.step();
    ref_opt.step();
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << "step " << step;
    opt.zero_grad();
    ref_opt.zero_grad();
  }
}

}  // namespace

TEST(ContextParallelTrainingDist, EveryModeAtCpTwoMatchesOneProcessFor10Steps) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  train_matches_one_process({2, 1, "ring", true});
  train_matches_one_process({2, 1, "ulysses", false});
  train_matches_one_process({2, 1, "allgather_kv", true, /*fsdp=*/true});
}

TEST(ContextParallelTrainingDist, CpTimesTpMatchesOneProcessFor10Steps) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process({2, 2, "ulysses", true, /*fsdp=*/true});
  train_matches_one_process({2, 2, "ring", true, /*fsdp=*/false, /*checkpointing=*/true});
  train_matches_one_process({2, 2, "allgather_kv", false, /*fsdp=*/true, /*checkpointing=*/true, /*sequence_parallel=*/false});
}

TEST(ContextParallelTrainingDist, RingAtCpFourMatchesOneProcessFor10Steps) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process({4, 1, "ring", true});
}

}  // namespace t_dist_context_parallel_context_parallel_training_test
