#include <hyper_parallel/models/qwen3/config.h>

#include <hyper_parallel/runtime/errors.h>

#include <nlohmann/json.hpp>

#include "../hf_config_reader.h"


namespace hyper_parallel {
namespace qwen3 {

namespace {

using nlohmann::json;

using Reader = models::HFConfigReader;

}  // namespace

Config config_from_json(const std::string& text, const std::string& origin) {
  json j = models::parse_config(text, origin, "qwen3::config_from_json");
  const Reader r{j, origin, "qwen3::config_from_json"};
  if (r.has("model_type") && j["model_type"] != "qwen3" && j["model_type"] != "qwen3_moe")
    r.fail("model_type is " + j["model_type"].dump() + ", this model implements \"qwen3\" and \"qwen3_moe\"");
  const bool moe = r.has("model_type") && j["model_type"] == "qwen3_moe";
  // What this implementation does not do is refused, never ignored.
  if (r.has("rope_scaling")) r.fail("'rope_scaling' " + j["rope_scaling"].dump() + " is not supported (only default RoPE)");
  if (r.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (!rp.is_object()) r.fail("'rope_parameters' must be an object");
    if (rp.contains("rope_type") && rp["rope_type"] != "default")
      r.fail("rope_parameters.rope_type " + rp["rope_type"].dump() + " is not supported (only \"default\")");
  }
  if (r.has("use_sliding_window") && j["use_sliding_window"] != false)
    r.fail("'use_sliding_window' is " + j["use_sliding_window"].dump() + "; sliding-window attention is not supported");
  if (r.has("layer_types"))
    for (const auto& t : j["layer_types"])
      if (t != "full_attention") r.fail("layer_types holds " + t.dump() + "; only \"full_attention\" layers are supported");
  if (r.has("attention_bias") && j["attention_bias"] != false)
    r.fail("'attention_bias' is " + j["attention_bias"].dump() + "; Qwen3 projections without bias only");
  if (r.has("hidden_act") && j["hidden_act"] != "silu") r.fail("'hidden_act' is " + j["hidden_act"].dump() + "; only \"silu\"");

  Config c;
  c.vocab_size = r.integer("vocab_size", 1);
  c.hidden_size = r.integer("hidden_size", 1);
  c.intermediate_size = r.integer("intermediate_size", 1);
  c.num_layers = r.integer("num_hidden_layers", 1);
  c.num_heads = r.integer("num_attention_heads", 1);
  c.num_kv_heads = r.has("num_key_value_heads") ? r.integer("num_key_value_heads", 1) : c.num_heads;
  c.head_dim = r.has("head_dim") ? r.integer("head_dim", 2) : c.hidden_size / c.num_heads;
  if (c.head_dim % 2 != 0) r.fail("head_dim " + std::to_string(c.head_dim) + " must be even (rotary embeddings rotate pairs)");
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_attention_heads " + std::to_string(c.num_heads) + " is not a multiple of num_key_value_heads " +
           std::to_string(c.num_kv_heads));
  if (r.has("rms_norm_eps")) c.rms_norm_eps = r.number(j["rms_norm_eps"], "rms_norm_eps");
  if (r.has("rope_theta")) c.rope_theta = r.number(j["rope_theta"], "rope_theta");
  if (r.has("rope_parameters") && j["rope_parameters"].contains("rope_theta"))
    c.rope_theta = r.number(j["rope_parameters"]["rope_theta"], "rope_parameters.rope_theta");
  if (r.has("attention_dropout")) {
    const json& v = j["attention_dropout"];
    if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() < 1.0))
      r.fail("'attention_dropout' must be a number in [0, 1), got " + v.dump());
    c.attention_dropout = v.get<double>();
  }
  if (r.has("max_position_embeddings")) c.max_position_embeddings = r.integer("max_position_embeddings", 1);
  if (r.has("tie_word_embeddings")) c.tie_word_embeddings = r.boolean("tie_word_embeddings");
  if (moe) {
    // transformers 5 writes num_experts as num_local_experts (an attribute_map alias).
    const char* experts_key = r.has("num_experts") ? "num_experts" : "num_local_experts";
    c.num_experts = r.integer(experts_key, 0);
    if (c.num_experts > 0) {
      c.num_experts_per_tok = r.integer("num_experts_per_tok", 1);
      if (c.num_experts_per_tok > c.num_experts)
        r.fail("num_experts_per_tok " + std::to_string(c.num_experts_per_tok) + " is larger than " + experts_key + " " +
               std::to_string(c.num_experts));
      c.moe_intermediate_size = r.integer("moe_intermediate_size", 1);
      if (r.has("decoder_sparse_step")) c.decoder_sparse_step = r.integer("decoder_sparse_step", 1);
      if (r.has("norm_topk_prob")) {
        if (!j["norm_topk_prob"].is_boolean()) r.fail("'norm_topk_prob' must be true or false");
        c.norm_topk_prob = j["norm_topk_prob"].get<bool>();
      }
      c.mlp_only_layers = r.ids("mlp_only_layers");
      for (int64_t l : c.mlp_only_layers)
        if (l < 0 || l >= c.num_layers) r.fail("mlp_only_layers holds " + std::to_string(l) + ", not a layer of " + std::to_string(c.num_layers));
      if (r.has("router_aux_loss_coef")) {
        const json& v = j["router_aux_loss_coef"];
        if (!v.is_number() || v.get<double>() < 0) r.fail("'router_aux_loss_coef' must be a number >= 0, got " + v.dump());
        c.router_aux_loss_coef = v.get<double>();
      }
      if (r.has("output_router_logits")) {
        if (!j["output_router_logits"].is_boolean()) r.fail("'output_router_logits' must be true or false");
        c.output_router_logits = j["output_router_logits"].get<bool>();
      }
    }
  }
  c.dtype = r.dtype();
  r.token_ids(c.eos_token_ids, c.bos_token_id, c.pad_token_id);
  return c;
}

Config load_config(const std::string& path) { return config_from_json(models::read_config_text(path, "qwen3::load_config"), path); }

std::string config_to_json(const Config& c) {
  json j;
  j["architectures"] = {c.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
  j["model_type"] = c.is_moe() ? "qwen3_moe" : "qwen3";
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
  }
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["attention_dropout"] = c.attention_dropout;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["use_sliding_window"] = false;
  j["torch_dtype"] = models::dtype_name(c.dtype);
  models::write_token_ids(j, c.eos_token_ids, c.bos_token_id, c.pad_token_id);
  return j.dump(2) + "\n";
}

std::string hf_key(const std::string& fqn) {
  if (fqn.rfind("lm_head.", 0) == 0) return fqn;
  // Stacked experts [E, ...] are HF's per-expert Linear weights (what save_pretrained writes).
  static const std::string experts = ".mlp.experts.";
  const size_t at = fqn.find(experts);
  if (at != std::string::npos) {
    const std::string proj = fqn.substr(at + experts.size());
    if (proj == "gate_proj" || proj == "up_proj" || proj == "down_proj")
      return "model." + fqn.substr(0, at + experts.size()) + "*." + proj + ".weight";
  }
  return "model." + fqn;
}

}  // namespace qwen3
}  // namespace hyper_parallel
