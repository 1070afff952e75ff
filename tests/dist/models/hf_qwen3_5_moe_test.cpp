// Qwen3.5-MoE text checkpoints written by transformers (tests/tools/hf_reference.py: Qwen3.5's
// hybrid layers, every MLP a sparse block of 8 experts, top-2, beside a shared expert behind its
// sigmoid gate; every 1-D weight and the router random; saved with per-expert keys as
// save_pretrained writes them): the config as transformers writes it; at the job's world size (1, 2
// or 4: attention, GDN and shared expert under the tp plan, routed experts over the same ranks,
// which hold the same tokens) the logits, every layer's router logits, transformers' loss with its
// load-balancing term, and every parameter's gradient; greedy generation from left-padded prompts;
// and an expert-parallel layout over data ranks (all-to-all), each rank's rows against
// transformers'.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/nn/init_parameters.h>


#include "../../common/hf_reference.h"
#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3_5/config.h>
#include <hyper_parallel/models/qwen3_5/generate.h>
#include <hyper_parallel/models/qwen3_5/model.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>
#include <hyper_parallel/models/qwen3_5/pretrained.h>

namespace q35 = hyper_parallel::qwen3_5;
namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_hf_qwen3_5_moe_test {
namespace {

constexpr const char* kVariant = "qwen3_5_moe_fp32";

q35::CausalLM loaded(const std::string& dir, const std::function<void(q35::CausalLMImpl&)>& split) {
  const q35::Config c = q35::load_config(dir + "/config.json");
  q35::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = q35::CausalLM(c);
  }
  split(*model);
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, q35::hf_load_options(c));
  return model;
}

// The tp plan (with or without sequence parallelism) and the routed experts over the same ranks.
void tp_layout(q35::CausalLMImpl& m, bool sequence_parallel) {
  if (hp::get_world_size() == 1) return;
  const hp::DeviceMesh tp = hp_test::world_mesh();
  q35::parallelize_qwen3_5_tp(m, tp, sequence_parallel);
  q35::parallelize_qwen3_5_experts(m, tp, /*tensor_parallel=*/false, "all_reduce");
}

// transformers' gradient of our parameter `fqn`: its in-memory experts are fused, gate_up_proj
// [E, 2I, H] (gate rows first) and down_proj [E, H, I].
at::Tensor hf_grad(const std::string& dir, const q35::Config& c, const std::string& fqn, const std::string& key) {
  static const std::string experts = ".mlp.experts.";
  if (const size_t at = fqn.find(experts); at != std::string::npos) {
    const std::string base = "grad.model." + fqn.substr(0, at + experts.size()), proj = fqn.substr(at + experts.size());
    const int64_t i = c.moe_intermediate_size;
    if (proj == "down_proj") return hp_test::hf_expected(dir, (base + "down_proj").c_str());
    const at::Tensor gate_up = hp_test::hf_expected(dir, (base + "gate_up_proj").c_str());
    return gate_up.narrow(1, proj == "gate_proj" ? 0 : i, i);
  }
  const size_t open = key.find('[');
  if (open == std::string::npos) return hp_test::hf_expected(dir, ("grad." + key).c_str());
  const int64_t from = std::stoll(key.substr(open + 1)), to = std::stoll(key.substr(key.find(':', open) + 1));
  return hp_test::hf_expected(dir, ("grad." + key.substr(0, open)).c_str()).narrow(0, from, to - from);
}

}  // namespace

TEST(HFQwen3_5Moe, ConfigIsReadAsTransformersWritesIt) {
  HP_REQUIRE_HF_REFERENCE(ref, kVariant);
  const q35::Config c = q35::load_config(ref + "/" + kVariant + "/config.json");
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.shared_expert_intermediate_size, 48);
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.001);
  // Written back as transformers writes it, and read again to the same sizes.
  const q35::Config back = q35::config_from_json(q35::config_to_json(c));
  EXPECT_EQ(back.num_experts, c.num_experts);
  EXPECT_EQ(back.shared_expert_intermediate_size, c.shared_expert_intermediate_size);
  EXPECT_NE(q35::config_to_json(c).find("\"qwen3_5_moe_text\""), std::string::npos);
  // A dense model_type with experts is refused by name.
  std::string message;
  try {
    q35::config_from_json(R"({"model_type": "qwen3_5_text", "num_experts": 8, "vocab_size": 8, "hidden_size": 8})");
  } catch (const c10::ValueError& e) {
    message = e.what_without_backtrace();
  }
  EXPECT_NE(message.find("'num_experts' is 8 in a dense config"), std::string::npos) << message;
}

