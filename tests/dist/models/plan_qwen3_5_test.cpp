// hp_plan's report for Qwen3.5 (models::plan_training with PlanOptions::qwen3_5: Gated DeltaNet and
// gated attention layers under parallelize_qwen3_5_tp, fully_shard over dp), against counts from
// the config alone and against a real run of the same step:
// - per-rank parameter bytes of Qwen3.5-27B (the published config shipped in examples/) at
//   dp=16 x tp=8, 4k tokens: each tensor split as the seed's plan splits it over tp (the 4 KV
//   heads replicated on pairs of the 8 ranks, every other head count divided), then over dp by
//   fully_shard along the first dimension tp leaves whole; the replicated KV bytes named apart;
// - the Gated DeltaNet's recurrent state: the chunked rule keeps one [B, nv/tp, dk, dv] float32
//   state per chunk of 64 tokens for its backward, which one more GDN layer adds to what a
//   microbatch leaves saved;
// - a real 2- and 4-rank job of a small Qwen3.5 (hp_plan --measure under hprun) holds the same
//   parameters, gradients and optimizer state, counts the very same collectives and bytes, and
//   measures an activation peak close to the estimate.
// One process (HP_TEST_NO_PROCESS_GROUP=1): every test makes its own fake world.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include <hyper_parallel/runtime/process_group.h>

#include <hyper_parallel/models/plan.h>
#include <hyper_parallel/models/qwen3_5/config.h>
#include "plan_util.h"

