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

}  // namespace t_dist_expert_parallel_moe_training_test
