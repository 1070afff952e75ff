// Qwen3.5 text checkpoints written by transformers (tests/tools/hf_reference.py: 3 linear-attention
// layers and 1 gated full-attention layer, every norm weight, A_log and dt_bias random; fp32 untied,
// and bf16 tied in sharded files): the config as transformers writes it, and in one process the
// logits of 2 rows of 70 tokens and every parameter's gradient of transformers' loss, loaded through
// the key map that splits in_proj_qkv and conv1d into their q/k/v sections. Bad configs are refused
// by name.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/nn/init_parameters.h>

#include <fstream>

#include "../../common/error_message.h"
#include "../../common/hf_reference.h"
#include <hyper_parallel/models/qwen3_5/config.h>
#include <hyper_parallel/models/qwen3_5/generate.h>
#include <hyper_parallel/models/qwen3_5/model.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>
#include <hyper_parallel/models/qwen3_5/pretrained.h>
#include "../../common/test_util.h"

namespace q35 = hyper_parallel::qwen3_5;
namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_hf_qwen3_5_test {
namespace {

const char* kVariants[] = {"qwen3_5_fp32", "qwen3_5_bf16_tied_sharded"};

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `dir`'s model on meta, split by `split` when given, then this rank's shards loaded in float32.
q35::CausalLM loaded(const std::string& dir, const std::function<void(q35::CausalLMImpl&)>& split = nullptr) {
  const q35::Config c = q35::load_config(dir + "/config.json");
  q35::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = q35::CausalLM(c);
  }
  if (split) split(*model);
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, q35::hf_load_options(c));
  return model;
}

// Every parameter's gradient against transformers' ("grad." + its HF name, read by `tensor`; our
// sections of a fused HF tensor against their rows), within 1e-4 of max.
void expect_gradients_match(q35::CausalLMImpl& model, const std::function<at::Tensor(const std::string&)>& tensor) {
  const auto key = q35::hf_key_map(model.config);
  for (const auto& p : model.named_parameters()) {
    // A tied lm_head is embed_tokens' weight: compared once, under its own name.
    if (model.config.tie_word_embeddings && p.key() == "lm_head.weight") continue;
    std::string name = key(p.key());
    at::Tensor want;
    const size_t open = name.find('[');
    if (open == std::string::npos) {
      want = tensor("grad." + name);
    } else {
      const int64_t from = std::stoll(name.substr(open + 1)), to = std::stoll(name.substr(name.find(':', open) + 1));
      want = tensor("grad." + name.substr(0, open)).narrow(0, from, to - from);
    }
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(hp_test::near_relative(p.value().grad(), want.view(p.value().sizes()), 1e-4)) << p.key();
  }
}


}  // namespace

