// Training Qwen3.5-MoE (Gated DeltaNet and gated attention layers, every MLP a sparse block of 4
// routed experts, top-2, beside a shared expert behind its sigmoid gate) with the routed experts
// split over ep, against one process, for 10 AdamW steps: each rank's loss (its rows'
// cross-entropy plus router_aux_loss_coef times the load-balancing loss of the whole batch) and
// every parameter's gradient equal the one-process model's on the same global batch. Layouts:
// ep = 2 (ep borrowed from the data ranks, tokens dispatched by all-to-all), dp x ep = 2 x 2 (FSDP
// of everything else over the data ranks), and ep x tp = 2 x 2 (the tp plan with sequence
// parallelism, its default; the shared expert split as a dense MLP, ExpertTensorParallel on [ep, tp]).
#include <gtest/gtest.h>

#include <torch/optim.h>

#include "../../common/hf_reference.h"
#include "../../common/qwen3_5_small.h"
#include "../nn/training_util.h"

#include <hyper_parallel/pipelining/schedules.h>
#include <hyper_parallel/pipelining/stage.h>

#include <hyper_parallel/models/qwen3_5/model.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>

using namespace training_test;
namespace q35 = hyper_parallel::qwen3_5;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_expert_parallel_qwen3_5_moe_training_test {
namespace {

// small_qwen3_5_config with every MLP a sparse block: 4 experts, top-2, beside a shared expert.
q35::Config moe_config() {
  q35::Config c = hp_test::small_qwen3_5_config();
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.shared_expert_intermediate_size = 48;
  c.router_aux_loss_coef = 0.01;
  return c;
}

q35::CausalLM reference() {
  hp_test::manual_seed(23);
  q35::CausalLM ref(moe_config());
  hp_test::draw_small_weights(*ref);
  return ref;
}

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

void train_matches_one_process(int64_t dp, int64_t ep, int64_t tp, bool sequence_parallel = false) {
  ASSERT_EQ(dp * ep * tp, hp::get_world_size());
  SCOPED_TRACE(c10::str("dp=", dp, " ep=", ep, " tp=", tp, sequence_parallel ? ", sequence parallel" : ""));
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {dp, ep, tp}, {"dp", "ep", "tp"});
  const int64_t data_ranks = dp * ep, data_rank = mesh.get_local_rank(0) * ep + mesh.get_local_rank(1);
  const q35::Config c = moe_config();
  q35::CausalLM ref = reference(), model(c);
  {
    at::NoGradGuard no_grad;
    auto ref_params = ref->named_parameters();
    for (auto& p : model->named_parameters()) p.value().copy_(ref_params[p.key()]);
  }
  if (tp > 1) q35::parallelize_qwen3_5_tp(*model, mesh["tp"], sequence_parallel);
  q35::parallelize_qwen3_5_experts(*model, tp > 1 ? mesh[{"ep", "tp"}] : mesh["ep"]);
  // The experts' gradients are summed over the ep ranks' tokens: divided by every data rank.
  hp::FullyShardOptions experts_options;
  experts_options.gradient_divide_factor = static_cast<double>(data_ranks);
  for (const auto& layer : *model->layers) hp::fully_shard(*layer->as<q35::DecoderLayerImpl>()->moe->experts, mesh["dp"], experts_options);
  hp::fully_shard(*model, mesh[{"dp", "ep"}]);
  torch::optim::AdamW opt(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ref_opt(hp::unique_parameters(*ref), torch::optim::AdamWOptions(1e-3));
  const hp::Group data = data_group(mesh);
  const int64_t seq = 24, batch = 2 * data_ranks;
  for (int step = 0; step < 10; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor tokens = token_batch(c.vocab_size, batch, seq, 500 + static_cast<uint64_t>(step));
    const at::Tensor mine = dp_rows(tokens, data_rank, data_ranks);
    // The forward first: the load-balancing loss reads the router logits it leaves.
    const at::Tensor ce = lm_loss(model(mine.narrow(1, 0, seq)), mine.narrow(1, 1, seq));
    const at::Tensor loss = ce + c.router_aux_loss_coef * model->load_balancing_loss(data);
    loss.backward();
    // One process: this rank's rows' cross-entropy plus the whole batch's aux loss is this rank's
    // loss, and the mean over the data ranks the objective.
    const at::Tensor logits = ref(tokens.narrow(1, 0, seq));
    const at::Tensor aux = ref->load_balancing_loss();
    const at::Tensor ref_mine = lm_loss(dp_rows(logits, data_rank, data_ranks), mine.narrow(1, 1, seq)) + c.router_aux_loss_coef * aux;
    (lm_loss(logits, tokens.narrow(1, 1, seq)) + c.router_aux_loss_coef * aux).backward();
    EXPECT_NEAR(loss.item<double>(), ref_mine.item<double>(), 1e-5);
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
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model));
    opt.zero_grad();
    ref_opt.zero_grad();
  }
}

