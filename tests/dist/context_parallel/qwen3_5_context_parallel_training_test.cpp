// Qwen3.5 training with context parallelism against one process: 10 AdamW steps in which the loss
// (the mean over the cp ranks of each rank's mean over its tokens) and every parameter's gradient
// equal the whole model's on the whole sequence. parallelize_qwen3_5_cp puts the Gated DeltaNet
// layers under LinearAttentionContextParallel and the full-attention layer under ContextParallel;
// the ids, positions and labels are sharded contiguously. The model has the reference
// checkpoints' head layout (4 key heads serving 8 value heads in the linear layers, 4 query heads
// over 2 KV heads in the full one) and its 1-D weights drawn away from their initial values.
// Layouts: cp = 2 in each linear mode (with the three attention modes, gradients all-reduced or
// FSDP over cp); cp x tp = 2 x 2 (heads split by tp first), with sequence parallelism, FSDP over
// cp and full activation checkpointing (the summaries recomputed in backward); dp x cp = 2 x 2
// with FSDP over both (one dp_cp dimension) and full checkpointing; cp = 4 with p2p (ulysses at cp = 4
// is the module test's). Also the refusal of load balancing.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/models/qwen3_5/model.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>

#include "../../common/hf_reference.h"
#include "../../common/qwen3_5_small.h"
#include "../../common/test_util.h"

namespace q35 = hyper_parallel::qwen3_5;
namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_context_parallel_qwen3_5_context_parallel_training_test {
namespace {

struct Layout {
  int64_t cp = 2, tp = 1;
  std::string linear_mode = "all_gather", attention_mode = "ulysses";
  bool fsdp = false, checkpointing = false, sequence_parallel = true;
  int64_t dp = 1;  // with dp > 1: fully_shard over dp x cp as one mesh dimension (dp_cp), cp unflattened from it
};

constexpr int64_t kSeq = 72, kRows = 2, kSteps = 10;

q35::Config config() { return hp_test::small_qwen3_5_config(); }

q35::CausalLM reference() {
  hp_test::manual_seed(41);
  q35::CausalLM ref(config());
  hp_test::draw_small_weights(*ref);
  return ref;
}

at::Tensor whole(const at::Tensor& t) { return hp::is_dtensor(t) ? hp::DTensor(t.detach()).full_tensor() : t.detach(); }

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

void train_matches_one_process(const Layout& l) {
  ASSERT_EQ(l.dp * l.cp * l.tp, hp::get_world_size());
  SCOPED_TRACE(c10::str("linear ", l.linear_mode, ", attention ", l.attention_mode, ", dp=", l.dp, " cp=", l.cp, " tp=", l.tp, " fsdp=",
                        l.fsdp, " checkpointing=", l.checkpointing, " sp=", l.sequence_parallel));
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {l.dp * l.cp, l.tp}, {"dp_cp", "tp"});
  const hp::DeviceMesh dp_cp = mesh["dp_cp"];
  const hp::DeviceMesh data = dp_cp.unflatten(0, {l.dp, l.cp}, {"dp", "cp"});
  const hp::DeviceMesh cp = data["cp"];
  const int64_t dp_rank = data.get_local_rank(0);
  q35::CausalLM ref = reference(), model(config());
  {
    at::NoGradGuard no_grad;
    auto ref_params = ref->named_parameters();
    for (auto& p : model->named_parameters()) p.value().copy_(ref_params[p.key()]);
  }
  if (l.tp > 1) q35::parallelize_qwen3_5_tp(*model, mesh["tp"], l.sequence_parallel);
  q35::parallelize_qwen3_5_cp(*model, cp, l.linear_mode, l.attention_mode);
  if (l.checkpointing) hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy{});
  if (l.fsdp) {
    for (const auto& layer : *model->layers) hp::fully_shard(*layer, dp_cp);
    hp::fully_shard(*model, dp_cp);
  }
  torch::optim::AdamW opt(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ref_opt(hp::unique_parameters(*ref), torch::optim::AdamWOptions(1e-3));
  const hnn::Kwargs positions{{"position_ids", hp::context_parallel_positions(kSeq, cp, false).unsqueeze(0)}};
  for (int64_t step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor tokens =
        at::randint(128, {kRows * l.dp, kSeq + 1}, at::detail::createCPUGenerator(700 + static_cast<uint64_t>(step)), at::kLong);
    const at::Tensor inputs = tokens.narrow(1, 0, kSeq), targets = tokens.narrow(1, 1, kSeq);
    // This dp rank's rows, and its cp shard of each.
    const auto mine = [&](const at::Tensor& t) { return hp::context_parallel_shard(t.chunk(l.dp, 0)[dp_rank].contiguous(), cp, 1, false); };
    const at::Tensor loss = lm_loss(model(mine(inputs), positions), mine(targets));
    loss.backward();
    if (!l.fsdp) hp::all_reduce_gradients(*model, cp);
    at::Tensor total = at::tensor(loss.item<double>(), at::kDouble);
    hp::all_reduce_(total, hp::ReduceOp::SUM, dp_cp.get_group(0));
    const at::Tensor ref_loss = lm_loss(ref(inputs), targets);
    ref_loss.backward();
    EXPECT_NEAR(total.item<double>() / static_cast<double>(l.dp * l.cp), ref_loss.item<double>(), 1e-5);
    // Gradients within 1e-4 of each parameter's largest at step 0; after Adam steps, which turn
    // rounding in gradients near zero into weight differences of a fraction of lr, 1e-3.
    const double rel = step == 0 ? 1e-4 : 1e-3;
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
      EXPECT_TRUE(hp_test::near_relative(whole(p.value().grad()), ref_params[p.key()].grad(), rel)) << p.key();
    }
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
  EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model));
  // The weights after 10 steps within a tenth of lr (Adam turns rounding in gradients near zero
  // into weight differences of a few hundredths of lr).
  auto ref_params = ref->named_parameters();
  for (const auto& p : model->named_parameters()) EXPECT_TRUE(hp_test::close(whole(p.value()), ref_params[p.key()], 1e-4, 1e-4)) << p.key();
}

}  // namespace

