// Qwen3.5 (transformers' random-weight checkpoint: 3 Gated DeltaNet layers and 1 gated attention
// layer, every norm weight, A_log and dt_bias random) trained for 6 AdamW steps under the seed's
// plan, against the same 6 steps in one process: each step's loss, and every parameter after the
// last step. Sequences of 72 tokens (two GDN chunks, the second padded; 72 divides over 2 and 4
// ranks for sequence parallelism). Layouts: tp with and without sequence parallelism, with full
// and selective activation checkpointing, KV heads replicated at tp = 4, and dp x tp = 2 x 2 with
// fully_shard over dp. And pipeline stages that each hold layers of both kinds (pp = 2, and
// pp x tp = 2 x 2), under 1F1B and GPipe. bf16 mixed precision (fully_shard's
// MixedPrecisionPolicy: bf16 compute, fp32 reduction and master weights) against one process
// computing each dp rank's rows with a bf16 copy of its fp32 master, by the README's bf16 rule.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/fsdp/fully_shard.h>
#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/pipelining/schedules.h>
#include <hyper_parallel/pipelining/stage.h>

#include "../../common/hf_reference.h"
#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3_5/config.h>
#include <hyper_parallel/models/qwen3_5/model.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>

namespace q35 = hyper_parallel::qwen3_5;
namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_qwen3_5_training_test {
namespace {

struct Layout {
  std::string name;
  int64_t dp = 1, tp = 1;
  bool sequence_parallel = false;
  std::string checkpointing = "none";  // an ActivationCheckpointPolicy::parse text
};

struct Run {
  std::vector<double> losses;
  std::vector<std::map<std::string, at::Tensor>> grads;  // each step's, whole
  std::map<std::string, at::Tensor> params;               // whole tensors after the last step
};

at::Tensor whole(const at::Tensor& t) { return hp::is_dtensor(t) ? hp::DTensor(t.detach()).full_tensor() : t.detach().clone(); }

constexpr int64_t kSteps = 6, kRows = 4, kSeq = 72;

// 6 AdamW steps on `layout`, every rank training on its dp rows of the same global batches.
Run train(const std::string& dir, const Layout& layout) {
  const q35::Config c = q35::load_config(dir + "/config.json");
  q35::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = q35::CausalLM(c);
  }
  c10::optional<hp::DeviceMesh> mesh;
  if (layout.dp > 1) mesh = hp::init_device_mesh("cpu", {layout.dp, layout.tp}, {"dp", "tp"});
  else if (layout.tp > 1) mesh = hp::init_device_mesh("cpu", {layout.tp}, {"tp"});
  if (layout.tp > 1) q35::parallelize_qwen3_5_tp(*model, (*mesh)["tp"], layout.sequence_parallel);
  hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::parse(layout.checkpointing));
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, q35::hf_load_options(c));
  if (layout.dp > 1) {
    for (const auto& layer : *model->layers) hp::fully_shard(*layer, (*mesh)["dp"]);
    hp::fully_shard(*model, (*mesh)["dp"]);
  }
  const int64_t dp_rank = layout.dp > 1 ? (*mesh)["dp"].get_local_rank() : 0;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  Run run;
  for (int64_t step = 0; step < kSteps; ++step) {
    const at::Tensor ids = at::randint(c.vocab_size, {kRows, kSeq + 1}, at::detail::createCPUGenerator(500 + step % 2), at::kLong);
    const at::Tensor rows = ids.chunk(layout.dp, 0)[dp_rank];
    const at::Tensor x = rows.narrow(1, 0, kSeq), y = rows.narrow(1, 1, kSeq).reshape({-1});
    const at::Tensor logits = model(x);
    at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y);
    opt.zero_grad();
    loss.backward();
    run.grads.emplace_back();
    for (const auto& p : model->named_parameters()) run.grads.back()[p.key()] = whole(p.value().grad());
    opt.step();
    // The mean over dp of equal row counts is the global batch's loss.
    at::Tensor value = loss.detach().reshape({1});
    if (layout.dp > 1) value = hp::all_reduce(value, hp::ReduceOp::AVG, (*mesh)["dp"].get_group());
    run.losses.push_back(value.item<double>());
  }
  EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << layout.name;
  for (const auto& p : model->named_parameters())
    run.params[p.key()] = whole(p.value());
  return run;
}