// Two pipeline stages, each with MoE layers of both mixer kinds ([linear, full | linear, full]),
// 1F1B over 2 microbatches, against one process: the loss and every gradient for 5 AdamW steps. The
// loss is the cross-entropy alone: transformers' load-balancing loss pools every layer's router
// statistics before its product, so it is not a sum of the stages' parts. With tp, the stages'
// layers are split by the tp plan and their routed experts over the tp ranks.
void pipeline_matches_one_process(int64_t tp) {
  const int64_t pp = 2;
  SCOPED_TRACE(c10::str("1F1B pp=", pp, " tp=", tp));
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {pp, tp}, {"pp", "tp"});
  q35::Config c = moe_config();
  c.full_attention = {false, true, false, true};
  hp_test::manual_seed(29);
  q35::CausalLM ref(c);
  hp_test::draw_small_weights(*ref);
  q35::CausalLM part(c, q35::pipeline_stage_span(c, mesh.get_local_rank(0), pp));
  {
    at::NoGradGuard no_grad;
    auto whole_params = ref->named_parameters();
    for (auto& p : part->named_parameters()) p.value().copy_(whole_params[p.key()]);
  }
  if (tp > 1) {
    q35::parallelize_qwen3_5_tp(*part, mesh["tp"], /*sequence_parallel=*/true);
    q35::parallelize_qwen3_5_experts(*part, mesh["tp"], /*tensor_parallel=*/false, "all_reduce");
  }
  hp::PipelineStageOptions so;
  if (tp > 1) so.device_mesh = mesh["tp"];
  hp::PipelineStage stage(part.ptr(), mesh.get_local_rank(0), pp, mesh.get_group("pp"), so);
  hp::PipelineSchedule schedule({&stage}, /*microbatches=*/2, lm_loss, hp::ScheduleKind::OneFOneB);
  torch::optim::AdamW opt(part->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-3));
  const int64_t seq = 24;
  for (int64_t step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor ids = token_batch(c.vocab_size, 4, seq, 900 + static_cast<uint64_t>(step));
    const at::Tensor x = ids.narrow(1, 0, seq), y = ids.narrow(1, 1, seq);
    const at::Tensor loss = schedule.step(stage.is_first() ? x : at::Tensor(), stage.is_last() ? y : at::Tensor());
    const at::Tensor ref_loss = lm_loss(ref(x), y);
    ref_loss.backward();
    if (stage.is_last()) EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5);
    auto ref_params = ref->named_parameters();
    const double rel = step == 0 ? 1e-4 : 1e-3;
    for (const auto& p : part->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_TRUE(hp_test::near_relative(whole(p.value().grad()), ref_params[p.key()].grad(), rel)) << p.key();
    }
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
  EXPECT_TRUE(hp_test::replicas_bitwise_equal(*part));
}

}  // namespace

TEST(Qwen3_5MoETrainingDist, PipelineStagesWithMoELayersMatchOneProcess) {
  if (hp::get_world_size() == 2) pipeline_matches_one_process(1);
  else if (hp::get_world_size() == 4) pipeline_matches_one_process(2);
  else GTEST_SKIP() << "2 or 4 ranks";
}

TEST(Qwen3_5MoETrainingDist, ExpertParallelTwoMatchesOneProcess) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  train_matches_one_process(1, 2, 1);
}

TEST(Qwen3_5MoETrainingDist, DataTimesExpertParallelTwoByTwoMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process(2, 2, 1);
}

TEST(Qwen3_5MoETrainingDist, ExpertTimesTensorParallelTwoByTwoMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  train_matches_one_process(1, 2, 2, /*sequence_parallel=*/true);
}

}  // namespace t_dist_expert_parallel_qwen3_5_moe_training_test
