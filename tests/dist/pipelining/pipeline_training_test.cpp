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

#include <functional>

#include "../nn/training_util.h"

using namespace training_test;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_pipelining_pipeline_training_test {
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
    // Clipping over every stage's gradients: the norm and the scale are one process's.
    const double norm = hp::clip_grad_norm_(params, 0.5, 2.0, false, mesh["pp"]).item<double>();
    EXPECT_NEAR(norm, hp::clip_grad_norm_(hp::unique_parameters(*ref), 0.5).item<double>(), 1e-5 * (1 + norm));
    opt.step();
    ref_opt.step();
    // Every rank holds as many stages; the ranks of a stage's dp and tp dims share its names.
    for (const auto& m : parts.models) EXPECT_TRUE(hp_test::replicas_bitwise_equal(*m));
    opt.zero_grad();
    ref_opt.zero_grad();
  }
}

// `l` under each schedule (interleaved with 2 virtual stages per rank), adjusted per schedule.
void each_schedule_matches_one_process(const Layout& l, const std::function<void(Layout&)>& adjust = {}) {
  for (hp::ScheduleKind k : {hp::ScheduleKind::GPipe, hp::ScheduleKind::OneFOneB, hp::ScheduleKind::Interleaved1F1B}) {
    Layout run = l;
    run.kind = k;
    run.virtual_stages = k == hp::ScheduleKind::Interleaved1F1B ? 2 : 1;
    if (adjust) adjust(run);
    train_matches_one_process(run);
  }
}

}  // namespace

TEST(PipelineTrainingDist, TwoStagesEveryScheduleAndMicrobatchCountMatchesOneProcess) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  for (int64_t m : {1, 2, 4}) {
    Layout l;
    l.microbatches = m;
    each_schedule_matches_one_process(l);
  }
}

TEST(PipelineTrainingDist, FourStagesEveryScheduleMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  Layout l;
  l.pp = 4;
  l.microbatches = 4;
  each_schedule_matches_one_process(l);
}

TEST(PipelineTrainingDist, PipelineTimesTensorParallelMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  Layout l;
  l.tp = 2;
  each_schedule_matches_one_process(l, [](Layout& run) {
    run.microbatches = run.kind == hp::ScheduleKind::GPipe ? 4 : 2;
    run.sequence_parallel = run.kind != hp::ScheduleKind::OneFOneB;  // the DTensor stream and the plain one
  });
}

TEST(PipelineTrainingDist, PipelineTimesDataTimesTensorParallelMatchesOneProcess) {
  if (hp::get_world_size() != 8) GTEST_SKIP() << "8 ranks";
  Layout l;
  l.dp = 2;
  l.tp = 2;
  each_schedule_matches_one_process(l);
}

TEST(PipelineTrainingDist, PipelineTimesFullyShardedDataParallelReducesOncePerStep) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  Layout l;
  l.dp = 2;
  each_schedule_matches_one_process(l);
}

