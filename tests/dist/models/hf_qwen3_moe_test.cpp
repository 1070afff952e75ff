// Qwen3-MoE checkpoints written by Hugging Face transformers (tests/tools/hf_reference.py: random
// weights with wide router weights, no near tie in any routing decision, one dense layer through
// mlp_only_layers) against transformers' logits, router logits, load-balancing loss and greedy
// tokens, in every expert layout this world size allows:
// - the generation default (from_pretrained over every rank: attention TP, experts split over
//   the same ranks, which hold the same tokens: ExpertParallel("all_reduce"));
// - ep over every rank with different tokens per rank (ExpertParallel("all_to_all"));
// - ep x tp = 2 x 2 (attention TP over tp, ExpertTensorParallel on [ep, tp]).
// Our saves carry HF's per-expert keys; bad input fails on every rank with the model unchanged.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/runtime/collectives.h>

#include <filesystem>
#include <fstream>

#include "../../common/hf_reference.h"
#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>
#include <hyper_parallel/models/qwen3/pretrained.h>

namespace qwen3 = hyper_parallel::qwen3;
namespace hnn = hyper_parallel::nn;

using namespace hp_test;
namespace fs = std::filesystem;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_hf_qwen3_moe_test {
namespace {

const char* kVariants[] = {"moe_fp32_e4", "moe_bf16_e8_sharded"};

#define REQUIRE_REFERENCE(dir) HP_REQUIRE_HF_REFERENCE(dir, "moe_fp32_e4")

at::Tensor expected(const std::string& variant_dir, const char* name) { return hp_test::hf_expected(variant_dir, name); }

// The model of `dir`'s config on meta, split by `split`, then this rank's shards loaded.
template <class Split>
qwen3::CausalLM loaded(const std::string& dir, Split&& split) {
  qwen3::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = qwen3::CausalLM(qwen3::load_config(dir + "/config.json"));
  }
  split(*model);
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, {qwen3::hf_key});
  model->eval();
  return model;
}

// Rows `rows` of the reference batch through `model`: logits, and router logits [layers, T, E].
struct Outputs {
  at::Tensor logits, router_logits, aux_loss;
};
Outputs run_rows(qwen3::CausalLMImpl& model, const std::string& dir, const std::vector<int64_t>& rows,
                 const hp::Group& data_group = hp::Group()) {
  at::Tensor ids = expected(dir, "input_ids").index_select(0, at::tensor(rows, at::kLong));
  c10::InferenceMode inference;
  Outputs o;
  o.logits = model.forward(ids);
  std::vector<at::Tensor> router;
  for (const auto& r : model.router_logits()) router.push_back(r);
  o.router_logits = at::stack(router);
  // Inference records no router statistics: the loss of this forward's router logits.
  o.aux_loss = hyper_parallel::nn::load_balancing_loss(model.router_logits(), model.config.num_experts, model.config.num_experts_per_tok,
                                                       data_group);
  return o;
}

// The reference's router logits of `rows` ([layers, rows * S, E]).
at::Tensor router_rows(const std::string& dir, const std::vector<int64_t>& rows) {
  const at::Tensor all = expected(dir, "router_logits");  // [layers, B * S, E]
  const int64_t s = expected(dir, "input_ids").size(1);
  std::vector<at::Tensor> parts;
  for (int64_t r : rows) parts.push_back(all.narrow(1, r * s, s));
  return at::cat(parts, 1);
}

std::vector<std::vector<int64_t>> prompts_of(const std::string& dir) { return hp_test::hf_prompts(dir); }

std::vector<at::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back((hp::is_dtensor(p) ? hp::DTensor(p).full_tensor() : p).detach().clone());
  return out;
}

}  // namespace

TEST(HFQwen3Moe, ConfigIsReadAsTransformersWritesIt) {
  REQUIRE_REFERENCE(ref);
  const qwen3::Config c = qwen3::load_config(ref + "/moe_bf16_e8_sharded/config.json");
  EXPECT_EQ(c.num_experts, 8);  // written as num_local_experts by transformers 5
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_TRUE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  const qwen3::Config back = qwen3::config_from_json(qwen3::config_to_json(c));
  EXPECT_EQ(back.num_experts, 8);
  EXPECT_EQ(back.mlp_only_layers, c.mlp_only_layers);
  EXPECT_TRUE(back.norm_topk_prob);
}