TEST(HFQwen3_5, ConfigIsReadAsTransformersWritesIt) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const q35::Config c = q35::load_config(ref + "/qwen3_5_fp32/config.json");
  EXPECT_EQ(c.full_attention, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(c.linear_num_key_heads, 4);
  EXPECT_EQ(c.linear_num_value_heads, 8);
  EXPECT_EQ(c.linear_key_head_dim, 16);
  EXPECT_EQ(c.linear_value_head_dim, 8);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.vision_language);
  const q35::Config tied = q35::load_config(ref + "/qwen3_5_bf16_tied_sharded/config.json");
  EXPECT_TRUE(tied.tie_word_embeddings);
  EXPECT_EQ(tied.dtype, at::kBFloat16);
  // The published vision-language layout: the text model under text_config, the tie flag at the
  // top level, keys under model.language_model.
  const std::string text = text_of(ref + "/qwen3_5_fp32/config.json");
  const std::string vl = "{\"model_type\": \"qwen3_5\", \"tie_word_embeddings\": true, \"text_config\": " + text + "}";
  const q35::Config v = q35::config_from_json(vl);
  EXPECT_TRUE(v.vision_language);
  EXPECT_TRUE(v.tie_word_embeddings);
  EXPECT_EQ(q35::hf_key_map(v)("layers.0.linear_attn.in_proj_k.weight"), "model.language_model.layers.0.linear_attn.in_proj_qkv.weight[64:128]");
  EXPECT_EQ(q35::hf_key_map(c)("layers.2.linear_attn.gdn.conv_v"), "model.layers.2.linear_attn.conv1d.weight[128:192]");
  EXPECT_EQ(q35::hf_key_map(c)("layers.2.linear_attn.gdn.A_log"), "model.layers.2.linear_attn.A_log");
  EXPECT_EQ(q35::hf_key_map(c)("lm_head.weight"), "lm_head.weight");
  // Refused by name.
  auto refused = [&](const std::string& from, const std::string& to, const std::string& says) {
    std::string bad = text;
    const size_t at = bad.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    bad.replace(at, from.size(), to);
    const std::string msg = hp_test::error_message([&] { q35::config_from_json(bad, "bad.json"); });
    EXPECT_NE(msg.find("hyper_parallel::qwen3_5::config_from_json: bad.json: " + says), std::string::npos) << msg;
  };
  refused("\"model_type\": \"qwen3_5_text\"", "\"model_type\": \"qwen3\"", "model_type is \"qwen3\"");
  refused("\"linear_attention\",\n    \"full_attention\"", "\"linear_attention\",\n    \"sliding_attention\"",
          "layer_types holds \"sliding_attention\"");
  refused("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", "rope_parameters.rope_type \"yarn\" is not supported");
  refused("\"linear_num_value_heads\": 8", "\"linear_num_value_heads\": 6", "linear_num_value_heads 6 is not a multiple of linear_num_key_heads 4");
  refused("\"mrope_section\": [\n      2,", "\"mrope_section\": [\n      3,", "rope_parameters.mrope_section");
}

// One process, and the seed's plan at tp = world size (2, 4) with and without sequence and loss
// parallelism: every parameter a DTensor, the GDN's q/k/v sections and gates split by head, the 2
// KV heads replicated at tp = 4.
TEST(HFQwen3_5, LogitsAndEveryGradientMatchTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const int64_t ws = hp::get_world_size();
  struct Case {
    bool sp, loss_parallel, checkpointing;
  };
  // Sequence parallelism splits the reference's 70 tokens over 2 ranks, not 4.
  const std::vector<Case> cases = ws == 1   ? std::vector<Case>{{false, false, false}, {false, false, true}}
                                  : ws == 2 ? std::vector<Case>{{false, false, false}, {true, false, false}, {true, true, false}, {true, false, true}}
                                            : std::vector<Case>{{false, false, false}, {false, true, false}, {false, false, true}};
  for (const Case& layout : cases)
  for (const char* variant : kVariants) {
    SCOPED_TRACE(std::string(variant) + " at " + std::to_string(ws) + " ranks" + (layout.sp ? ", sequence parallel" : "") +
                 (layout.loss_parallel ? ", loss parallel" : "") + (layout.checkpointing ? ", full activation checkpointing" : ""));
    const std::string d = ref + "/" + variant;
    std::function<void(q35::CausalLMImpl&)> split = [&](q35::CausalLMImpl& m) {
      if (ws > 1) q35::parallelize_qwen3_5_tp(m, hp_test::world_mesh(), layout.sp, layout.loss_parallel);
      if (layout.checkpointing) hp::apply_activation_checkpointing(m, hp::ActivationCheckpointPolicy::full());
    };
    auto model = loaded(d, split);
    if (ws > 1)
      for (const auto& p : model->named_parameters()) EXPECT_TRUE(hp::is_dtensor(p.value())) << p.key() << " is not a DTensor";
    auto t = [&](const std::string& name) { return hp_test::hf_expected(d, name.c_str()); };
    const at::Tensor ids = t("input_ids");
    const at::Tensor logits = model(ids);
    EXPECT_TRUE(hp_test::near_relative(logits, t("logits"), 1e-4)) << "logits";
    const int64_t s = ids.size(1);
    at::Tensor targets = ids.narrow(1, 1, s - 1).reshape({-1});
    if (hp::is_dtensor(logits)) targets = hp::DTensor::from_local(targets, hp::DTensor(logits).device_mesh(), {hp::Replicate()});
    const at::Tensor loss = at::cross_entropy_loss(logits.narrow(1, 0, s - 1).reshape({-1, logits.size(-1)}), targets);
    const at::Tensor loss_value = hp::is_dtensor(loss) ? hp::DTensor(loss).full_tensor() : loss;
    EXPECT_NEAR(loss_value.item<double>(), t("loss").item<double>(), 1e-5);
    loss.backward();
    expect_gradients_match(*model, [&](const std::string& name) { return t(name); });
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model));
  }
}

