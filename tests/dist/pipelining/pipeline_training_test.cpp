// Pipeline-parallel training of a Qwen3 model against one process: for 5 AdamW steps the loss
// (the mean over microbatches of each microbatch's mean cross-entropy) and every parameter's
// gradient equal those of the whole model on the whole batch. Layouts: pp = 2 with GPipe, 1F1B
// and interleaved 1F1B (2 virtual stages) at 1, 2 and 4 microbatches; pp = 4; pp x tp = 2 x 2
// (sequence parallel, DTensors across the stage boundary); pp x dp x tp = 2 x 2 x 2 with FSDP; and
// pp x dp = 2 x 2 with FSDP, bf16 mixed precision and full activation checkpointing, against one
// process computing in bf16. Also: stage FQNs are the whole model's, 1F1B holds at most p
// microbatches where GPipe holds m (counted and measured with MemoryTracker), a shape that
// disagrees with the declared one is refused, and clip_grad_norm_ over the stages equals one
// process's norm.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include "../nn/training_util.h"

using namespace training_test;
namespace hnn = hyper_parallel::nn;

namespace {

struct Layout {
  int64_t pp = 2, dp = 1, tp = 1;
  hp::ScheduleKind kind = hp::ScheduleKind::OneFOneB;
  int64_t microbatches = 2, virtual_stages = 1;
  bool sequence_parallel = true, mixed_precision = false, checkpointing = false;
};

qwen3::Config pp_config(int64_t layers) {
  qwen3::Config c = small_config();
  c.num_layers = layers;
  return c;
}

constexpr int64_t kSeq = 8, kRowsPerDataRank = 4;

// This rank's stages of `c`, with the values of `ref` (copied by FQN: a stage's FQNs are the
// whole model's), parallelized as the layout says.
struct Parts {
  std::vector<qwen3::CausalLM> models;
  std::vector<std::unique_ptr<hp::PipelineStage>> stages;
};
Parts build_parts(const qwen3::Config& c, const qwen3::CausalLM& ref, const hp::DeviceMesh& mesh, const Layout& l) {
  Parts parts;
  const int64_t pp_rank = mesh.get_local_rank(0), n = l.pp * l.virtual_stages;
  for (int64_t i = 0; i < l.virtual_stages; ++i) {
    const int64_t s = pp_rank + i * l.pp;
    qwen3::CausalLM part(c, qwen3::pipeline_stage_span(c, s, n));
    {
      at::NoGradGuard no_grad;
      auto whole_params = ref->named_parameters();
      for (auto& p : part->named_parameters()) p.value().copy_(whole_params[p.key()]);
    }
    if (l.tp > 1) qwen3::parallelize_qwen3_tp(*part, mesh["tp"], l.sequence_parallel);
    if (l.checkpointing) hp::apply_activation_checkpointing(*part, hp::ActivationCheckpointPolicy{});
    if (l.dp > 1) {
      hp::FullyShardOptions o;
      if (l.mixed_precision) o.mp_policy = hp::MixedPrecisionPolicy{at::kBFloat16, at::kFloat, c10::nullopt, true};
      const hp::DeviceMesh dp_mesh = mesh["dp"];
      for (const auto& layer : *part->layers) hp::fully_shard(*layer, dp_mesh, o);
      hp::fully_shard(*part, dp_mesh, o);
    }
    hp::PipelineStageOptions so;
    if (l.tp > 1) so.device_mesh = mesh["tp"];
    parts.stages.push_back(std::make_unique<hp::PipelineStage>(part.ptr(), s, n, mesh.get_group("pp"), so));
    parts.models.push_back(part);
  }
  return parts;
}

std::vector<hp::PipelineStage*> raw(const Parts& p) {
  std::vector<hp::PipelineStage*> out;
  for (const auto& s : p.stages) out.push_back(s.get());
  return out;
}

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) { return qwen3::causal_lm_loss(logits, targets); }