namespace models = hyper_parallel::models;
namespace q35 = hyper_parallel::qwen3_5;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_plan_qwen3_5_test {
namespace {

models::PlanOptions options(const q35::Config& c, const std::string& mesh, bool sp, int64_t batch, int64_t seq, int64_t rank = 0) {
  models::PlanOptions o;
  o.qwen3_5 = c;
  o.mesh = models::parse_mesh(mesh);
  o.sequence_parallel = sp;
  o.batch = batch;
  o.seq = seq;
  o.rank = rank;
  o.device_type = "cpu";
  return o;
}

// fully_shard's piece of `rows` x `cols` elements over dp on dp rank r, split along the rows
// (rows of size n: ranks hold ceil(n / dp) each until they run out).
int64_t dp_piece(int64_t rows, int64_t cols, int64_t dp, int64_t r) {
  const int64_t each = (rows + dp - 1) / dp, begin = std::min(rows, r * each);
  return (std::min(rows, begin + each) - begin) * cols;
}

// Parameter elements dp rank r holds (the same on every tp rank), from the config alone. Over tp:
// Colwise projections by output rows, Rowwise ones by input columns, embedding and lm_head by
// vocabulary rows, the GDN's conv sections, A_log and dt_bias by value head; norms whole; KV heads
// whole on each rank when tp exceeds them. Then fully_shard splits each tensor along the first
// dimension tp leaves whole: a weight's input columns (Colwise), its output rows (Rowwise), a
// norm's only dimension; a conv section [C/tp, 1, K] along its middle dimension of 1 (dp rank 0
// holds it all); A_log and dt_bias [nv/tp], with no dimension left, stay whole on every rank.
int64_t analytic_local_elements(const q35::Config& c, int64_t tp, int64_t dp, int64_t r) {
  const int64_t h = c.hidden_size, hd = c.head_dim, kd = c.linear_num_key_heads * c.linear_key_head_dim;
  const int64_t vd = c.linear_num_value_heads * c.linear_value_head_dim, nv = c.linear_num_value_heads, k = c.linear_conv_kernel_dim;
  const int64_t kv_rows = tp > c.num_kv_heads ? hd : c.num_kv_heads * hd / tp;
  auto by_cols = [&](int64_t rows_local) { return rows_local * dp_piece(h, 1, dp, r); };  // [rows/tp, H], dp over H
  auto by_rows = [&](int64_t cols_local) { return dp_piece(h, cols_local, dp, r); };       // [H, cols/tp], dp over H
  const int64_t mlp = 2 * by_cols(c.intermediate_size / tp) + by_rows(c.intermediate_size / tp);
  const int64_t norms = 2 * dp_piece(h, 1, dp, r);
  int64_t n = 2 * by_cols(c.vocab_size / tp) + dp_piece(h, 1, dp, r);  // embed_tokens, lm_head, norm
  for (bool full : c.full_attention) {
    n += norms + mlp;
    if (full)
      n += by_cols(2 * c.num_heads * hd / tp) + 2 * by_cols(kv_rows) + 2 * dp_piece(hd, 1, dp, r) + by_rows(c.num_heads * hd / tp);
    else
      n += by_cols((2 * kd + vd) / tp) + by_cols(vd / tp) + 2 * by_cols(nv / tp) + (r == 0 ? (2 * kd + vd) / tp * k : 0) + 2 * nv / tp +
           dp_piece(c.linear_value_head_dim, 1, dp, r) + by_rows(vd / tp);
  }
  return n;
}

std::string write_config(const q35::Config& c, const std::string& name) {
  const std::string path = plan_util::env("HP_TEST_TMP") + "/" + name;
  std::ofstream(path) << q35::config_to_json(c);
  return path;
}

q35::Config small_config() {
  q35::Config c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.linear_num_key_heads = 4;
  c.linear_num_value_heads = 8;
  c.linear_key_head_dim = 16;
  c.linear_value_head_dim = 8;
  c.full_attention = {false, false, false, true};
  return c;
}

// small_config with every MLP a sparse block: 8 experts, top-2, beside a shared expert.
q35::Config small_moe_config() {
  q35::Config c = small_config();
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.shared_expert_intermediate_size = 48;
  return c;
}

const models::CommEntry* find_entry(const models::PlanReport& r, const std::string& dim, const std::string& kind, const std::string& phase) {
  for (const auto& e : r.comm)
    if (e.mesh_dim == dim && e.collective == kind && e.phase == phase) return &e;
  return nullptr;
}

// A real run's JSON (rank 0) against the plan: the same parameter, gradient and optimizer bytes and
// the same collectives, count and bytes. `routed`: which entries' bytes follow the real routing
// of MoE tokens (compared by count, their bytes printed).
void expect_real_run_matches(const nlohmann::json& real, const models::PlanReport& fake, const std::string& label,
                             const std::function<bool(const models::CommEntry&)>& routed = nullptr) {
  EXPECT_EQ(real["param_bytes"].get<int64_t>(), fake.param_bytes);
  EXPECT_EQ(real["grad_bytes"].get<int64_t>(), fake.grad_bytes);
  EXPECT_EQ(real["optimizer_bytes"].get<int64_t>(), fake.optimizer_bytes);
  ASSERT_EQ(real["comm"].size(), fake.comm.size());
  for (size_t i = 0; i < fake.comm.size(); ++i) {
    const auto& e = real["comm"][i];
    const auto& f = fake.comm[i];
    const std::string what = f.mesh_dim + " " + f.collective + " " + f.phase;
    EXPECT_EQ(e["mesh_dim"].get<std::string>() + " " + e["collective"].get<std::string>() + " " + e["phase"].get<std::string>(), what);
    EXPECT_EQ(e["count"].get<int64_t>(), f.count) << what;
    if (routed && routed(f))
      std::printf("%s, %s: real %lld bytes, planned %lld\n", label.c_str(), what.c_str(), static_cast<long long>(e["bytes"].get<int64_t>()),
                  static_cast<long long>(f.bytes));
    else
      EXPECT_EQ(e["bytes"].get<int64_t>(), f.bytes) << what;
  }
}

}  // namespace

// Qwen3.5-397B-A17B (the published config shipped in examples/) at 32k tokens on 1,024 ranks with
// every dimension: pp = 8 stages, dp = 2, cp = 4 (ulysses attention; the Gated DeltaNet's 2 key
// heads per tp rank do not split over 4, so its state summaries are gathered), ep = 2, tp = 8
// with sequence parallelism; batch 1 (1 microbatch), bf16 compute over a float32 master and
// moments, full activation checkpointing. Every stage fits in 80 GiB; the Gated DeltaNet's state,
// the summaries' and the halo's bytes and the experts' all-to-all bytes are the analytic counts.
TEST(PlanReportQwen3_5AtScale, Qwen3_5_397B_A17BAt32kTokensOn1024RanksFitsAndIsTheFormulas) {
  const q35::Config c = q35::load_config(plan_util::repo_file("examples/qwen3/configs/qwen3_5_397b_a17b.json"));
  ASSERT_TRUE(c.is_moe());
  ASSERT_EQ(c.num_experts, 512);
  const int64_t pp = 8, cp = 4, tp = 8, seq = 32768, b = 1, local = b * seq / cp;
  const int64_t conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim;
  const int64_t nv = c.linear_num_value_heads / tp, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  // Ranks: pp outermost (128 per stage), then dp x cp as one dimension (dp_cp, 16 ranks apart, cp
  // the inner factor), ep (8), tp. Stage 0 at cp rank 0 (sends a halo, receives none) and the last
  // stage (lm_head) at the last cp rank.
  for (int64_t rank : {0, 7 * 128 + 48}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    models::PlanOptions o = options(c, "pp=8,dp=2,cp=4,ep=2,tp=8", /*sp=*/true, b, seq, rank);
    o.microbatches = 1;
    o.mixed_precision = at::kBFloat16;
    o.activation_checkpointing = hyper_parallel::ActivationCheckpointPolicy::full();
    o.device_type = "cuda";
    const models::PlanReport r = models::plan_training(o);
    EXPECT_EQ(r.num_stages, pp);
    EXPECT_EQ(r.cp_mode, "ulysses");
    EXPECT_EQ(r.linear_cp_mode, "all_gather");
    std::printf("397B-A17B rank %lld (stage %lld): step peak %.2f GiB, activation peak %.2f GiB, parameters %.2f GiB\n",
                static_cast<long long>(rank), static_cast<long long>(r.stage), r.step_peak_bytes / 1073741824.0,
                r.activation_peak_bytes / 1073741824.0, r.param_bytes / 1073741824.0);
    EXPECT_LT(r.step_peak_bytes, int64_t{80} << 30);
    const q35::StageSpan span = q35::pipeline_stage_span(c, r.stage, pp);
    int64_t linear = 0, layers = span.end_layer - span.first_layer;
    for (int64_t l = span.first_layer; l < span.end_layer; ++l) linear += c.full_attention[static_cast<size_t>(l)] ? 0 : 1;
    // The recurrent state: per linear layer B · nv/tp · dk · dv float32.
    EXPECT_EQ(r.gdn_state_bytes, linear * b * nv * dk * dv * 4);
    // all_gather of [S | M] per linear layer: B · nv/tp · dk · (dv + dk) float32 (its recompute
    // under full checkpointing runs in backward, beside the reduce-scatter of its gradient).
    const auto* gather = find_entry(r, "cp", "all_gather", "forward");
    ASSERT_NE(gather, nullptr);
    EXPECT_EQ(gather->count, linear);
    EXPECT_EQ(gather->bytes, linear * b * nv * dk * (dv + dk) * 4);
    // The halo: the last K-1 pre-conv inputs of this rank's conv channels (bf16) to the next cp rank.
    const bool last_cp = (rank / 16) % cp == cp - 1;
    const auto* halo = find_entry(r, "cp", "send", "forward");
    if (last_cp) {
      EXPECT_EQ(halo, nullptr);
    } else {
      ASSERT_NE(halo, nullptr);
      EXPECT_EQ(halo->bytes, linear * b * (c.linear_conv_kernel_dim - 1) * (conv_dim / tp) * 2);
    }
    // The routed experts' all-to-all per MoE layer (every layer): the tokens this rank holds (its
    // cp shard, whole over tp) times top-k, out and back, plus the counts.
    const auto* a2a = find_entry(r, "ep", "all_to_all", "forward");
    ASSERT_NE(a2a, nullptr);
    EXPECT_EQ(a2a->count, 3 * layers);
    EXPECT_EQ(a2a->bytes, layers * (2 * local * c.num_experts_per_tok * c.hidden_size * 2 + c.num_experts * 8));
    // Ulysses on the full-attention layers: 4 all-to-alls each.
    const auto* ulysses = find_entry(r, "cp", "all_to_all", "forward");
    ASSERT_NE(ulysses, nullptr);
    EXPECT_EQ(ulysses->count, 4 * (layers - linear));
  }
}

// Qwen3.5-27B at 128k tokens: cp = 8 (ring attention, the Gated DeltaNet's summaries gathered),
// dp = 4, tp = 8 with sequence parallelism, bf16 over float32, full checkpointing.
TEST(PlanReportQwen3_5AtScale, Qwen3_5_27BAt128kTokensWithContextParallelismFits) {
  const q35::Config c = q35::load_config(plan_util::repo_file("examples/qwen3/configs/qwen3_5_27b.json"));
  models::PlanOptions o = options(c, "dp=4,cp=8,tp=8", /*sp=*/true, 1, 131072);
  o.cp_mode = "ring";
  o.mixed_precision = at::kBFloat16;
  o.activation_checkpointing = hyper_parallel::ActivationCheckpointPolicy::full();
  o.device_type = "cuda";
  const models::PlanReport r = models::plan_training(o);
  std::printf("27B at 128k, dp=4 cp=8 tp=8: step peak %.2f GiB, activation peak %.2f GiB\n", r.step_peak_bytes / 1073741824.0,
              r.activation_peak_bytes / 1073741824.0);
  EXPECT_EQ(r.linear_cp_mode, "all_gather");
  EXPECT_LT(r.step_peak_bytes, int64_t{80} << 30);
  // Every linear layer gathers one summary per rank: 48 layers of B · 6 · 128 · 256 float32.
  const auto* gather = find_entry(r, "cp", "all_gather", "forward");
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->count, 48);
  EXPECT_EQ(gather->bytes, 48 * 6 * 128 * 256 * 4);
}