// A left-padded batch (rows padded by 3, 0 and 6 tokens) given with its key mask, cross-entropy over
// the targets whose position and predecessor are real, under every activation-checkpointing policy
// at tp = world size: logits at real positions and every gradient equal transformers' (forward
// with attention_mask: full attention masks the padded keys, the Gated DeltaNet takes them as
// zeros). The mask reaches each layer as its arguments, which a checkpointed layer's recompute replays.
TEST(HFQwen3_5, LeftPaddedBatchUnderEveryCheckpointingPolicyMatchesTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const std::string d = ref + "/qwen3_5_fp32";
  hp::SafetensorsFile f(d + "/padded.safetensors");
  const at::Tensor ids = f.tensor("input_ids").clone(), mask = f.tensor("attention_mask").to(at::kBool);
  ASSERT_TRUE(mask[1].all().item<bool>() && !mask.all().item<bool>()) << "padded rows and one without padding";
  const int64_t s = ids.size(1), ws = hp::get_world_size();
  const at::Tensor valid = mask.narrow(1, 0, s - 1).logical_and(mask.narrow(1, 1, s - 1));
  const at::Tensor targets = ids.narrow(1, 1, s - 1).masked_fill(valid.logical_not(), -100).reshape({-1});
  for (const char* policy : {"none", "full", "selective", "full:2"}) {
    SCOPED_TRACE(std::string("activation checkpointing ") + policy + " at tp = " + std::to_string(ws));
    auto model = loaded(d, [&](q35::CausalLMImpl& m) {
      if (ws > 1) q35::parallelize_qwen3_5_tp(m, hp_test::world_mesh(), /*sequence_parallel=*/false);
      hp::apply_activation_checkpointing(m, hp::ActivationCheckpointPolicy::parse(policy));
    });
    q35::ForwardContext context;
    context.key_mask = mask;
    at::Tensor logits = model->forward(ids, context);
    if (hp::is_dtensor(logits)) logits = hp::DTensor(logits).full_tensor();
    const at::Tensor loss = at::cross_entropy_loss(logits.narrow(1, 0, s - 1).reshape({-1, logits.size(-1)}), targets, {},
                                                   at::Reduction::Mean, -100);
    EXPECT_NEAR(loss.item<double>(), f.tensor("loss").item<double>(), 1e-5) << "loss";
    loss.backward();
    expect_gradients_match(*model, [&](const std::string& name) { return f.tensor(name).clone(); });
  }
}

