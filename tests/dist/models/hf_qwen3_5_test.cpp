// Qwen3.5 text checkpoints written by transformers (tests/tools/hf_reference.py: 3 linear-attention
// layers and 1 gated full-attention layer, every norm weight, A_log and dt_bias random; fp32 untied,
// and bf16 tied in sharded files): the config as transformers writes it, and in one process the
// logits of 2 rows of 70 tokens and every parameter's gradient of transformers' loss, loaded through
// the key map that splits in_proj_qkv and conv1d into their q/k/v sections. Bad configs are refused
// by name.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/nn/init_parameters.h>

#include <fstream>

#include "../../common/error_message.h"
#include "../../common/hf_reference.h"
#include <hyper_parallel/models/qwen3_5/config.h>
#include <hyper_parallel/models/qwen3_5/model.h>

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

// `dir`'s model on meta, then loaded in float32.
q35::CausalLM loaded(const std::string& dir) {
  const q35::Config c = q35::load_config(dir + "/config.json");
  q35::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = q35::CausalLM(c);
  }
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, {q35::hf_key_map(c)});
  return model;
}

::testing::AssertionResult near(const at::Tensor& a, const at::Tensor& b, double rel) {
  const double err = (a - b).abs().max().item<double>(), scale = b.abs().max().item<double>();
  if (a.sizes() == b.sizes() && err <= rel * scale && scale > 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "shape " << a.sizes() << " vs " << b.sizes() << ", max |a - b| = " << err
                                       << ", max |b| = " << scale;
}

}  // namespace

TEST(HFQwen3_5, ConfigIsReadAsTransformersWritesIt) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  const q35::Config c = q35::load_config(ref + "/qwen3_5_fp32/config.json");
  EXPECT_EQ(c.full_attention, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 4);
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
  EXPECT_EQ(q35::hf_key_map(v)("layers.0.linear_attn.in_proj_k.weight"), "model.language_model.layers.0.linear_attn.in_proj_qkv.weight[32:64]");
  EXPECT_EQ(q35::hf_key_map(c)("layers.2.linear_attn.gdn.conv_v"), "model.layers.2.linear_attn.conv1d.weight[64:96]");
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
  refused("\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 3", "linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2");
  refused("\"mrope_section\": [\n      2,", "\"mrope_section\": [\n      3,", "rope_parameters.mrope_section");
}

TEST(HFQwen3_5, OneProcessLogitsAndEveryGradientMatchTransformers) {
  HP_REQUIRE_HF_REFERENCE(ref, "qwen3_5_fp32");
  if (hp::get_world_size() != 1) GTEST_SKIP() << "one process";
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const std::string d = ref + "/" + variant;
    auto model = loaded(d);
    auto t = [&](const std::string& name) { return hp_test::hf_expected(d, name.c_str()); };
    const at::Tensor ids = t("input_ids");
    const at::Tensor logits = model(ids);
    EXPECT_TRUE(near(logits, t("logits"), 1e-4)) << "logits";
    const int64_t s = ids.size(1);
    const at::Tensor loss = at::cross_entropy_loss(logits.narrow(1, 0, s - 1).reshape({-1, logits.size(-1)}), ids.narrow(1, 1, s - 1).reshape({-1}));
    EXPECT_NEAR(loss.item<double>(), t("loss").item<double>(), 1e-5);
    loss.backward();
    const auto key = q35::hf_key_map(model->config);
    for (const auto& p : model->named_parameters()) {
      // A tied lm_head is embed_tokens' weight: compared once, under its own name.
      if (model->config.tie_word_embeddings && p.key() == "lm_head.weight") continue;
      std::string name = key(p.key());
      at::Tensor want;
      const size_t open = name.find('[');
      if (open == std::string::npos) {
        want = t("grad." + name);
      } else {
        const int64_t from = std::stoll(name.substr(open + 1)), to = std::stoll(name.substr(name.find(':', open) + 1));
        want = t("grad." + name.substr(0, open)).narrow(0, from, to - from);
      }
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_TRUE(near(p.value().grad(), want.view(p.value().sizes()), 1e-4)) << p.key();
    }
  }
}

}  // namespace t_dist_models_hf_qwen3_5_test