// The generation default at every world size: from_pretrained over all ranks.
TEST(HFQwen3Moe, GenerationLayoutMatchesTransformersLogitsRouterAndAuxLoss) {
  REQUIRE_REFERENCE(ref);
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    auto p = qwen3::from_pretrained(d, world_mesh(), at::kFloat, "cpu", false);
    const Outputs o = run_rows(*p.model, d, {0, 1, 2});
    EXPECT_TRUE(close(o.logits, expected(d, "logits"), 1e-4, 1e-5)) << "at " << hp::get_world_size() << " ranks";
    EXPECT_TRUE(close(o.router_logits, expected(d, "router_logits"), 1e-4, 1e-5));
    EXPECT_TRUE(close(o.aux_loss.reshape({1}), expected(d, "aux_loss"), 1e-5, 1e-6));
    if (hp::get_world_size() > 1) {
      const hp::DTensor gate(p.model->layers[2]->as<qwen3::DecoderLayerImpl>()->moe->experts->parameter("gate_proj"));
      EXPECT_EQ(gate.to_local().size(0) * hp::get_world_size(), p.model->config.num_experts) << "experts split over every rank";
    }
  }
}

TEST(HFQwen3Moe, GreedyGenerateMatchesTransformers) {
  REQUIRE_REFERENCE(ref);
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    auto p = qwen3::from_pretrained(d, world_mesh(), at::kFloat, "cpu", false);
    const at::Tensor want = expected(d, "generated");
    qwen3::GenerationConfig g;
    g.max_new_tokens = want.size(1);
    const auto result = qwen3::generate(*p.model, prompts_of(d), g);
    for (int64_t b = 0; b < want.size(0); ++b)
      EXPECT_EQ(result.tokens[static_cast<size_t>(b)],
                std::vector<int64_t>(want[b].data_ptr<int64_t>(), want[b].data_ptr<int64_t>() + want.size(1)))
          << "prompt " << b;
  }
}

// Ranks that hold different tokens (ep taken from the data ranks): rank r runs the rows
// r, r + ep, ... (uneven counts per rank; a 4th rank repeats row 0), the tokens travel to their
// experts by all-to-all, and every rank's rows equal transformers'. The aux loss over the data
// group is the one of the whole batch the ranks hold together.
TEST(HFQwen3Moe, ExpertParallelAllToAllOverDataRanksMatchesTransformers) {
  REQUIRE_REFERENCE(ref);
  const int64_t ws = hp::get_world_size(), rank = hp::get_rank();
  if (ws == 1) GTEST_SKIP() << "one rank: no expert parallelism";
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    auto model = loaded(d, [&](qwen3::CausalLMImpl& m) { qwen3::parallelize_qwen3_experts(m, world_mesh()); });
    std::vector<int64_t> rows;
    for (int64_t r = rank % 3; r < 3; r += ws) rows.push_back(r);
    hp::CommDebugMode comm;
    const Outputs o = run_rows(*model, d, rows, hp::world_group());
    EXPECT_TRUE(close(o.logits, expected(d, "logits").index_select(0, at::tensor(rows, at::kLong)), 1e-4, 1e-5)) << "rows of rank " << rank;
    EXPECT_TRUE(close(o.router_logits, router_rows(d, rows), 1e-4, 1e-5));
    // Two MoE layers, each: the counts, the tokens out and back.
    EXPECT_EQ(comm.get_comm_counts().at("all_to_all"), 2 * 3);
    // The whole batch the ranks hold: every rank's rows (row 0 twice with 4 ranks).
    std::vector<int64_t> all_rows;
    for (int64_t r = 0; r < ws; ++r)
      for (int64_t x = r % 3; x < 3; x += ws) all_rows.push_back(x);
    auto one = qwen3::from_pretrained(d, c10::nullopt, at::kFloat, "cpu", false);
    const Outputs whole = run_rows(*one.model, d, all_rows);
    EXPECT_TRUE(close(o.aux_loss, whole.aux_loss, 1e-5, 1e-6)) << "aux loss over the data group";
  }
}

TEST(HFQwen3Moe, ExpertTensorParallelTwoByTwoMatchesTransformers) {
  REQUIRE_REFERENCE(ref);
  if (hp::get_world_size() != 4) GTEST_SKIP() << "ep x tp = 2 x 2 needs 4 ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {2, 2}, {"ep", "tp"});
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    auto model = loaded(d, [&](qwen3::CausalLMImpl& m) {
      qwen3::parallelize_qwen3_tp(m, mesh["tp"], /*sequence_parallel=*/false);
      qwen3::parallelize_qwen3_experts(m, mesh);
    });
    const hp::DTensor gate(model->layers[2]->as<qwen3::DecoderLayerImpl>()->moe->experts->parameter("gate_proj"));
    EXPECT_EQ(gate.to_local().sizes(), at::IntArrayRef({model->config.num_experts / 2, 16, 64}));
    // The tp ranks of one ep coordinate hold the same rows; the ep coordinates different ones.
    const int64_t e = mesh.get_local_rank(0);
    const std::vector<int64_t> rows = e == 0 ? std::vector<int64_t>{0, 2} : std::vector<int64_t>{1};
    const Outputs o = run_rows(*model, d, rows);
    EXPECT_TRUE(close(o.logits, expected(d, "logits").index_select(0, at::tensor(rows, at::kLong)), 1e-4, 1e-5));
    EXPECT_TRUE(close(o.router_logits, router_rows(d, rows), 1e-4, 1e-5));
  }
}