// The published layout: text model under model.language_model., the vision tower and the MTP head
// skipped by name (counted), the logits transformers' text model gives.
TEST(HFQwen3_5, VisionLanguageCheckpointLoadsItsTextModel) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_vl_layout");
  const std::string d = ref + "/qwen3_5_vl_layout";
  const q35::Config c = q35::load_config(d + "/config.json");
  ASSERT_TRUE(c.vision_language);
  auto build = [&] {
    q35::CausalLM model{nullptr};
    {
      hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
      model = q35::CausalLM(c);
    }
    if (hp::get_world_size() > 1) q35::parallelize_qwen3_5_tp(*model, hp_test::world_mesh(), false);
    hp::to_empty(*model, "cpu");
    return model;
  };
  auto model = build();
  const hp::HFLoadReport report = hp::load_hf_checkpoint(*model, d, q35::hf_load_options(c));
  EXPECT_EQ(report.ignored, 2) << "model.visual.patch_embed.proj.weight and mtp.fc.weight";
  at::NoGradGuard no_grad;
  EXPECT_TRUE(hp_test::near_relative(model(hp_test::hf_expected(d, "input_ids")), hp_test::hf_expected(d, "logits"), 1e-4));
  // Without the ignore patterns the vision tower is named as unclaimed, on every rank.
  auto strict = build();
  const std::string msg = hp_test::error_message([&] { hp::load_hf_checkpoint(*strict, d, {q35::hf_key_map(c)}); });
  EXPECT_NE(msg.find("no parameter takes 'model.visual.patch_embed.proj.weight'"), std::string::npos) << msg;
  hp::HFLoadOptions bad = q35::hf_load_options(c);
  bad.ignore.push_back("(unclosed");
  const std::string regex_msg = hp_test::error_message([&] { hp::load_hf_checkpoint(*strict, d, bad); });
  EXPECT_NE(regex_msg.find("the ignore pattern '(unclosed' is not a regular expression"), std::string::npos) << regex_msg;
}

TEST(HFQwen3_5, PlanRefusesSizesThatDoNotDivideByName) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  if (hp::get_world_size() == 1) GTEST_SKIP() << "needs ranks";
  q35::Config c = q35::load_config(ref + "/qwen3_5_fp32/config.json");
  c.linear_num_key_heads = 3;
  c.linear_num_value_heads = 3 * hp::get_world_size() + 3;
  q35::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
    model = q35::CausalLM(c);
  }
  const std::string msg = hp_test::error_message([&] { q35::parallelize_qwen3_5_tp(*model, hp_test::world_mesh()); });
  EXPECT_EQ(msg.rfind("hyper_parallel::qwen3_5::parallelize_qwen3_5_tp: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("linear_num_key_heads (3)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must be divisible by the tensor-parallel size"), std::string::npos) << msg;
  for (const auto& p : model->parameters()) EXPECT_FALSE(hp::is_dtensor(p)) << "the model changed";
  // A tp that neither divides the KV heads nor is a multiple of them.
  q35::Config kv = q35::load_config(ref + "/qwen3_5_fp32/config.json");
  kv.num_kv_heads = 3;
  kv.num_heads = 12;
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
    model = q35::CausalLM(kv);
  }
  const std::string kv_msg = hp_test::error_message([&] { q35::parallelize_qwen3_5_tp(*model, hp_test::world_mesh()); });
  EXPECT_NE(kv_msg.find("hyper_parallel::qwen3_5::parallelize_qwen3_5_tp: the tensor-parallel size " + std::to_string(hp::get_world_size()) +
                        " must divide num_key_value_heads (3)"),
            std::string::npos)
      << kv_msg;
  for (const auto& p : model->parameters()) EXPECT_FALSE(hp::is_dtensor(p)) << "the model changed";
}