TEST(HFQwen3_5Moe, LogitsRouterLogitsLossAndEveryGradientMatchTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, kVariant);
  const std::string d = ref + "/" + kVariant;
  // Sequence parallelism (the plan's default) splits the reference's 70 tokens over 2 ranks, not 4.
  for (bool sp : {false, true}) {
    if (sp && hp::get_world_size() != 2) continue;
    SCOPED_TRACE("world size " + std::to_string(hp::get_world_size()) + (sp ? ", sequence parallel" : ""));
    auto model = loaded(d, [&](q35::CausalLMImpl& m) { tp_layout(m, sp); });
    const q35::Config& c = model->config;
    auto t = [&](const std::string& name) { return hp_test::hf_expected(d, name.c_str()); };
    const at::Tensor ids = t("input_ids");
    const at::Tensor logits = model(ids);
    EXPECT_TRUE(hp_test::near_relative(logits, t("logits"), 1e-4)) << "logits";
    const auto router = model->router_logits();
    ASSERT_EQ(router.size(), static_cast<size_t>(c.num_layers));
    for (size_t l = 0; l < router.size(); ++l)
      EXPECT_TRUE(hp_test::near_relative(router[l], t("router_logits." + std::to_string(l)), 1e-4)) << "router logits of layer " << l;
    // transformers' loss with labels and output_router_logits: the shifted cross-entropy plus
    // router_aux_loss_coef times the load-balancing loss over every layer's router logits.
    const int64_t s = ids.size(1);
    const at::Tensor full = hp::local_tensor(logits);
    const at::Tensor ce = at::cross_entropy_loss(full.narrow(1, 0, s - 1).reshape({-1, full.size(-1)}), ids.narrow(1, 1, s - 1).reshape({-1}));
    const at::Tensor aux = model->load_balancing_loss();
    EXPECT_NEAR(aux.item<double>(), t("aux_loss").item<double>(), 1e-5);
    const at::Tensor loss = ce + c.router_aux_loss_coef * aux;
    EXPECT_NEAR(loss.item<double>(), t("loss").item<double>(), 1e-5);
    loss.backward();
    const auto key = q35::hf_key_map(c);
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      const at::Tensor want = hf_grad(d, c, p.key(), key(p.key()));
      EXPECT_TRUE(hp_test::near_relative(p.value().grad(), want.view(p.value().sizes()), 1e-4)) << p.key();
    }
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model));
  }
}

TEST(HFQwen3_5Moe, GreedyGenerationMatchesTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, kVariant);
  const std::string d = ref + "/" + kVariant;
  // from_pretrained's own layout (tp over every rank, experts over the same ranks).
  c10::optional<hp::DeviceMesh> tp;
  if (hp::get_world_size() > 1) tp = hp_test::world_mesh();
  auto model = q35::from_pretrained(d, tp, at::kFloat, "cpu", /*progress=*/false).model;
  const at::Tensor ids = hp_test::hf_expected(d, "gen.prompt_ids");
  const at::Tensor want_tokens = hp_test::hf_expected(d, "gen.tokens"), want_logits = hp_test::hf_expected(d, "gen.logits");
  const std::vector<std::vector<int64_t>> prompts = hp_test::hf_prompts(d, "gen.");
  hp::models::GenerationConfig g;
  g.max_new_tokens = want_tokens.size(1);
  g.output_logits = true;
  const auto out = q35::generate(*model, prompts, g);
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const at::Tensor row = want_tokens[b].contiguous();
    EXPECT_EQ(out.tokens[static_cast<size_t>(b)], std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()))
        << "prompt " << b;
  }
  for (int64_t step = 0; step < g.max_new_tokens; ++step)
    EXPECT_TRUE(hp_test::near_relative(out.logits[static_cast<size_t>(step)], want_logits[step], 1e-4)) << "step " << step;
}