void expect_trains_as_one_process(const std::vector<Layout>& layouts) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const std::string d = ref + "/qwen3_5_fp32";
  const Run one = train(d, Layout{"one process"});
  ASSERT_GT(one.losses.front() - one.losses.back(), 0.05) << "the steps must train";
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const Run run = train(d, layout);
    for (size_t step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(run.losses[step], one.losses[step], 1e-5) << "step " << step;
      ASSERT_EQ(run.grads[step].size(), one.grads[step].size());
      // From the same weights, max |g - g_ref| <= 1e-4 max |g_ref| per parameter (the criterion
      // against transformers); after Adam steps, whose lr · m / (sqrt(v) + eps) turns rounding in
      // gradients near zero into weight differences of a small fraction of lr, 1e-3.
      const double rel = step == 0 ? 1e-4 : 1e-3;
      for (const auto& [name, g] : one.grads[step]) EXPECT_TRUE(hp_test::near_relative(run.grads[step].at(name), g, rel)) << name << ", step " << step;
    }
    // The weights within a small fraction of lr (3e-3).
    for (const auto& [name, value] : one.params) EXPECT_TRUE(hp_test::close(run.params.at(name), value, 1e-4, 1e-4)) << name;
  }
}

// The reference checkpoint's shapes with the schedule [linear, full, linear, full], so that each
// of 2 stages holds a layer of each kind; weights drawn (1-D ones away from their init values).
q35::CausalLM pipeline_reference(const std::string& dir) {
  q35::Config c = q35::load_config(dir + "/config.json");
  c.full_attention = {false, true, false, true};
  hp_test::manual_seed(31);
  q35::CausalLM ref(c);
  at::NoGradGuard no_grad;
  for (auto& p : ref->named_parameters())
    if (p.value().dim() == 1) p.value().copy_(at::randn(p.value().sizes()) * 0.3 + (p.key().find("A_log") != std::string::npos ? 0.5 : 0.0));
  return ref;
}

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

void pipeline_matches_one_process(const std::string& dir, int64_t tp, hp::ScheduleKind kind, bool sequence_parallel) {
  const int64_t pp = 2;
  SCOPED_TRACE(c10::str(hp::schedule_name(kind), " pp=", pp, " tp=", tp, sequence_parallel ? " sequence parallel" : ""));
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {pp, tp}, {"pp", "tp"});
  q35::CausalLM ref = pipeline_reference(dir);
  const q35::Config& c = ref->config;
  q35::CausalLM part(c, q35::pipeline_stage_span(c, mesh.get_local_rank(0), pp));
  {
    at::NoGradGuard no_grad;
    auto whole_params = ref->named_parameters();
    for (auto& p : part->named_parameters()) p.value().copy_(whole_params[p.key()]);
  }
  bool kinds[2] = {false, false};
  for (const auto& layer : *part->layers) kinds[layer->as<q35::DecoderLayerImpl>()->self_attn ? 1 : 0] = true;
  EXPECT_TRUE(kinds[0] && kinds[1]) << "each stage holds both kinds of layer";
  if (tp > 1) q35::parallelize_qwen3_5_tp(*part, mesh["tp"], sequence_parallel);
  hp::PipelineStageOptions so;
  if (tp > 1) so.device_mesh = mesh["tp"];
  hp::PipelineStage stage(part.ptr(), mesh.get_local_rank(0), pp, mesh.get_group("pp"), so);
  hp::PipelineSchedule schedule({&stage}, /*microbatches=*/2, lm_loss, kind);
  torch::optim::AdamW opt(part->parameters(), torch::optim::AdamWOptions(3e-3));
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(3e-3));
  for (int64_t step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor ids = at::randint(c.vocab_size, {kRows, kSeq + 1}, at::detail::createCPUGenerator(700 + step % 2), at::kLong);
    const at::Tensor x = ids.narrow(1, 0, kSeq), y = ids.narrow(1, 1, kSeq);
    const at::Tensor loss = schedule.step(stage.is_first() ? x : at::Tensor(), stage.is_last() ? y : at::Tensor());
    const at::Tensor ref_loss = lm_loss(ref(x), y);
    ref_loss.backward();
    if (stage.is_last()) EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5);
    auto ref_params = ref->named_parameters();
    const double rel = step == 0 ? 1e-4 : 1e-3;  // as for the other layouts
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

// 10 AdamW steps of `dp` x `tp` with fully_shard's bf16 mixed precision: the global batch's loss
// each step.
std::vector<double> train_mixed_precision(const std::string& dir, int64_t dp, int64_t tp) {
  const q35::Config c = q35::load_config(dir + "/config.json");
  q35::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = q35::CausalLM(c);
  }
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {dp, tp}, {"dp", "tp"});
  if (tp > 1) q35::parallelize_qwen3_5_tp(*model, mesh["tp"], /*sequence_parallel=*/true);
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, q35::hf_load_options(c));
  hp::FullyShardOptions o;
  o.mp_policy = hp::MixedPrecisionPolicy{at::kBFloat16, at::kFloat, c10::nullopt, true};
  for (const auto& layer : *model->layers) hp::fully_shard(*layer, mesh["dp"], o);
  hp::fully_shard(*model, mesh["dp"], o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  std::vector<double> losses;
  for (int64_t step = 0; step < 10; ++step) {
    const at::Tensor ids = at::randint(c.vocab_size, {kRows, kSeq + 1}, at::detail::createCPUGenerator(900 + step % 2), at::kLong);
    const at::Tensor rows = ids.chunk(dp, 0)[mesh["dp"].get_local_rank()];
    at::Tensor loss = lm_loss(model(rows.narrow(1, 0, kSeq)).to(at::kFloat), rows.narrow(1, 1, kSeq));
    opt.zero_grad();
    loss.backward();
    opt.step();
    losses.push_back(hp::all_reduce(loss.detach().reshape({1}), hp::ReduceOp::AVG, mesh["dp"].get_group())[0].item<double>());
  }
  EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model));
  return losses;
}