// transformers' greedy generation from 3 left-padded prompts (70, 45 and 9 tokens; the longest
// prefills two GDN chunks): the same tokens and each step's logits within 1e-4 of the largest,
// in one process and at tp = world size (2, 4: KV heads replicated). The cache itself: the longest
// prompt's steps equal one full forward over the prompt and the tokens generated.
TEST(HFQwen3_5, GreedyGenerationMatchesTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    auto model = loaded(d, [](q35::CausalLMImpl& m) {
      if (hp::get_world_size() > 1) q35::parallelize_qwen3_5_tp(m, hp_test::world_mesh(), /*sequence_parallel=*/false);
    });
    const at::Tensor ids = hp_test::hf_expected(d, "gen.prompt_ids");
    const at::Tensor want_tokens = hp_test::hf_expected(d, "gen.tokens"), want_logits = hp_test::hf_expected(d, "gen.logits");
      const std::vector<std::vector<int64_t>> prompts = hp_test::hf_prompts(d, "gen.");
    hp::models::GenerationConfig g;
    g.max_new_tokens = want_tokens.size(1);
    g.output_logits = true;
    const auto out = q35::generate(*model, prompts, g);
    ASSERT_EQ(out.logits.size(), static_cast<size_t>(g.max_new_tokens));
    for (int64_t b = 0; b < ids.size(0); ++b) {
      const at::Tensor row = want_tokens[b].contiguous();
      EXPECT_EQ(out.tokens[static_cast<size_t>(b)], std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel())) << "prompt " << b;
    }
    for (int64_t step = 0; step < g.max_new_tokens; ++step)
      EXPECT_TRUE(hp_test::near_relative(out.logits[static_cast<size_t>(step)], want_logits[step], 1e-4)) << "step " << step;
    // The longest prompt (no padding): its cached steps against one forward over everything.
    at::NoGradGuard no_grad;
    const at::Tensor all = at::cat({ids[0], want_tokens[0].narrow(0, 0, g.max_new_tokens - 1)}).unsqueeze(0);
    const at::Tensor full = hp::local_tensor(model(all))[0].narrow(0, ids.size(1) - 1, g.max_new_tokens);
    for (int64_t step = 0; step < g.max_new_tokens; ++step)
      EXPECT_TRUE(hp_test::near_relative(out.logits[static_cast<size_t>(step)][0], full[step], 1e-5)) << "full forward, step " << step;
  }
}

// from_pretrained at tp = world size, save_pretrained, and back: the same logits from our reload,
// the config as it was; hf_transformers_reads_ours then loads the saved checkpoints (fp32 untied,
// and the bf16 tied one saved in float32) with Qwen3_5ForCausalLM against its own logits.
TEST(HFQwen3_5, SavePretrainedRoundTripsForTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const char* out_root = std::getenv("HP_HF_OUT");
  ASSERT_NE(out_root, nullptr) << "HP_HF_OUT names where transformers reads our checkpoints";
  const int64_t ws = hp::get_world_size();
  const c10::optional<hp::DeviceMesh> tp = ws > 1 ? c10::optional<hp::DeviceMesh>(hp_test::world_mesh()) : c10::nullopt;
  for (const char* variant : {"qwen3_5_fp32", "qwen3_5_bf16_tied_sharded", "qwen3_5_vl_layout"}) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    auto loaded = q35::from_pretrained(d, tp, at::kFloat, "cpu", /*progress=*/false);
    // The published layout is saved as the text model alone; its logits are the fp32 model's.
    const std::string out = std::string(out_root) + "/np" + std::to_string(ws) + "_" + variant;
    q35::save_pretrained(*loaded.model, out);
    const q35::Config before = loaded.model->config, after = q35::load_config(out + "/config.json");
    EXPECT_FALSE(after.vision_language);
    EXPECT_EQ(after.full_attention, before.full_attention);
    EXPECT_EQ(after.tie_word_embeddings, before.tie_word_embeddings);
    EXPECT_EQ(after.rotary_dim(), before.rotary_dim());
    EXPECT_EQ(after.linear_num_value_heads, before.linear_num_value_heads);
    auto back = q35::from_pretrained(out, tp, at::kFloat, "cpu", /*progress=*/false);
    at::NoGradGuard no_grad;
    const at::Tensor ids = hp_test::hf_expected(d, "input_ids");
    const at::Tensor want = hp_test::hf_expected(d, "logits");
    EXPECT_TRUE(hp_test::near_relative(back.model(ids), want, 1e-4));
    EXPECT_TRUE(at::equal(back.model(ids), loaded.model(ids))) << "our reload computes what the saved model did";
  }
}

}  // namespace t_dist_models_hf_qwen3_5_test
