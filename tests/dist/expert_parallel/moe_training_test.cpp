// Training a Qwen3-MoE model with experts split over ep against one process, for 10 AdamW steps:
// each rank's loss (its rows' cross-entropy plus router_aux_loss_coef times the load-balancing
// loss of the whole batch) and every parameter's gradient equal the one-process model's on the
// same global batch. Layouts: ep = 2 (ep borrowed from the data ranks), dp x ep = 2 x 2, and
// ep x tp = 2 x 2 (attention TP, ExpertTensorParallel). Non-expert parameters are fully_shard-ed
// over the data ranks (dp x ep, HSDP); the experts over dp with their sum divided by dp x ep.
// Also: the token dispatch against a local reference, a rank whose experts get no token, and the
// all-to-all counts CommDebugMode records.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include "../nn/training_util.h"

#include <hyper_parallel/models/qwen3/pretrained.h>

#include "../../common/error_message.h"

using namespace training_test;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_expert_parallel_moe_training_test {
namespace {

qwen3::Config moe_config() { return small_moe_config(); }

void train_matches_one_process(int64_t dp, int64_t ep, int64_t tp) {
  ASSERT_EQ(dp * ep * tp, hp::get_world_size());
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {dp, ep, tp}, {"dp", "ep", "tp"});
  const int64_t data_ranks = dp * ep, data_rank = mesh.get_local_rank(0) * ep + mesh.get_local_rank(1);
  const qwen3::Config c = moe_config();
  qwen3::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
    model = qwen3::CausalLM(c);
  }
  if (tp > 1) qwen3::parallelize_qwen3_tp(*model, mesh["tp"], /*sequence_parallel=*/false);
  qwen3::parallelize_qwen3_experts(*model, tp > 1 ? mesh[{"ep", "tp"}] : mesh["ep"]);
  hp::FullyShardOptions experts_options;
  experts_options.gradient_divide_factor = static_cast<double>(data_ranks);
  for (const auto& layer : *model->layers)
    if (auto moe = layer->as<qwen3::DecoderLayerImpl>()->moe) hp::fully_shard(*moe->experts, mesh["dp"], experts_options);
  hp::fully_shard(*model, mesh[{"dp", "ep"}]);
  hp::manual_seed(11);
  hp::init_parameters(*model, "cpu");
  hp::manual_seed(11);
  qwen3::CausalLM ref = qwen3::build_model(c, c10::nullopt);
  torch::optim::AdamW opt(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ref_opt(hp::unique_parameters(*ref), torch::optim::AdamWOptions(1e-3));
  const hp::Group data = data_group(mesh);
  const int64_t seq = 8, batch = 2 * data_ranks;
  for (int step = 0; step < 10; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor tokens = token_batch(c.vocab_size, batch, seq, 300 + static_cast<uint64_t>(step));
    const at::Tensor mine = dp_rows(tokens, data_rank, data_ranks);
    // The forward first: aux_loss reads the router logits it leaves.
    const at::Tensor ce = qwen3::causal_lm_loss(model(mine.narrow(1, 0, seq)), mine.narrow(1, 1, seq));
    at::Tensor loss = ce + c.router_aux_loss_coef * model->aux_loss(data);
    loss.backward();
    // One process: the whole batch's logits; this rank's rows' cross-entropy plus the whole
    // batch's aux loss is this rank's loss, and the mean over the data ranks the objective.
    const at::Tensor logits = ref(tokens.narrow(1, 0, seq));
    const at::Tensor aux = ref->aux_loss();
    const at::Tensor ref_mine = qwen3::causal_lm_loss(dp_rows(logits, data_rank, data_ranks), mine.narrow(1, 1, seq)) +
                                c.router_aux_loss_coef * aux;
    (qwen3::causal_lm_loss(logits, tokens.narrow(1, 1, seq)) + c.router_aux_loss_coef * aux).backward();
    EXPECT_NEAR(loss.item<double>(), ref_mine.item<double>(), 1e-5);
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
      EXPECT_TRUE(hp_test::close(whole(p.value().grad()), ref_params[p.key()].grad(), 1.5e-4, 1e-5)) << p.key();
    }
    opt.step();
    ref_opt.step();
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model));
    opt.zero_grad();
    ref_opt.zero_grad();
  }
}

}  // namespace

TEST(MoETrainingDist, ExpertParallelTwoMatchesOneProcess) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  train_matches_one_process(1, 2, 1);
}