// The compositions the planner used to refuse, each planned and then run for real at 8 ranks
// (hp_plan --measure under hprun) with a small Qwen3.5-MoE: cp with pp, cp with ep, and pp with
// MoE layers. The real run holds the planned parameters, gradients and
// optimizer state and issues the planned collectives (count and bytes; what the routed experts
// move follows the real routing, which the plan takes as balanced: compared by count).
TEST(PlanCompositionsMeasured, ContextPipelineAndExpertParallelismComposeAtEightRanks) {
  const q35::Config c = small_moe_config();
  const std::string config = write_config(c, "plan_qwen3_5_moe_small.json");
  for (const std::string mesh : {"pp=2,cp=2,tp=2", "cp=2,ep=2,tp=2", "pp=2,ep=2,tp=2"}) {
    SCOPED_TRACE(mesh);
    models::PlanOptions o = options(c, mesh, /*sp=*/true, 2, 96);
    o.microbatches = 1;
    const models::PlanReport fake = models::plan_training(o);
    const std::string out = plan_util::real_run(config, mesh, 8, true, 2, 96, "--microbatches 1");
    nlohmann::json real;
    ASSERT_TRUE(plan_util::rank0_json(out, real)) << "no JSON from the real run:\n" << out;
    // What the experts move follows the real routing: the all-to-all of the routed tokens (the
    // way back carries what this rank's experts received), and with experts over [ep, tp] the tp
    // all-reduce of their outputs. The plan takes the routing as balanced.
    expect_real_run_matches(real, fake, mesh, [&](const models::CommEntry& f) {
      return (f.mesh_dim == "ep" && f.collective == "all_to_all") ||
             (f.mesh_dim == "tp" && f.collective == "all_reduce" && mesh.find("ep=") != std::string::npos);
    });
  }
}