// The published layout (text model under model.language_model., vision tower and MTP head skipped)
// with the experts fused, gate_up_proj [E, 2I, H] and down_proj [E, H, I]: the gate and up halves
// load into the stacked gate_proj / up_proj through the key map's dim-1 ranges, whole experts over
// the ranks and with each expert's columns split (expert tensor parallelism); a save writes the
// per-expert keys transformers' save_pretrained writes, and our reload (and transformers') gives the
// same logits.
TEST(HFQwen3_5Moe, FusedExpertsInThePublishedLayoutLoadAndSaveAsPerExpertKeys) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_moe_fused_vl");
  const std::string d = ref + "/qwen3_5_moe_fused_vl";
  const int64_t ws = hp::get_world_size();
  const at::Tensor ids = hp_test::hf_expected(d, "input_ids"), want = hp_test::hf_expected(d, "logits");
  for (bool columns : {false, true}) {
    if (columns && ws == 1) continue;
    SCOPED_TRACE(columns ? "each expert's columns over the ranks" : "whole experts over the ranks");
    const q35::Config c = q35::load_config(d + "/config.json");
    EXPECT_TRUE(c.vision_language && c.is_moe());
    auto model = loaded(d, [&](q35::CausalLMImpl& m) {
      if (ws == 1) return;
      q35::parallelize_qwen3_5_tp(m, hp_test::world_mesh(), /*sequence_parallel=*/false);
      q35::parallelize_qwen3_5_experts(m, hp_test::world_mesh(), /*tensor_parallel=*/columns, "all_reduce");
    });
    at::NoGradGuard no_grad;
    EXPECT_TRUE(hp_test::near_relative(model(ids), want, 1e-4)) << "logits";
  }
  c10::optional<hp::DeviceMesh> tp;
  if (ws > 1) tp = hp_test::world_mesh();
  auto pretrained = q35::from_pretrained(d, tp, at::kFloat, "cpu", /*progress=*/false);
  EXPECT_EQ(pretrained.load.ignored, 2) << "the vision tower and the MTP head";
  // Under HP_HF_OUT, hf_transformers_reads_ours then loads it with transformers against its logits.
  const char* out_root = std::getenv("HP_HF_OUT");
  const std::string out = (out_root ? std::string(out_root) : ::testing::TempDir()) + "/np" + std::to_string(ws) + "_qwen3_5_moe_fused_vl";
  q35::save_pretrained(*pretrained.model, out);
  if (hp::get_rank() == 0) {
    const hp::SafetensorsFile saved(out + "/model.safetensors");
    EXPECT_NE(saved.find("model.layers.0.mlp.experts.7.up_proj.weight"), nullptr) << "per-expert keys";
    EXPECT_EQ(saved.find("model.layers.0.mlp.experts.gate_up_proj"), nullptr) << "no fused key";
  }
  auto back = q35::from_pretrained(out, tp, at::kFloat, "cpu", /*progress=*/false);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(hp_test::near_relative(back.model(ids), want, 1e-4)) << "our reload";
}

TEST(HFQwen3_5Moe, ExpertParallelOverDataRanksMatchesTransformersRows) {
  HP_REQUIRE_HF_REFERENCE(ref, kVariant);
  const int64_t ws = hp::get_world_size();
  if (ws != 2) GTEST_SKIP() << "2 ranks: one row each";
  const std::string d = ref + "/" + kVariant;
  // Each rank its own row (different tokens), experts split over the ranks, tokens dispatched by
  // all-to-all; everything else whole on every rank.
  const hp::DeviceMesh ep = hp::init_device_mesh("cpu", {ws}, {"ep"});
  auto model = loaded(d, [&](q35::CausalLMImpl& m) { q35::parallelize_qwen3_5_experts(m, ep); });
  const int64_t rank = hp::get_rank();
  const at::Tensor ids = hp_test::hf_expected(d, "input_ids").narrow(0, rank, 1);
  const at::Tensor logits = model(ids);
  EXPECT_TRUE(hp_test::near_relative(logits, hp_test::hf_expected(d, "logits").narrow(0, rank, 1), 1e-4)) << "rank " << rank << "'s row";
  const int64_t s = ids.size(1);
  const auto router = model->router_logits();
  for (size_t l = 0; l < router.size(); ++l)
    EXPECT_TRUE(hp_test::near_relative(router[l], hp_test::hf_expected(d, ("router_logits." + std::to_string(l)).c_str()).narrow(0, rank * s, s), 1e-4))
        << "router logits of layer " << l;
  // The load-balancing loss over both ranks' tokens is transformers' over the batch.
  EXPECT_NEAR(model->load_balancing_loss(ep.get_group(0)).item<double>(), hp_test::hf_expected(d, "aux_loss").item<double>(), 1e-5);
}

}  // namespace t_dist_models_hf_qwen3_5_moe_test
