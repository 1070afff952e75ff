// hp_plan's report (qwen3::plan_training, a fake world on the meta device) against formulas
// nobody here wrote and against a real run of the same step:
// - per-rank parameter bytes: the analytic count of the config's matrices, split as Megatron-LM
//   splits them (Shoeybi et al. 2019) and then over dp;
// - communication per decoder layer: Megatron's 2 all-reduces of b*s*h forward and 2 backward
//   (TP), or 2 all-gathers and 2 reduce-scatters each way with sequence parallelism (Korthikanti
//   et al. 2022); FSDP's all-gathers and reduce-scatters: the parameter bytes over dp;
// - plans the real run refuses are refused with the same message;
// - a real 2- and 4-rank job (hp_plan --measure under hprun) counts the very same collectives
//   and bytes, and its measured activation peak is compared with the estimate.
// One process (HP_TEST_NO_PROCESS_GROUP=1): every test makes its own fake world.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <hyper_parallel/runtime/process_group.h>

#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3/plan.h>
#include "../../common/error_message.h"
#include "../nn/training_util.h"
#include "plan_util.h"

namespace qwen3 = hyper_parallel::qwen3;
namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_plan_test {
namespace {

using qwen3::Config;
using plan_util::env;
using plan_util::real_run;
using plan_util::repo_file;
using plan_util::run;
using qwen3::PlanOptions;
using qwen3::PlanReport;

Config small_config() {
  Config c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 3;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  return c;
}

PlanOptions options(const Config& c, const std::string& mesh, bool sp = false, int64_t batch = 2, int64_t seq = 32) {
  PlanOptions o;
  o.config = c;
  o.mesh = qwen3::parse_mesh(mesh);
  o.sequence_parallel = sp;
  o.batch = batch;
  o.seq = seq;
  o.device_type = "cpu";
  return o;
}

// Parameter elements one rank holds, from the config alone: q/k/v/gate/up split by rows over tp,
// o/down by columns, embedding and lm_head by vocabulary rows, norms whole; then fully_shard
// divides every tensor over dp.
int64_t analytic_local_elements(const Config& c, int64_t tp, int64_t dp) {
  const int64_t h = c.hidden_size, i = c.intermediate_size, d = c.head_dim;
  const int64_t q = c.num_heads * d, kv = c.num_kv_heads * d;
  const int64_t layer = (h * q + 2 * h * kv + q * h + 3 * h * i) / tp + 2 * h + 2 * d;
  const int64_t vocab = c.vocab_size * h / tp * (c.tie_word_embeddings ? 1 : 2);
  return (vocab + c.num_layers * layer + h) / dp;
}

// The entry of `r.comm` for (mesh_dim, collective, phase); zero counts when there is none.
qwen3::CommEntry entry(const PlanReport& r, const std::string& dim, const std::string& kind, const std::string& phase) {
  for (const auto& e : r.comm)
    if (e.mesh_dim == dim && e.collective == kind && e.phase == phase) return e;
  return {dim, kind, phase, 0, 0, 0};
}

int64_t elem(const Config& c) { return static_cast<int64_t>(c10::elementSize(c.dtype)); }

std::string write_config(const Config& c, const std::string& name) {
  const std::string path = env("HP_TEST_TMP") + "/" + name;
  std::ofstream(path) << qwen3::config_to_json(c);
  return path;
}


}  // namespace

TEST(PlanReportFake, ParameterBytesAreTheAnalyticCount) {
  // Qwen3-32B's config: the analytic count at tp = dp = 1 is the published 32.8B parameters.
  const Config c32 = qwen3::load_config(repo_file("examples/qwen3/configs/qwen3_32b.json"));
  EXPECT_NEAR(static_cast<double>(analytic_local_elements(c32, 1, 1)), 32.8e9, 0.05e9);
  const Config c72 = qwen3::load_config(repo_file("examples/qwen3/configs/qwen3_72b_dense.json"));
  Config tied = small_config();
  tied.tie_word_embeddings = true;
  struct Case {
    Config c;
    std::string mesh;
    int64_t tp, dp;
  };
  for (const Case& k : {Case{small_config(), "tp=4", 4, 1}, Case{small_config(), "dp=4,tp=2", 2, 4},
                        Case{tied, "dp=2,tp=4", 4, 2}, Case{c32, "dp=16,tp=8", 8, 16}, Case{c72, "dp=128,tp=8", 8, 128},
                        Case{c72, "dp=64", 1, 64}}) {
    const PlanReport r = qwen3::plan_training(options(k.c, k.mesh, false, 1, 16));
    const int64_t n = analytic_local_elements(k.c, k.tp, k.dp);
    EXPECT_EQ(r.param_bytes, n * elem(k.c)) << k.mesh;
    EXPECT_EQ(r.grad_bytes, r.param_bytes) << k.mesh;
    EXPECT_EQ(r.optimizer_bytes, 2 * n * 4) << k.mesh;  // Adam's two float32 moments
    EXPECT_FALSE(hyper_parallel::is_initialized());     // the fake world is gone again
  }
}

// More tensor-parallel ranks than KV heads: each rank holds one whole KV head (k and v: 2 * h * d
// per layer) instead of a 1/tp share, and the report names those replicated bytes.
TEST(PlanReportFake, ReplicatedKVHeadsAreCountedOnEveryReplica) {
  Config c = small_config();
  c.num_kv_heads = 2;
  const int64_t tp = 8, h = c.hidden_size, d = c.head_dim;
  const PlanReport r = qwen3::plan_training(options(c, "tp=8", false, 1, 16));
  const int64_t shared = analytic_local_elements(c, tp, 1) - c.num_layers * 2 * h * c.num_kv_heads * d / tp;
  const int64_t kv = c.num_layers * 2 * h * d;
  EXPECT_EQ(r.param_bytes, (shared + kv) * elem(c));
  EXPECT_EQ(r.kv_replica_bytes, kv * elem(c));
  EXPECT_NE(r.to_table().find("of which KV replicas"), std::string::npos);
  EXPECT_NE(r.to_json().find("\"kv_replica_bytes\": " + std::to_string(kv * elem(c))), std::string::npos);
}

// TP alone (Shoeybi et al. 2019, section 3): per decoder layer 2 all-reduces of b*s*h forward
// (after attention and after the MLP) and 2 backward (the inputs' gradients). The embedding
// split over the vocabulary adds one forward, lm_head's input gradient one backward, and the
// replicated logits one all-gather. Beyond Megatron: the q/k norms' weights are replicated over
// heads split across tp, so their gradients (head_dim elements each) are all-reduced backward.
TEST(PlanReportFake, TensorParallelCommunicationIsMegatrons) {
  const Config c = small_config();
  const int64_t L = c.num_layers, b = 2, s = 32, a = b * s * c.hidden_size * elem(c);
  for (const std::string mesh : {"tp=4", "dp=2,tp=2"}) {
    const PlanReport r = qwen3::plan_training(options(c, mesh, false, b, s));
    const auto fwd = entry(r, "tp", "all_reduce", "forward");
    EXPECT_EQ(fwd.count, 2 * L + 1) << mesh;
    EXPECT_EQ(fwd.full_bytes, (2 * L + 1) * a) << mesh;
    const auto bwd = entry(r, "tp", "all_reduce", "backward");
    EXPECT_EQ(bwd.count, 2 * L + 1 + 2 * L) << mesh;
    EXPECT_EQ(bwd.full_bytes, (2 * L + 1) * a + 2 * L * c.head_dim * elem(c)) << mesh;
    const auto logits = entry(r, "tp", "all_gather", "forward");
    EXPECT_EQ(logits.count, 1) << mesh;
    EXPECT_EQ(logits.full_bytes, b * s * c.vocab_size * elem(c)) << mesh;
    EXPECT_EQ(entry(r, "tp", "reduce_scatter", "forward").count, 0) << mesh;
  }
}

// Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): each all-reduce becomes a
// reduce-scatter and an all-gather of the same b*s*h tensor: per layer 2 all-gathers and 2
// reduce-scatters forward and the same backward. The norms' weights are replicated over the
// split sequence, so their gradients are all-reduced (h elements each, head_dim for q/k).
TEST(PlanReportFake, SequenceParallelCommunicationIsKorthikantis) {
  const Config c = small_config();
  const int64_t L = c.num_layers, b = 2, s = 32, a = b * s * c.hidden_size * elem(c);
  const int64_t n = 2 * L + 1;  // the layers' two each, and the embedding's / lm_head's input
  const PlanReport r = qwen3::plan_training(options(c, "tp=4", true, b, s));
  EXPECT_EQ(entry(r, "tp", "all_gather", "forward").count, n + 1);  // + the logits
  EXPECT_EQ(entry(r, "tp", "all_gather", "forward").full_bytes, n * a + b * s * c.vocab_size * elem(c));
  EXPECT_EQ(entry(r, "tp", "all_gather", "forward").bytes * 4, entry(r, "tp", "all_gather", "forward").full_bytes);
  for (const char* phase : {"forward", "backward"}) {
    EXPECT_EQ(entry(r, "tp", "reduce_scatter", phase).count, n) << phase;
    EXPECT_EQ(entry(r, "tp", "reduce_scatter", phase).full_bytes, n * a) << phase;
  }
  EXPECT_EQ(entry(r, "tp", "all_gather", "backward").count, n);
  EXPECT_EQ(entry(r, "tp", "all_gather", "backward").full_bytes, n * a);
  EXPECT_EQ(entry(r, "tp", "all_reduce", "forward").count, 0);
  EXPECT_EQ(entry(r, "tp", "all_reduce", "backward").count, 4 * L + 1);
  EXPECT_EQ(entry(r, "tp", "all_reduce", "backward").full_bytes,
            (2 * L * c.head_dim + (2 * L + 1) * c.hidden_size) * elem(c));
}

// fully_shard over dp: forward gathers every parameter once (each rank sends its shard: the
// parameter bytes per rank); backward gathers the blocks again (the root keeps its own) and
// reduce-scatters every gradient (each rank sends the whole TP-local gradient and its flags).
TEST(PlanReportFake, FsdpMovesTheParameterBytesOverDp) {
  for (const bool sp : {false, true}) {
    Config c = small_config();
    c.dtype = at::kBFloat16;
    const int64_t dp = 4, tp = 2, L = c.num_layers;
    const PlanReport r = qwen3::plan_training(options(c, "dp=4,tp=2", sp));
    const int64_t root = (2 * c.vocab_size * c.hidden_size / tp + c.hidden_size) / dp * elem(c);
    EXPECT_EQ(entry(r, "dp", "all_gather", "forward").count, L + 1);
    EXPECT_EQ(entry(r, "dp", "all_gather", "forward").bytes, r.param_bytes);
    EXPECT_EQ(entry(r, "dp", "all_gather", "forward").full_bytes, r.param_bytes * dp);
    EXPECT_EQ(entry(r, "dp", "all_gather", "backward").count, L);
    EXPECT_EQ(entry(r, "dp", "all_gather", "backward").bytes, r.param_bytes - root);
    EXPECT_EQ(entry(r, "dp", "reduce_scatter", "backward").count, L + 1);
    // Each rank's row also carries one flag per parameter (whether its backward made a gradient):
    // 11 tensors a layer, plus the embedding, the final norm and lm_head.
    EXPECT_EQ(entry(r, "dp", "reduce_scatter", "backward").bytes, r.param_bytes * dp + dp * (11 * L + 3) * elem(c));
    EXPECT_EQ(entry(r, "dp", "all_reduce", "backward").count + entry(r, "dp", "all_reduce", "forward").count, 0);
  }
}

// Plans the real run refuses fail with the real run's message: heads that do not divide tp, and
// an MLP width that does not.
TEST(PlanReportFake, InvalidPlansFailAsTheRealRunDoes) {
  Config heads = small_config();  // 8 query heads over tp=3
  heads.vocab_size = 255;          // divisible: the heads are what fails
  Config width = heads;
  width.num_heads = 6;
  width.num_kv_heads = 3;
  width.hidden_size = 48;
  width.intermediate_size = 100;  // 100 columns over tp=3
  for (const auto& [c, name, expect] : {std::make_tuple(heads, "plan_heads.json", "heads"),
                                        std::make_tuple(width, "plan_width.json", "100")}) {
    const std::string fake = hp_test::error_message([&] { qwen3::plan_training(options(c, "tp=3")); });
    EXPECT_NE(fake.find(expect), std::string::npos) << fake;
    EXPECT_FALSE(hyper_parallel::is_initialized());
    const std::string real = real_run(write_config(c, name), "tp=3", 3, false, 2, 32);
    EXPECT_NE(real.find(fake), std::string::npos) << "fake: " << fake << "\nreal: " << real;
  }
  EXPECT_NE(hp_test::error_message([&] { qwen3::plan_training(options(small_config(), "sp=2,tp=2")); }).find("'sp'"), std::string::npos);
}

// The same step run for real (hp_plan --measure: 2 and 4 CPU ranks under hprun) counts exactly
// the collectives and bytes the fake world counts, holds the same parameters and gradients, and
// measures an activation peak (MemoryTracker on the CPU allocator) close to the meta estimate.
TEST(PlanReportMeasured, ARealRunCountsWhatThePlanCounts) {
  const Config c = small_config();
  const std::string config = write_config(c, "plan_small.json");
  struct Case {
    std::string mesh;
    int nproc;
    bool sp;
    std::string ac = "none";
    bool bf16 = false;
  };
  // Activation checkpointing and mixed precision change what is kept and what is gathered: the
  // plan on meta follows the real run there too.
  for (const Case& k : {Case{"tp=2", 2, false}, Case{"tp=4", 4, true}, Case{"dp=2,tp=2", 4, true},
                        Case{"dp=2,tp=2", 4, true, "full"}, Case{"dp=2,tp=2", 4, true, "selective", true},
                        Case{"dp_replicate=2,dp=2", 4, false, "full:2", true}}) {
    SCOPED_TRACE(k.mesh + " activation checkpointing " + k.ac + (k.bf16 ? " bf16" : ""));
    PlanOptions o = options(c, k.mesh, k.sp, 2, 32);
    o.activation_checkpointing = hp::ActivationCheckpointPolicy::parse(k.ac);
    if (k.bf16) o.mixed_precision = at::kBFloat16;
    const PlanReport fake = qwen3::plan_training(o);
    std::string out = real_run(config, k.mesh, k.nproc, k.sp, 2, 32,
                               "--activation-checkpointing " + k.ac + (k.bf16 ? " --mixed-precision bf16" : ""));
    nlohmann::json real;
    ASSERT_TRUE(plan_util::rank0_json(out, real)) << k.mesh << ": no JSON from the real run:\n" << out;
    EXPECT_TRUE(real["measured"].get<bool>());
    EXPECT_EQ(real["param_bytes"].get<int64_t>(), fake.param_bytes) << k.mesh;
    EXPECT_EQ(real["grad_bytes"].get<int64_t>(), fake.grad_bytes) << k.mesh;
    EXPECT_EQ(real["optimizer_bytes"].get<int64_t>(), fake.optimizer_bytes) << k.mesh;
    ASSERT_EQ(real["comm"].size(), fake.comm.size()) << k.mesh << "\n" << out;
    for (size_t i = 0; i < fake.comm.size(); ++i) {
      const auto& e = real["comm"][i];
      const auto& f = fake.comm[i];
      EXPECT_EQ(e["mesh_dim"].get<std::string>() + e["collective"].get<std::string>() + e["phase"].get<std::string>(),
                f.mesh_dim + f.collective + f.phase);
      EXPECT_EQ(e["count"].get<int64_t>(), f.count) << k.mesh << " " << f.collective;
      EXPECT_EQ(e["bytes"].get<int64_t>(), f.bytes) << k.mesh << " " << f.collective;
      EXPECT_EQ(e["full_bytes"].get<int64_t>(), f.full_bytes) << k.mesh << " " << f.collective;
    }
    const double measured = static_cast<double>(real["activation_peak_bytes"].get<int64_t>());
    const double ratio = static_cast<double>(fake.activation_peak_bytes) / measured;
    std::printf("activation peak, %s%s ac=%s%s: estimate %lld B, measured %.0f B, estimate / measured %.3f\n", k.mesh.c_str(),
                k.sp ? " sp" : "", k.ac.c_str(), k.bf16 ? " bf16" : "", static_cast<long long>(fake.activation_peak_bytes), measured, ratio);
    EXPECT_GT(ratio, 0.8) << k.mesh;
    EXPECT_LT(ratio, 1.25) << k.mesh;
  }
}

// The plan's activation peak falls with each policy, and mixed precision halves the gathers.
TEST(PlanReportFake, CheckpointingAndMixedPrecisionChangeThePlan) {
  const Config c = small_config();
  std::map<std::string, int64_t> peak;
  for (const char* ac : {"none", "selective", "full"}) {
    PlanOptions o = options(c, "dp=2,tp=2", true, 2, 64);
    o.activation_checkpointing = hp::ActivationCheckpointPolicy::parse(ac);
    peak[ac] = qwen3::plan_training(o).activation_peak_bytes;
  }
  EXPECT_LT(peak["full"], peak["selective"]);
  EXPECT_LT(peak["selective"], peak["none"]);
  PlanOptions o = options(c, "dp=2,tp=2", true, 2, 64);
  const PlanReport fp32 = qwen3::plan_training(o);
  o.mixed_precision = at::kBFloat16;
  const PlanReport bf16 = qwen3::plan_training(o);
  EXPECT_EQ(bf16.param_bytes, fp32.param_bytes);  // the master stays float32
  EXPECT_EQ(2 * entry(bf16, "dp", "all_gather", "forward").bytes, entry(fp32, "dp", "all_gather", "forward").bytes);
  EXPECT_EQ(entry(bf16, "dp", "reduce_scatter", "backward").bytes, entry(fp32, "dp", "reduce_scatter", "backward").bytes);
  o.mesh = qwen3::parse_mesh("tp=4");
  EXPECT_THROW(qwen3::plan_training(o), c10::ValueError);  // mixed precision is fully_shard's
  EXPECT_EQ(qwen3::mesh_from_degrees(128, 2, 8), (std::vector<std::pair<std::string, int64_t>>{{"dp_replicate", 2}, {"dp", 8}, {"tp", 8}}));
  EXPECT_THROW(qwen3::mesh_from_degrees(128, 3, 8), c10::ValueError);
}

// The plan counts the embedding's gradient as the backward makes it: this rank's vocabulary rows
// only. The activation peak's slope in the vocabulary (from 64k to 152k rows, tp=4, a short
// sequence so that the logits are small against the table) stays far below a whole row of the
// table's gradient per vocabulary entry, which is what a backward that builds the whole
// vocabulary's gradient (and frees it after slicing) adds to the peak.
TEST(PlanReportFake, TheEmbeddingGradientIsItsVocabularyRowsInThePeak) {
  std::map<int64_t, int64_t> peak;
  Config c = small_config();
  c.hidden_size = 512;
  c.intermediate_size = 512;
  c.num_layers = 1;
  for (const int64_t vocab : {65536, 151936}) {
    c.vocab_size = vocab;
    PlanOptions o = options(c, "tp=4", false, 1, 4);
    o.loss_parallel = true;
    peak[vocab] = qwen3::plan_training(o).activation_peak_bytes;
  }
  const double per_row = static_cast<double>(peak[151936] - peak[65536]) / (151936 - 65536);
  const double whole_row = static_cast<double>(c.hidden_size) * elem(c);
  EXPECT_LT(per_row, whole_row / 2) << "activation peak " << peak[65536] << " -> " << peak[151936] << " B";
}

// The plan's activations per layer (its peak's slope from 2 to 6 layers, one rank) are the
// per-layer formula of tests/dist/nn/training_util.h for each policy, within 10%.
TEST(PlanReportFake, PerLayerActivationsAreTheLayerFormula) {
  const training_test::Shape m;
  for (const char* ac : {"none", "selective", "full"}) {
    int64_t peak[2];
    for (int k = 0; k < 2; ++k) {
      PlanOptions o = options(training_test::layer_config(m, k == 0 ? 2 : 6), "tp=1", false, m.b, m.s);
      o.activation_checkpointing = hp::ActivationCheckpointPolicy::parse(ac);
      peak[k] = qwen3::plan_training(o).activation_peak_bytes;
    }
    const double slope = static_cast<double>(peak[1] - peak[0]) / 4;
    const double formula = static_cast<double>(std::string(ac) == "none"        ? training_test::layer_bytes_none(m)
                                               : std::string(ac) == "selective" ? training_test::layer_bytes_selective(m, false)
                                                                                : training_test::layer_bytes_full(m, false));
    EXPECT_NEAR(slope, formula, 0.1 * formula) << ac;
  }
}

// Qwen3-30B-A3B and Qwen3-235B-A22B (their published configs, 2 layers to keep it short) with
// experts over ep: per MoE layer the forward sends each rank's T·k routed tokens (T = b·s) to
// the experts' ranks and back, 2·T·k·h·dtype bytes through all-to-all ((ep−1)/ep of them to other
// ranks under uniform routing), plus the per-expert counts (E int64); the backward the same
// tokens again. Each rank holds E/ep experts, 3·I·h elements each, split over tp, then over dp
// by fully_shard (float32 master with mixed precision).
TEST(PlanReportFake, ExpertParallelAllToAllAndExpertBytesAreTheAnalyticCount) {
  for (const char* name : {"qwen3_30b_a3b.json", "qwen3_235b_a22b.json"}) {
    Config c = qwen3::load_config(repo_file(std::string("examples/qwen3/configs/") + name));
    c.num_layers = 2;
    const int64_t b = 1, s = 64, tokens = b * s, k = c.num_experts_per_tok, h = c.hidden_size;
    for (const std::string mesh : {"ep=8", "dp=2,ep=8,tp=4"}) {
      SCOPED_TRACE(std::string(name) + " " + mesh);
      PlanOptions o = options(c, mesh, false, b, s);
      const PlanReport r = qwen3::plan_training(o);
      const auto fwd = entry(r, "ep", "all_to_all", "forward");
      EXPECT_EQ(fwd.count, 3 * c.num_layers);
      EXPECT_EQ(fwd.bytes, c.num_layers * (2 * tokens * k * h * elem(c) + c.num_experts * 8));
      const auto bwd = entry(r, "ep", "all_to_all", "backward");
      EXPECT_EQ(bwd.count, 2 * c.num_layers);
      EXPECT_EQ(bwd.bytes, c.num_layers * 2 * tokens * k * h * elem(c));
      const int64_t tp = mesh.find("tp=4") != std::string::npos ? 4 : 1, dp = mesh.find("dp=2") != std::string::npos ? 2 : 1;
      const int64_t expert_elements = c.num_layers * (c.num_experts / 8) * 3 * c.moe_intermediate_size * h / tp / dp;
      // The experts are most of the parameters: the rest (attention, embeddings, router) adds less.
      EXPECT_GE(r.param_bytes, expert_elements * elem(c));
      EXPECT_LT(r.param_bytes, expert_elements * elem(c) + analytic_local_elements([&] {
                  Config dense = c;
                  dense.intermediate_size = 0;
                  return dense;
                }(), tp, 1) * elem(c) + c.num_layers * c.num_experts * h * elem(c));
    }
  }
}

// pp = 8 stages of the 72B dense config over dp = 16 x tp = 8 (1024 ranks), 32 microbatches: each
// stage holds its 10 layers (and the embedding or norm and lm_head) split over tp and dp, sends
// b s h bf16 bytes per microbatch each way (divided by tp with sequence parallelism), holds
// min(m, p - stage) microbatches under 1F1B and m under GPipe, and reports the bubble (p-1)/(m+p-1).
TEST(PlanReportFake, PipelineStagesMemoryAndTransfersAreTheAnalyticCount) {
  const Config c = qwen3::load_config(repo_file("examples/qwen3/configs/qwen3_72b_dense.json"));
  const int64_t pp = 8, dp = 16, tp = 8, m = 32, batch = 32, seq = 4096, h = c.hidden_size;
  const int64_t d = c.head_dim, q = c.num_heads * d, kv = c.num_kv_heads * d, i = c.intermediate_size;
  const int64_t layer = (h * q + 2 * h * kv + q * h + 3 * h * i) / tp + 2 * h + 2 * d;
  for (const bool sp : {true, false})
    for (const char* schedule : {"1f1b", "gpipe"})
      for (const int64_t stage : {int64_t{0}, int64_t{3}, pp - 1}) {
        SCOPED_TRACE(c10::str(schedule, " stage ", stage, sp ? " sp" : ""));
        PlanOptions o = options(c, "pp=8,dp=16,tp=8", sp, batch, seq);
        o.schedule = schedule;
        o.microbatches = m;
        o.rank = stage * dp * tp;  // pp is the outermost dimension
        const PlanReport r = qwen3::plan_training(o);
        EXPECT_EQ(r.stage, stage);
        EXPECT_EQ(r.num_stages, pp);
        const int64_t layers = c.num_layers / pp;
        const int64_t elements = (layers * layer + (stage == 0 ? c.vocab_size * h / tp : 0) +
                                  (stage == pp - 1 ? c.vocab_size * h / tp + h : 0)) / dp;
        EXPECT_EQ(r.param_bytes, elements * elem(c));
        const int64_t p2p = (batch / m) * seq * h * elem(c) / (sp ? tp : 1);
        EXPECT_EQ(r.p2p_bytes_per_microbatch, p2p);
        EXPECT_EQ(entry(r, "pp", "send", "forward").bytes, stage + 1 < pp ? m * p2p : 0);
        EXPECT_EQ(entry(r, "pp", "recv", "forward").count, stage > 0 ? m : 0);
        EXPECT_EQ(entry(r, "pp", "send", "backward").bytes, stage > 0 ? m * p2p : 0);
        EXPECT_EQ(entry(r, "pp", "recv", "backward").count, stage + 1 < pp ? m : 0);
        EXPECT_EQ(r.microbatches_in_flight, std::string(schedule) == "gpipe" ? m : std::min(m, pp - stage));
        EXPECT_DOUBLE_EQ(r.bubble_fraction, 7.0 / 39.0);
        EXPECT_GE(r.activation_peak_bytes, r.microbatches_in_flight * r.microbatch_saved_bytes);
        // FSDP reduces once per step, whatever m: the stage's parameter bytes, over dp, and a
        // flag per parameter tensor in each rank's row (11 a layer, the embedding, norm and lm_head).
        const int64_t tensors = 11 * layers + (stage == 0 ? 1 : 0) + (stage == pp - 1 ? 2 : 0);
        EXPECT_EQ(entry(r, "dp", "reduce_scatter", "backward").bytes, r.param_bytes * dp + dp * tensors * elem(c));
        // Tensor parallelism's collectives run every microbatch: m times those of a step of one
        // microbatch of the same rows.
        if (stage == 3) {
          PlanOptions one = o;
          one.batch = batch / m;
          one.microbatches = 1;
          const PlanReport r1 = qwen3::plan_training(one);
          for (const char* kind : {"all_gather", "reduce_scatter", "all_reduce"})
            for (const char* phase : {"forward", "backward"})
              EXPECT_EQ(entry(r, "tp", kind, phase).bytes, m * entry(r1, "tp", kind, phase).bytes) << kind << " " << phase;
        }
      }
  PlanOptions bad = options(c, "pp=8,dp=16,tp=8", true, 30, seq);
  bad.microbatches = 32;
  EXPECT_THROW(qwen3::plan_training(bad), c10::ValueError);
}

// Context parallelism at 32k tokens: dp = 8 x cp = 4 x tp = 8 (256 ranks) for the 32B and 72B
// configs, bf16, sequence parallelism and full activation checkpointing. Their 64 query heads
// over 8 KV heads leave a tp rank 8 query heads and 1 KV head, so "auto" picks ulysses with the
// key head repeated to cp = 4. Checked against the formulas, per layer L:
// - ulysses: 4 all-to-alls forward of the local q [b, S/cp, 8, d], k and v (repeated to 4 heads)
//   and the output; backward 4 more plus the recompute's 4;
// - allgather_kv: K and V all-gathered over cp, each rank receiving (cp-1)/cp of them;
// - fully_shard shards over dp x cp (32 ranks): the parameters are the analytic count / (tp · 32);
// - the activations saved after forward are per token: 1/cp of the same plan without cp;
// - ulysses and allgather_kv hold the float32 probabilities [b, H/tp/cp, S, S] or [b, H/tp, S/cp, S];
//   ring attention holds one block at a time, under half of that.
TEST(PlanReportFake, ContextParallelAt32kTokensIsTheFormulas) {
  for (const char* file : {"qwen3_32b.json", "qwen3_72b_dense.json"}) {
    SCOPED_TRACE(file);
    const Config c = qwen3::load_config(repo_file(std::string("examples/qwen3/configs/") + file));
    const int64_t dp = 8, cp = 4, tp = 8, b = 1, seq = 32768, h = c.hidden_size, d = c.head_dim, L = c.num_layers;
    const int64_t q = c.num_heads * d, kv = c.num_kv_heads * d, i = c.intermediate_size, e = elem(c);
    ASSERT_EQ(c.num_heads / tp, 8);
    ASSERT_EQ(c.num_kv_heads / tp, 1);
    const auto plan = [&](const std::string& mesh, const std::string& mode) {
      PlanOptions o = options(c, mesh, true, b, seq);
      o.activation_checkpointing = hyper_parallel::ActivationCheckpointPolicy::full();
      o.cp_mode = mode;
      return qwen3::plan_training(o);
    };
    const PlanReport u = plan("dp=8,cp=4,tp=8", "auto");
    EXPECT_EQ(u.cp, cp);
    EXPECT_EQ(u.cp_mode, "ulysses");
    EXPECT_NE(u.to_table().find("context parallel: cp 4, ulysses attention, 8192 of 32768 positions per rank"), std::string::npos);
    const int64_t layer = (h * q + 2 * h * kv + q * h + 3 * h * i) / tp + 2 * h + 2 * d;
    EXPECT_EQ(u.param_bytes, (L * layer + 2 * c.vocab_size * h / tp + h) / (dp * cp) * e);
    const int64_t q_local = b * (seq / cp) * (c.num_heads / tp) * d * e, kv_repeated = b * (seq / cp) * cp * d * e;
    EXPECT_EQ(entry(u, "cp", "all_to_all", "forward").count, 4 * L);
    EXPECT_EQ(entry(u, "cp", "all_to_all", "forward").bytes, L * (2 * q_local + 2 * kv_repeated));
    EXPECT_EQ(entry(u, "cp", "all_to_all", "backward").count, 8 * L);
    const int64_t probabilities = b * (c.num_heads / tp / cp) * seq * seq * 4;
    EXPECT_GE(u.activation_peak_bytes, probabilities);
    // Without cp (dp = 32: the same sharding of the parameters), every saved activation is cp times larger.
    const PlanReport whole = plan("dp=32,tp=8", "auto");
    EXPECT_EQ(whole.param_bytes, u.param_bytes);
    EXPECT_EQ(u.microbatch_saved_bytes * cp, whole.microbatch_saved_bytes);
    std::printf("%s at dp=8, cp=4, tp=8, 32k tokens (ulysses): params %.1f MiB, saved after forward %.1f MiB, activation peak %.2f GiB, "
                "step peak %.2f GiB (without cp at dp=32: saved %.1f MiB, activation peak %.2f GiB)\n",
                file, u.param_bytes / 1048576.0, u.microbatch_saved_bytes / 1048576.0, u.activation_peak_bytes / 1073741824.0,
                u.step_peak_bytes / 1073741824.0, whole.microbatch_saved_bytes / 1048576.0, whole.activation_peak_bytes / 1073741824.0);
    if (std::string(file) == "qwen3_72b_dense.json") {
      const PlanReport g = plan("dp=8,cp=4,tp=8", "allgather_kv");
      EXPECT_EQ(g.cp_mode, "allgather_kv");
      const int64_t kv_local = b * (seq / cp) * (c.num_kv_heads / tp) * d * e;
      const qwen3::CommEntry gathered = entry(g, "cp", "all_gather", "forward");
      EXPECT_EQ(gathered.count, 2 * L);
      EXPECT_EQ(gathered.full_bytes - gathered.bytes, 2 * L * (cp - 1) * kv_local);  // what arrives: (cp-1)/cp of K and V
      EXPECT_EQ(entry(g, "cp", "reduce_scatter", "backward").count, 2 * L);
      EXPECT_GE(g.activation_peak_bytes, b * (c.num_heads / tp) * (seq / cp) * seq * 4);
    } else {
      const PlanReport ring = plan("dp=8,cp=4,tp=8", "ring");
      EXPECT_EQ(ring.cp_mode, "ring");
      EXPECT_EQ(entry(ring, "cp", "send", "forward").count, 2 * (cp - 1) * L);
      EXPECT_LT(ring.activation_peak_bytes, u.activation_peak_bytes / 2);
      std::printf("%s ring: activation peak %.2f GiB\n", file, ring.activation_peak_bytes / 1073741824.0);
    }
  }
  PlanOptions bad = options(qwen3::load_config(repo_file("examples/qwen3/configs/qwen3_32b.json")), "dp=8,cp=4,tp=8", true, 1, 32766);
  EXPECT_THROW(qwen3::plan_training(bad), c10::ValueError);  // not a multiple of 2 · cp
}

}  // namespace t_dist_models_plan_test