TEST(PlanReportQwen3_5Fake, Qwen3_5_27BParameterBytesAreTheAnalyticCount) {
  const q35::Config c = q35::load_config(plan_util::repo_file("examples/qwen3/configs/qwen3_5_27b.json"));
  ASSERT_EQ(c.dtype, at::kBFloat16);
  // 27B at tp = dp = 1: the published size.
  EXPECT_NEAR(static_cast<double>(analytic_local_elements(c, 1, 1, 0)), 27.0e9, 0.6e9);
  for (int64_t rank : {0, 1}) {  // dp rank 0 holds the conv sections, dp rank 1 none
    SCOPED_TRACE("rank " + std::to_string(rank * 8));
    const models::PlanReport r = models::plan_training(options(c, "dp=16,tp=8", true, 1, 4096, rank * 8));
    const int64_t n = analytic_local_elements(c, 8, 16, rank);
    EXPECT_EQ(r.param_bytes, 2 * n);
    EXPECT_EQ(r.grad_bytes, r.param_bytes);
    EXPECT_EQ(r.optimizer_bytes, 2 * n * 4);  // Adam's two float32 moments
    // 16 full-attention layers, each rank one whole KV head of k_proj and v_proj, split over dp.
    EXPECT_EQ(r.kv_replica_bytes, 2 * 16 * 2 * c.head_dim * c.hidden_size / 16);
    EXPECT_FALSE(hyper_parallel::is_initialized());
    std::printf("Qwen3.5-27B, dp=16 x tp=8, 4096 tokens, rank %lld:\n%s", static_cast<long long>(rank * 8), r.to_table().c_str());
  }
}