// The same in one process: each step a bf16 copy of the fp32 master computes each dp rank's rows;
// their gradients, in float32, are averaged into the master's.
std::vector<double> train_bf16_one_process(const std::string& dir, int64_t dp) {
  const q35::Config c = q35::load_config(dir + "/config.json");
  q35::CausalLM master(c), compute(c);
  hp::load_hf_checkpoint(*master, dir, q35::hf_load_options(c));
  compute->to(at::kBFloat16);
  torch::optim::AdamW opt(master->parameters(), torch::optim::AdamWOptions(3e-3));
  std::vector<double> losses;
  for (int64_t step = 0; step < 10; ++step) {
    const at::Tensor ids = at::randint(c.vocab_size, {kRows, kSeq + 1}, at::detail::createCPUGenerator(900 + step % 2), at::kLong);
    {
      at::NoGradGuard no_grad;
      auto mp = master->named_parameters();
      for (auto& p : compute->named_parameters()) p.value().copy_(mp[p.key()]);
    }
    double loss = 0;
    std::map<std::string, at::Tensor> sum;
    for (int64_t r = 0; r < dp; ++r) {
      const at::Tensor rows = ids.chunk(dp, 0)[r];
      for (auto& p : compute->parameters()) p.mutable_grad() = at::Tensor();
      const at::Tensor l = lm_loss(compute(rows.narrow(1, 0, kSeq)).to(at::kFloat), rows.narrow(1, 1, kSeq));
      l.backward();
      loss += l.item<double>() / static_cast<double>(dp);
      for (const auto& p : compute->named_parameters()) {
        const at::Tensor g = p.value().grad().to(at::kFloat) / static_cast<double>(dp);
        sum[p.key()] = sum.count(p.key()) ? sum[p.key()] + g : g;
      }
    }
    auto mp = master->named_parameters();
    for (auto& [name, g] : sum) mp[name].mutable_grad() = g;
    opt.step();
    losses.push_back(loss);
  }
  return losses;
}

}  // namespace

TEST(HFQwen3_5Training, Bf16MixedPrecisionFollowsOneProcessInBf16) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const int64_t ws = hp::get_world_size();
  if (ws == 1) GTEST_SKIP() << "needs ranks";
  const std::string d = ref + "/qwen3_5_fp32";
  const int64_t dp = 2, tp = ws / 2;
  SCOPED_TRACE(c10::str("dp=", dp, " x tp=", tp));
  const auto mp = train_mixed_precision(d, dp, tp), one = train_bf16_one_process(d, dp);
  for (size_t i = 0; i < mp.size(); ++i) EXPECT_NEAR(mp[i], one[i], 1e-2) << "step " << i;
  EXPECT_NEAR(mp.back(), one.back(), 0.05 * one.back()) << "the final loss";
  EXPECT_GT(one.front() - one.back(), 0.05) << "the steps must train";
}

TEST(HFQwen3_5Training, PipelineStagesOfBothLayerKindsEqualOneProcess) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const int64_t ws = hp::get_world_size();
  if (ws == 1) GTEST_SKIP() << "needs ranks";
  const int64_t tp = ws / 2;
  for (hp::ScheduleKind kind : {hp::ScheduleKind::OneFOneB, hp::ScheduleKind::GPipe})
    pipeline_matches_one_process(ref + "/qwen3_5_fp32", tp, kind, /*sequence_parallel=*/tp > 1 && kind == hp::ScheduleKind::GPipe);
}

TEST(HFQwen3_5Training, SixAdamWStepsUnderTensorParallelEqualOneProcess) {
  const int64_t ws = hp::get_world_size();
  if (ws == 1) GTEST_SKIP() << "needs ranks";
  const std::string tp = "tp=" + std::to_string(ws);
  std::vector<Layout> layouts{{tp, 1, ws, false, "none"},
                              {tp + " sequence parallel", 1, ws, true, "none"},
                              {tp + " sequence parallel, full activation checkpointing", 1, ws, true, "full"},
                              {tp + ", selective activation checkpointing", 1, ws, false, "selective"}};
  if (ws == 4) layouts.push_back({"dp=2 x tp=2, fully_shard over dp, sequence parallel", 2, 2, true, "none"});
  expect_trains_as_one_process(layouts);
}

}  // namespace t_dist_models_qwen3_5_training_test