TEST(Qwen3_5ContextParallelDist, EveryLinearModeAtCpTwoMatchesOneProcessFor10Steps) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  train_matches_one_process({2, 1, "ulysses", "ulysses"});
  train_matches_one_process({2, 1, "all_gather", "allgather_kv", /*fsdp=*/true});
  train_matches_one_process({2, 1, "p2p", "ring"});
}

TEST(Qwen3_5ContextParallelDist, CpTimesTpMatchesOneProcessFor10Steps) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process({2, 2, "ulysses", "ulysses", /*fsdp=*/true});
  train_matches_one_process({2, 2, "p2p", "ring", /*fsdp=*/false, /*checkpointing=*/true});
}

TEST(Qwen3_5ContextParallelDist, FsdpOverDpTimesCpMatchesOneProcessFor10Steps) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  Layout l{2, 1, "all_gather", "allgather_kv", /*fsdp=*/true, /*checkpointing=*/true};
  l.dp = 2;
  train_matches_one_process(l);
}

TEST(Qwen3_5ContextParallelDist, CpFourMatchesOneProcessFor10Steps) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process({4, 1, "p2p", "ring", /*fsdp=*/true});
}

TEST(Qwen3_5ContextParallelDist, LoadBalancingIsRefusedSayingWhy) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {2}, {"cp"});
  q35::CausalLM model(config());
  std::string message;
  try {
    q35::parallelize_qwen3_5_cp(*model, cp, "p2p", "ring", /*load_balance=*/true);
  } catch (const c10::ValueError& e) {
    message = e.what_without_backtrace();
  }
  EXPECT_NE(message.find("hyper_parallel::qwen3_5::parallelize_qwen3_5_cp: load_balance cannot be used: a Gated DeltaNet layer reads the "
                         "sequence in order"),
            std::string::npos)
      << message;
  EXPECT_EQ(model->layers[0]->as<q35::DecoderLayerImpl>()->linear_attn->gdn->forward_wrapper(), nullptr) << "nothing changed";
  // An unknown mode is refused before the plan changes anything.
  EXPECT_THROW(q35::parallelize_qwen3_5_cp(*model, cp, "ring", "ring"), c10::ValueError);
  EXPECT_EQ(model->layers[3]->as<q35::DecoderLayerImpl>()->self_attn->sdpa->forward_wrapper(), nullptr);
}

}  // namespace t_dist_context_parallel_qwen3_5_context_parallel_training_test