void train_matches_one_process(const Layout& l) {
  ASSERT_EQ(l.pp * l.dp * l.tp, hp::get_world_size());
  SCOPED_TRACE(c10::str(hp::schedule_name(l.kind), " pp=", l.pp, " dp=", l.dp, " tp=", l.tp, " m=", l.microbatches, " v=", l.virtual_stages));
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {l.pp, l.dp, l.tp}, {"pp", "dp", "tp"});
  const qwen3::Config c = pp_config(std::max<int64_t>(4, l.pp * l.virtual_stages));
  hp_test::manual_seed(11);
  qwen3::CausalLM ref(c);
  Parts parts = build_parts(c, ref, mesh, l);
  hp::PipelineSchedule schedule(raw(parts), l.microbatches, lm_loss, l.kind);
  std::vector<at::Tensor> params;
  for (const auto& m : parts.models)
    for (const at::Tensor& p : hp::unique_parameters(*m)) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ref_opt(hp::unique_parameters(*ref), torch::optim::AdamWOptions(1e-3));
  const bool first = parts.stages.front()->is_first(), last = parts.stages.back()->is_last();
  const int64_t dp_rank = mesh.get_local_rank(1);
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor tokens = token_batch(c.vocab_size, kRowsPerDataRank * l.dp, kSeq, 500 + static_cast<uint64_t>(step));
    const at::Tensor mine = dp_rows(tokens, dp_rank, l.dp);
    hp::CommDebugMode comm;
    const at::Tensor loss = schedule.step(first ? mine.narrow(1, 0, kSeq) : at::Tensor(), last ? mine.narrow(1, 1, kSeq) : at::Tensor());
    EXPECT_EQ(loss.defined(), last);
    if (l.dp > 1) {
      // FSDP reduces each group's gradients once per step, whatever the microbatch count: one
      // reduce-scatter per fully_shard group with parameters (every layer, and the root of a stage
      // that holds the embedding or the head).
      int64_t groups = 0;
      for (const auto& m : parts.models) groups += static_cast<int64_t>(m->layers->size()) + (m->embed_tokens || m->lm_head ? 1 : 0);
      EXPECT_EQ(comm.get_comm_group_stats()[mesh.get_group("dp").ranks()]["backward"]["reduce_scatter"].count, groups) << comm.summary();
    }
    // One process: the whole batch; this data rank's rows give its loss.
    const at::Tensor logits = ref(tokens.narrow(1, 0, kSeq));
    qwen3::causal_lm_loss(logits, tokens.narrow(1, 1, kSeq)).backward();
    if (last) EXPECT_NEAR(loss.item<double>(), qwen3::causal_lm_loss(dp_rows(logits, dp_rank, l.dp), mine.narrow(1, 1, kSeq)).item<double>(), 2e-6);
    auto ref_params = ref->named_parameters();
    for (const auto& m : parts.models)
      for (const auto& p : m->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
        EXPECT_TRUE(hp_test::close(whole(p.value().grad()), ref_params[p.key()].grad(), 1e-4, 2e-6)) << p.key();
      }
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
}

}  // namespace

TEST(PipelineTrainingDist, TwoStagesEverySchedulAndMicrobatchCountMatchesOneProcess) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  for (hp::ScheduleKind k : {hp::ScheduleKind::GPipe, hp::ScheduleKind::OneFOneB, hp::ScheduleKind::Interleaved1F1B})
    for (int64_t m : {1, 2, 4}) {
      Layout l;
      l.kind = k;
      l.microbatches = m;
      l.virtual_stages = k == hp::ScheduleKind::Interleaved1F1B ? 2 : 1;
      train_matches_one_process(l);
    }
}

TEST(PipelineTrainingDist, FourStagesEveryScheduleMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  for (hp::ScheduleKind k : {hp::ScheduleKind::GPipe, hp::ScheduleKind::OneFOneB, hp::ScheduleKind::Interleaved1F1B}) {
    Layout l;
    l.pp = 4;
    l.kind = k;
    l.microbatches = 4;
    l.virtual_stages = k == hp::ScheduleKind::Interleaved1F1B ? 2 : 1;
    train_matches_one_process(l);
  }
}

TEST(PipelineTrainingDist, PipelineTimesTensorParallelMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  for (hp::ScheduleKind k : {hp::ScheduleKind::GPipe, hp::ScheduleKind::OneFOneB, hp::ScheduleKind::Interleaved1F1B}) {
    Layout l;
    l.tp = 2;
    l.kind = k;
    l.microbatches = k == hp::ScheduleKind::GPipe ? 4 : 2;
    l.virtual_stages = k == hp::ScheduleKind::Interleaved1F1B ? 2 : 1;
    l.sequence_parallel = k != hp::ScheduleKind::OneFOneB;  // the DTensor stream and the plain one
    train_matches_one_process(l);
  }
}

TEST(PipelineTrainingDist, PipelineTimesDataTimesTensorParallelMatchesOneProcess) {
  if (hp::get_world_size() != 8) GTEST_SKIP() << "8 ranks";
  for (hp::ScheduleKind k : {hp::ScheduleKind::GPipe, hp::ScheduleKind::OneFOneB, hp::ScheduleKind::Interleaved1F1B}) {
    Layout l;
    l.dp = 2;
    l.tp = 2;
    l.kind = k;
    l.microbatches = 2;
    l.virtual_stages = k == hp::ScheduleKind::Interleaved1F1B ? 2 : 1;
    train_matches_one_process(l);
  }
}

TEST(PipelineTrainingDist, PipelineTimesFullyShardedDataParallelReducesOncePerStep) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  for (hp::ScheduleKind k : {hp::ScheduleKind::GPipe, hp::ScheduleKind::OneFOneB, hp::ScheduleKind::Interleaved1F1B}) {
    Layout l;
    l.dp = 2;
    l.kind = k;
    l.microbatches = 2;
    l.virtual_stages = k == hp::ScheduleKind::Interleaved1F1B ? 2 : 1;
    train_matches_one_process(l);
  }
}