TEST(MoETrainingDist, DataTimesExpertParallelTwoByTwoMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process(2, 2, 1);
}

TEST(MoETrainingDist, ExpertTimesTensorParallelTwoByTwoMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process(1, 2, 2);
}

// Tokens routed so that rank 1's experts get none: its output and its input gradient are right
// (zero contribution), its experts' gradients are zero, and no rank hangs in the backward
// all-to-alls. Against the same experts run in one process.
TEST(MoETrainingDist, RankWhoseExpertsGetNoTokenTakesPartInEveryCollective) {
  const int64_t ws = hp::get_world_size();
  if (ws < 2) GTEST_SKIP() << "needs ep > 1";
  const hnn::MoEOptions o(8, 6, 2 * ws, 2);
  hp::manual_seed(3);
  hnn::GroupedExperts ref(o), split(o);
  {
    at::NoGradGuard g;
    for (const auto& p : split->named_parameters()) p.value().copy_(ref->named_parameters()[p.key()]);
  }
  hp::ExpertParallel().apply(*split, hp_test::world_mesh());
  // Every rank routes its tokens to experts 0..1 only (rank 0's).
  const int64_t t = 3 + hp::get_rank();
  const at::Tensor x = at::randn({t, 8}, at::detail::createCPUGenerator(40 + static_cast<uint64_t>(hp::get_rank()))).requires_grad_();
  const at::Tensor idx = at::stack({at::zeros({t}, at::kLong), at::ones({t}, at::kLong)}, 1);
  const at::Tensor w = at::full({t, 2}, 0.5);
  hp::CommDebugMode comm;
  const at::Tensor y = split(x, idx, w);
  y.pow(2).sum().backward();
  EXPECT_EQ(comm.get_comm_counts().at("all_to_all"), 1 + 2 + 2);  // counts; tokens there and back, forward and backward
  const at::Tensor xr = x.detach().clone().requires_grad_();
  const at::Tensor yr = ref(xr, idx, w);
  yr.pow(2).sum().backward();
  EXPECT_TRUE(hp_test::close(y, yr, 1e-5, 1e-6));
  EXPECT_TRUE(hp_test::close(x.grad(), xr.grad(), 1e-5, 1e-6));
  const at::Tensor local_grad = hp::DTensor(split->parameter("gate_proj").grad()).to_local();
  if (hp::get_rank() > 0) EXPECT_EQ(local_grad.abs().sum().item<double>(), 0.0) << "experts without tokens";
  // The gradients of the experts that got tokens: summed over every rank's tokens.
  at::Tensor gathered = hp::DTensor(split->parameter("gate_proj").grad()).full_tensor();
  at::Tensor want = ref->parameter("gate_proj").grad();
  hp::all_reduce_(want, hp::ReduceOp::SUM, hp::world_group());
  EXPECT_TRUE(hp_test::close(gathered, want, 1e-4, 1e-5));
}

namespace {

// `ref`'s parameters copied into `model` (same config): two models that start equal.
void copy_parameters(qwen3::CausalLMImpl& from, qwen3::CausalLMImpl& to) {
  at::NoGradGuard no_grad;
  auto params = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(params[p.key()]);
}

void expect_gradients_match(qwen3::CausalLMImpl& model, qwen3::CausalLMImpl& ref) {
  auto ref_params = ref.named_parameters();
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
    EXPECT_TRUE(hp_test::close(whole(p.value().grad()), ref_params[p.key()].grad(), 1e-4, 2e-6)) << p.key();
  }
}

}  // namespace