// pp x dp = 2 x 2 with FSDP's bf16 compute (fp32 reduction) and full activation checkpointing,
// 1F1B over 2 microbatches, against one process: the fp32 master's bf16 copy computes each data
// rank's rows, the gradients are cast to fp32 and averaged (mixed_precision_test's reference).
TEST(PipelineTrainingDist, PipelineTimesDataParallelBf16AndFullCheckpointingMatchesOneProcess) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "4 ranks";
  Layout l;
  l.dp = 2;
  l.mixed_precision = l.checkpointing = true;
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {l.pp, l.dp, l.tp}, {"pp", "dp", "tp"});
  const qwen3::Config c = pp_config(4);
  hp_test::manual_seed(11);
  qwen3::CausalLM ref(c);
  Parts parts = build_parts(c, ref, mesh, l);
  hp::Schedule1F1B schedule(*parts.stages.front(), l.microbatches, lm_loss);
  torch::optim::AdamW opt(hp::unique_parameters(*parts.models.front()), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ref_opt(hp::unique_parameters(*ref), torch::optim::AdamWOptions(1e-3));
  const bool first = parts.stages.front()->is_first(), last = parts.stages.front()->is_last();
  const int64_t dp_rank = mesh.get_local_rank(1);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor tokens = token_batch(c.vocab_size, kRowsPerDataRank * l.dp, kSeq, 700 + static_cast<uint64_t>(step));
    const at::Tensor mine = dp_rows(tokens, dp_rank, l.dp);
    const at::Tensor loss = schedule.step(first ? mine.narrow(1, 0, kSeq) : at::Tensor(), last ? mine.narrow(1, 1, kSeq) : at::Tensor());
    std::map<std::string, at::Tensor> sum;
    double my_ref_loss = 0;
    for (int64_t r = 0; r < l.dp; ++r) {
      qwen3::CausalLM copy(c);
      {
        at::NoGradGuard no_grad;
        auto master = ref->named_parameters();
        for (auto& p : copy->named_parameters()) p.value().copy_(master[p.key()]);
      }
      copy->to(at::kBFloat16);
      const at::Tensor rows = dp_rows(tokens, r, l.dp);
      at::Tensor ref_loss = qwen3::causal_lm_loss(copy(rows.narrow(1, 0, kSeq)), rows.narrow(1, 1, kSeq));
      ref_loss.backward();
      if (r == dp_rank) my_ref_loss = ref_loss.item<double>();
      for (const auto& p : copy->named_parameters()) {
        const at::Tensor g = p.value().grad().to(at::kFloat) / static_cast<double>(l.dp);
        sum[p.key()] = sum.count(p.key()) ? sum[p.key()] + g : g;
      }
    }
    if (last) EXPECT_NEAR(loss.item<double>(), my_ref_loss, 1e-2 * (1 + std::abs(my_ref_loss)));
    auto master = ref->named_parameters();
    for (const auto& p : parts.models.front()->named_parameters()) {
      ASSERT_EQ(p.value().grad().scalar_type(), at::kFloat) << p.key();
      EXPECT_TRUE(hp_test::close(whole(p.value().grad()), sum.at(p.key()), 1e-2, 1e-2)) << p.key();
    }
    for (auto& [name, g] : sum) master[name].mutable_grad() = g;
    opt.step();
    ref_opt.step();
    for (const auto& m : parts.models) EXPECT_TRUE(hp_test::replicas_bitwise_equal(*m));
    opt.zero_grad();
    ref_opt.zero_grad();
  }
}

// 1F1B keeps at most p microbatches of activations on stage 0, GPipe all m: counted by the
// schedule and seen by MemoryTracker as the transient peak of one step.
TEST(PipelineTrainingDist, OneFOneBHoldsAtMostPMicrobatchesWhereGPipeHoldsM) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {2, 1, 1}, {"pp", "dp", "tp"});
  qwen3::Config c = pp_config(4);
  c.hidden_size = 64;
  c.intermediate_size = 128;
  hp_test::manual_seed(11);
  qwen3::CausalLM ref(c);
  const int64_t m = 8, seq = 64;
  const at::Tensor tokens = token_batch(c.vocab_size, m, seq, 9);
  std::map<hp::ScheduleKind, std::pair<int64_t, int64_t>> seen;  // kind -> (in flight, transient peak bytes)
  for (hp::ScheduleKind k : {hp::ScheduleKind::GPipe, hp::ScheduleKind::OneFOneB}) {
    Layout l;
    l.kind = k;
    Parts parts = build_parts(c, ref, mesh, l);
    hp::PipelineSchedule schedule(raw(parts), m, lm_loss, k);
    const bool first = parts.stages.front()->is_first();
    hp::MemoryTracker mem("cpu");
    schedule.step(first ? tokens.narrow(1, 0, seq) : at::Tensor(), first ? at::Tensor() : tokens.narrow(1, 1, seq));
    seen[k] = {schedule.max_in_flight(), mem.transient_peak_bytes()};
  }
  if (hp::get_rank() == 0) {
    EXPECT_EQ(seen[hp::ScheduleKind::GPipe].first, m);
    EXPECT_EQ(seen[hp::ScheduleKind::OneFOneB].first, 2);
    // Activations dominate the step's transient memory: about m/p times less with 1F1B.
    EXPECT_LT(2 * seen[hp::ScheduleKind::OneFOneB].second, seen[hp::ScheduleKind::GPipe].second)
        << "1F1B peak " << seen[hp::ScheduleKind::OneFOneB].second << " B, GPipe " << seen[hp::ScheduleKind::GPipe].second << " B";
    std::printf("stage 0 transient peak: GPipe %lld B (%lld microbatches), 1F1B %lld B (%lld)\n",
                static_cast<long long>(seen[hp::ScheduleKind::GPipe].second), static_cast<long long>(seen[hp::ScheduleKind::GPipe].first),
                static_cast<long long>(seen[hp::ScheduleKind::OneFOneB].second), static_cast<long long>(seen[hp::ScheduleKind::OneFOneB].first));
  }
}