// save_pretrained writes HF's per-expert keys, each rank its own experts' bytes, and the files
// equal the checkpoint's tensor for tensor (in its dtype). transformers then reads ours
// (hf_transformers_reads_ours, from HP_HF_OUT).
TEST(HFQwen3Moe, SavedCheckpointHasPerExpertKeysEqualToTransformers) {
  REQUIRE_REFERENCE(ref);
  const char* out_root = std::getenv("HP_HF_OUT");
  ASSERT_NE(out_root, nullptr);
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    const qwen3::Config c = qwen3::load_config(d + "/config.json");
    auto p = qwen3::from_pretrained(d, world_mesh(), at::kFloat, "cpu", false);
    const std::string out = std::string(out_root) + "/np" + std::to_string(hp::get_world_size()) + "_" + variant;
    qwen3::save_pretrained(*p.model, out, "", c.dtype);
    hp::barrier(hp::world_group());
    std::map<std::string, at::Tensor> theirs, ours;
    auto read_all = [](const std::string& dir, std::map<std::string, at::Tensor>& into) {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".safetensors" && e.path().filename() != "expected.safetensors" &&
            e.path().filename() != "grads.safetensors" && e.path().filename() != "padded.safetensors") {
          hp::SafetensorsFile f(e.path().string());
          for (const auto& t : f.tensors()) into[t.name] = f.tensor(t.name).clone();
        }
    };
    read_all(d, theirs);
    read_all(out, ours);
    ASSERT_EQ(ours.size(), theirs.size());
    for (const auto& [name, t] : theirs) {
      ASSERT_TRUE(ours.count(name)) << name << " missing from our save";
      EXPECT_TRUE(at::equal(ours[name], t)) << name;
    }
    EXPECT_TRUE(ours.count("model.layers.2.mlp.experts." + std::to_string(c.num_experts - 1) + ".down_proj.weight"));
  }
}

TEST(HFQwen3Moe, BadInputFailsOnEveryRankWithTheModelUnchanged) {
  REQUIRE_REFERENCE(ref);
  const int64_t ws = hp::get_world_size();
  // A checkpoint that lacks one expert's tensor: named, nothing loaded.
  {
    const std::string d = ref + "/moe_fp32_e4";
    auto model = qwen3::build_model(qwen3::load_config(d + "/config.json"), world_mesh());
    const auto before = snapshot(*model);
    try {
      hp::load_hf_checkpoint(*model, ref + "/moe_missing_expert", {qwen3::hf_key});
      ADD_FAILURE() << "a missing expert went unnoticed";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("model.layers.2.mlp.experts.3.up_proj.weight"), std::string::npos) << e.what();
    }
    const auto after = snapshot(*model);
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i])) << "parameter " << i << " changed";
  }
  // top-k larger than the experts.
  std::string text;
  {
    std::ifstream in(ref + "/moe_fp32_e4/config.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string bad = text;
  bad.replace(bad.find("\"num_experts_per_tok\": 2"), 24, "\"num_experts_per_tok\": 5");
  try {
    qwen3::config_from_json(bad);
    ADD_FAILURE() << "top-k 5 of 4 experts accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok 5 is larger than"), std::string::npos) << e.what();
  }
  // Experts that do not divide over ep: refused before any layer changes.
  if (ws > 1) {
    qwen3::Config c = qwen3::load_config(ref + "/moe_fp32_e4/config.json");
    c.num_experts = 3 * ws - 1;
    qwen3::CausalLM model{nullptr};
    {
      hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
      model = qwen3::CausalLM(c);
    }
    try {
      qwen3::parallelize_qwen3_experts(*model, world_mesh());
      ADD_FAILURE() << "num_experts " << c.num_experts << " over ep " << ws << " accepted";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("must be divisible by the expert-parallel size"), std::string::npos) << e.what();
    }
    for (const auto& p : model->parameters()) EXPECT_FALSE(hp::is_dtensor(p)) << "a layer was split";
  }
}

}  // namespace t_dist_models_hf_qwen3_moe_test

#undef REQUIRE_REFERENCE