// One more Gated DeltaNet layer keeps at least its chunk states: (chunks) x [B, nv/tp, dk, dv]
// float32, 64 chunks of 64 tokens at 4096 (Qwen3.5-27B's linear heads at tp=8, float32).
TEST(PlanReportQwen3_5Fake, EachGatedDeltaNetLayerKeepsItsChunkStates) {
  q35::Config c = q35::load_config(plan_util::repo_file("examples/qwen3/configs/qwen3_5_27b.json"));
  c.dtype = at::kFloat;
  c.vocab_size = 1024;
  auto saved = [&](int64_t layers) {
    q35::Config k = c;
    k.num_layers = layers;
    k.full_attention.assign(static_cast<size_t>(layers), false);
    models::PlanOptions o = options(k, "tp=8", false, 1, 4096);
    return models::plan_training(o).microbatch_saved_bytes;  // what the forward leaves for backward
  };
  const int64_t one_layer = saved(2) - saved(1);
  const int64_t b = 1, heads = c.linear_num_value_heads / 8, chunks = 4096 / 64;
  const int64_t states = chunks * b * heads * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  std::printf("one Gated DeltaNet layer at 4096 tokens, tp=8: %lld bytes saved, of which chunk states %lld\n",
              static_cast<long long>(one_layer), static_cast<long long>(states));
  EXPECT_GE(one_layer, states);
}

// The same step run for real (hp_plan --measure under hprun) counts what the fake world counts.
TEST(PlanReportQwen3_5Measured, ARealRunCountsWhatThePlanCounts) {
  const q35::Config c = small_config();
  const std::string config = write_config(c, "plan_qwen3_5_small.json");
  struct Case {
    std::string mesh;
    int nproc;
    bool sp;
  };
  for (const Case& k : {Case{"tp=2", 2, false}, Case{"tp=4", 4, true}, Case{"dp=2,tp=2", 4, true}}) {
    SCOPED_TRACE(k.mesh);
    const models::PlanReport fake = models::plan_training(options(c, k.mesh, k.sp, 2, 96));
    const std::string out = plan_util::real_run(config, k.mesh, k.nproc, k.sp, 2, 96);
    nlohmann::json real;
    ASSERT_TRUE(plan_util::rank0_json(out, real)) << "no JSON from the real run:\n" << out;
    EXPECT_EQ(real["model"].get<std::string>(), "qwen3_5");
    expect_real_run_matches(real, fake, k.mesh);
    const double ratio = static_cast<double>(fake.activation_peak_bytes) / real["activation_peak_bytes"].get<double>();
    std::printf("Qwen3.5 activation peak, %s: estimate / measured %.3f\n", k.mesh.c_str(), ratio);
    EXPECT_GT(ratio, 0.8);
    EXPECT_LT(ratio, 1.25);
  }
}

}  // namespace t_dist_models_plan_qwen3_5_test