// Under context parallelism each rank routes other tokens of the same sequences: the aux loss
// over the cp group is the whole sequences' (one process), and so are the gradients of the
// cross-entropy plus it; a group without the cp ranks is refused by name on every rank.
TEST(MoETrainingDist, AuxLossUnderContextParallelIsTheWholeSequencesAndNeedsTheCpRanks) {
  const int64_t n = hp::get_world_size();
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {n}, {"cp"});
  const qwen3::Config c = moe_config();
  hp_test::manual_seed(11);
  qwen3::CausalLM ref(c), model(c);
  copy_parameters(*ref, *model);
  qwen3::parallelize_qwen3_cp(*model, cp, "ring", /*load_balance=*/true);
  const int64_t seq = 16;
  const at::Tensor tokens = token_batch(c.vocab_size, 2, seq, 77);
  const at::Tensor inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);
  const hnn::Kwargs positions{{"position_ids", hp::context_parallel_positions(seq, cp, true).unsqueeze(0)}};
  const at::Tensor ce = qwen3::causal_lm_loss(model(hp::context_parallel_shard(inputs, cp, 1, true), positions),
                                              hp::context_parallel_shard(targets, cp, 1, true));
  const std::string refused = hp_test::error_message([&] { model->aux_loss(); });
  EXPECT_NE(refused.find("hyper_parallel::qwen3::CausalLMImpl::aux_loss: the model runs under context parallelism over ranks "), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("data_group must contain them"), std::string::npos) << refused;
  // Refused before anything was taken: the step's statistics are still there.
  const at::Tensor aux = model->aux_loss(cp.get_group(0));
  (ce + c.router_aux_loss_coef * aux).backward();
  hp::all_reduce_gradients(*model, cp);
  const at::Tensor ref_ce = qwen3::causal_lm_loss(ref(inputs), targets);
  const at::Tensor ref_aux = ref->aux_loss();
  (ref_ce + c.router_aux_loss_coef * ref_aux).backward();
  EXPECT_NEAR(aux.item<double>(), ref_aux.item<double>(), 1e-6);
  // The shard's own statistics alone give another number (the comparison above can fail).
  EXPECT_GT(std::abs(hnn::load_balancing_loss(model->router_logits(), c.num_experts, c.num_experts_per_tok).item<double>() -
                     ref_aux.item<double>()), 1e-4);
  expect_gradients_match(*model, *ref);
}

// Two microbatches of one step, each a forward, then the step's loss: the aux loss pools both
// (as one process's forward of the whole batch), with and without activation checkpointing (a
// recompute adds nothing); the last microbatch's router logits alone give another number.
TEST(MoETrainingDist, AuxLossOfTwoMicrobatchesIsTheWholeBatchs) {
  const qwen3::Config c = moe_config();
  for (const bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "full activation checkpointing" : "no checkpointing");
    hp_test::manual_seed(12);
    qwen3::CausalLM ref(c), model(c);
    copy_parameters(*ref, *model);
    if (checkpointing) hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::full());
    const int64_t seq = 8;
    const at::Tensor tokens = token_batch(c.vocab_size, 4, seq, 78);
    const at::Tensor inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);
    at::Tensor ce;
    for (int64_t m = 0; m < 2; ++m) {
      const at::Tensor part = qwen3::causal_lm_loss(model(inputs.narrow(0, 2 * m, 2)), targets.narrow(0, 2 * m, 2)) / 2.0;
      ce = ce.defined() ? ce + part : part;
    }
    const at::Tensor last_only = hnn::load_balancing_loss(model->router_logits(), c.num_experts, c.num_experts_per_tok);
    const at::Tensor aux = model->aux_loss();
    (ce + c.router_aux_loss_coef * aux).backward();
    const at::Tensor ref_aux_value = [&] {
      const at::Tensor ref_ce = qwen3::causal_lm_loss(ref(inputs), targets);
      const at::Tensor ref_aux = ref->aux_loss();
      (ref_ce + c.router_aux_loss_coef * ref_aux).backward();
      return ref_aux.detach();
    }();
    EXPECT_NEAR(aux.item<double>(), ref_aux_value.item<double>(), 1e-6);
    EXPECT_GT(std::abs(last_only.item<double>() - ref_aux_value.item<double>()), 1e-4);
    expect_gradients_match(*model, *ref);
    // Taken: a second call without a forward says so.
    const std::string empty = hp_test::error_message([&] { model->aux_loss(); });
    EXPECT_NE(empty.find("hyper_parallel::nn::load_balancing_loss: no router statistics"), std::string::npos) << empty;
  }
}

// A pipeline stage holds only its own layers' statistics; transformers' loss pools them all.
TEST(MoETrainingDist, AuxLossOfAPipelineStageIsRefused) {
  const qwen3::Config c = moe_config();
  qwen3::CausalLM stage(c, qwen3::pipeline_stage_span(c, 0, 2));
  stage(token_batch(c.vocab_size, 1, 8, 79).narrow(1, 0, 8));
  const std::string msg = hp_test::error_message([&] { stage->aux_loss(); });
  EXPECT_NE(msg.find("hyper_parallel::qwen3::CausalLMImpl::aux_loss: this pipeline stage holds layers [0, "), std::string::npos) << msg;
  EXPECT_NE(msg.find("train pipeline stages on the cross-entropy alone"), std::string::npos) << msg;
}

}  // namespace t_dist_expert_parallel_moe_training_test