// Its own job (2 ranks; rank 1 leaves): a declared input shape that disagrees with what the
// previous stage sends is refused by name on the receiving stage, which then exits; stage 0 names
// it. Bad schedule arguments are refused before anything runs.
TEST(PipelineFault, DeclaredShapeMismatchIsRefusedAndTheStageThatLeftIsNamed) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {2, 1, 1}, {"pp", "dp", "tp"});
  const qwen3::Config c = pp_config(2);
  const int64_t r = mesh.get_local_rank(0);
  qwen3::CausalLM part(c, qwen3::pipeline_stage_span(c, r, 2));
  EXPECT_EQ(part->named_parameters().contains("layers." + std::to_string(r) + ".self_attn.q_proj.weight"), true);
  hp::PipelineStageOptions o;
  if (r == 1) o.input_shape = {2, 8, 31};  // hidden is 32
  hp::PipelineStage stage(part.ptr(), r, 2, mesh.get_group("pp"), o);
  hp::ScheduleGPipe schedule(stage, 1, lm_loss);
  const at::Tensor tokens = token_batch(c.vocab_size, 2, 8, 1);
  if (r == 0) {
    // Stage 0 sends and then waits for a gradient that never comes: stage 1 refused its input.
    try {
      schedule.step(tokens.narrow(1, 0, 8), at::Tensor());
      ADD_FAILURE() << "stage 0 finished a step whose next stage refused its input";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("receiving from rank 1"), std::string::npos) << e.what_without_backtrace();
      std::printf("stage 0 named the stage that left: %s\n", std::string(e.what_without_backtrace()).substr(0, 160).c_str());
    }
  } else {
    try {
      schedule.step(at::Tensor(), tokens.narrow(1, 1, 8));
      ADD_FAILURE() << "a mismatching input was accepted";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what_without_backtrace())
                    .find("hyper_parallel::PipelineStage: stage 1 declared inputs of shape [2, 8, 31] (input_shape), but stage 0 sends Float[2, 8, 32]"),
                std::string::npos)
          << e.what_without_backtrace();
    }
    std::fflush(stdout);
    std::_Exit(0);  // stage 0 learns of it as a peer that left
  }
  EXPECT_THROW(hp::ScheduleGPipe(stage, 0, lm_loss), c10::ValueError);
  EXPECT_THROW(hp::PipelineSchedule({&stage}, 2, lm_loss, hp::ScheduleKind::Interleaved1F1B), c10::ValueError);
  EXPECT_THROW(hp::PipelineStage(part.ptr(), 1 - r, 2, mesh.get_group("pp")), c10::ValueError);  // the other rank's stage
  EXPECT_THROW(qwen3::pipeline_stage_span(c, 0, 3), c10::ValueError);  // 2 layers, 3 stages
}

// Its own job (2 ranks): rank 1 exits in the middle of a GPipe step (before its third
// microbatch's forward); rank 0, waiting for a gradient, raises naming it within the timeout.
TEST(PipelineFault, RankThatExitsMidScheduleIsNamed) {
  if (hp::get_world_size() != 2) GTEST_SKIP() << "2 ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {2, 1, 1}, {"pp", "dp", "tp"});
  const qwen3::Config c = pp_config(2);
  const int64_t r = mesh.get_local_rank(0);
  qwen3::CausalLM part(c, qwen3::pipeline_stage_span(c, r, 2));
  int forwards = 0;
  if (r == 1)
    part->register_forward_pre_hook([&](hnn::Module&, const std::vector<c10::IValue>&) -> c10::optional<std::vector<c10::IValue>> {
      if (++forwards == 3) {
        std::fflush(stdout);
        std::_Exit(0);
      }
      return c10::nullopt;
    });
  hp::PipelineStage stage(part.ptr(), r, 2, mesh.get_group("pp"));
  hp::ScheduleGPipe schedule(stage, 4, lm_loss);
  const at::Tensor tokens = token_batch(c.vocab_size, 4, 8, 1);
  try {
    schedule.step(r == 0 ? tokens.narrow(1, 0, 8) : at::Tensor(), r == 1 ? tokens.narrow(1, 1, 8) : at::Tensor());
    ADD_FAILURE() << "the step finished without rank 1";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_NE(m.find("hyper_parallel::recv: receiving from rank 1"), std::string::npos) << m;
    std::printf("stage 0 named the stage that left: %s\n", m.substr(0, 160).c_str());
  }
}

}  // namespace t_dist_pipelining_pipeline_training_test
