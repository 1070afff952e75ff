#include <hyper_parallel/models/qwen3_5/config.h>

#include <nlohmann/json.hpp>

#include "../hf_config_reader.h"

namespace hyper_parallel {
namespace qwen3_5 {

namespace {
using nlohmann::json;
using Reader = models::HFConfigReader;
}  // namespace

Config config_from_json(const std::string& text, const std::string& origin) {
  json top = models::parse_config(text, origin, "qwen3_5::config_from_json");
  const Reader outer{top, origin, "qwen3_5::config_from_json"};
  const std::string model_type = outer.has("model_type") && top["model_type"].is_string() ? top["model_type"].get<std::string>() : "";
  if (model_type != "qwen3_5" && model_type != "qwen3_5_text" && model_type != "qwen3_5_moe" && model_type != "qwen3_5_moe_text")
    outer.fail("model_type is " + (outer.has("model_type") ? top["model_type"].dump() : std::string("missing")) +
               ", this model implements \"qwen3_5_text\", \"qwen3_5\", \"qwen3_5_moe_text\" and \"qwen3_5_moe\"");
  Config c;
  c.vision_language = model_type == "qwen3_5" || model_type == "qwen3_5_moe";
  const bool moe = model_type == "qwen3_5_moe" || model_type == "qwen3_5_moe_text";
  if (c.vision_language && !(outer.has("text_config") && top["text_config"].is_object()))
    outer.fail("a \"qwen3_5\" config holds its text model under \"text_config\", which is missing or not an object");
  const json& j = c.vision_language ? top["text_config"] : top;
  const std::string where = c.vision_language ? origin + " (text_config)" : origin;
  const Reader r{j, where, "qwen3_5::config_from_json"};
  // What this implementation does not do is refused, never ignored.
  if (r.has("rope_scaling")) r.fail("'rope_scaling' " + j["rope_scaling"].dump() + " is not supported (only default RoPE)");
  if (r.has("attention_bias") && j["attention_bias"] != false) r.fail("'attention_bias' is " + j["attention_bias"].dump() + "; projections without bias only");
  if (r.has("hidden_act") && j["hidden_act"] != "silu") r.fail("'hidden_act' is " + j["hidden_act"].dump() + "; only \"silu\"");
  if (!moe && r.has("num_experts") && !(j["num_experts"].is_number_integer() && j["num_experts"].get<int64_t>() == 0))
    r.fail("'num_experts' is " + j["num_experts"].dump() + " in a dense config; Qwen3.5-MoE's model_type is \"qwen3_5_moe_text\" (or \"qwen3_5_moe\")");
  c.vocab_size = r.integer("vocab_size", 1);
  c.hidden_size = r.integer("hidden_size", 1);
  if (moe) {
    // Every layer's MLP is the sparse block (transformers' Qwen3_5MoeDecoderLayer).
    c.num_experts = r.integer("num_experts", 1);
    c.num_experts_per_tok = r.integer("num_experts_per_tok", 1);
    c.moe_intermediate_size = r.integer("moe_intermediate_size", 1);
    c.shared_expert_intermediate_size = r.integer("shared_expert_intermediate_size", 1);
    if (c.num_experts_per_tok > c.num_experts)
      r.fail("num_experts_per_tok " + std::to_string(c.num_experts_per_tok) + " is larger than num_experts " + std::to_string(c.num_experts));
    if (r.has("router_aux_loss_coef")) c.router_aux_loss_coef = r.number(j["router_aux_loss_coef"], "router_aux_loss_coef");
    if (r.has("output_router_logits")) c.output_router_logits = r.boolean("output_router_logits");
    c.intermediate_size = r.has("intermediate_size") ? r.integer("intermediate_size", 1) : c.moe_intermediate_size;
  } else {
    c.intermediate_size = r.integer("intermediate_size", 1);
  }
  c.num_layers = r.integer("num_hidden_layers", 1);
  c.num_heads = r.integer("num_attention_heads", 1);
  c.num_kv_heads = r.has("num_key_value_heads") ? r.integer("num_key_value_heads", 1) : c.num_heads;
  c.head_dim = r.has("head_dim") ? r.integer("head_dim", 2) : c.hidden_size / c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_attention_heads " + std::to_string(c.num_heads) + " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  c.linear_num_key_heads = r.integer("linear_num_key_heads", 1);
  c.linear_num_value_heads = r.integer("linear_num_value_heads", 1);
  c.linear_key_head_dim = r.integer("linear_key_head_dim", 1);
  c.linear_value_head_dim = r.integer("linear_value_head_dim", 1);
  c.linear_conv_kernel_dim = r.has("linear_conv_kernel_dim") ? r.integer("linear_conv_kernel_dim", 1) : 4;
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    r.fail("linear_num_value_heads " + std::to_string(c.linear_num_value_heads) + " is not a multiple of linear_num_key_heads " +
           std::to_string(c.linear_num_key_heads));
  c.full_attention.clear();
  if (r.has("layer_types")) {
    if (!j["layer_types"].is_array() || static_cast<int64_t>(j["layer_types"].size()) != c.num_layers)
      r.fail("'layer_types' must list num_hidden_layers (" + std::to_string(c.num_layers) + ") layer types, got " + j["layer_types"].dump());
    for (const auto& t : j["layer_types"]) {
      if (t != "full_attention" && t != "linear_attention")
        r.fail("layer_types holds " + t.dump() + "; only \"linear_attention\" and \"full_attention\" layers are supported");
      c.full_attention.push_back(t == "full_attention");
    }
  } else {
    const int64_t interval = r.has("full_attention_interval") ? r.integer("full_attention_interval", 1) : 4;
    for (int64_t i = 0; i < c.num_layers; ++i) c.full_attention.push_back((i + 1) % interval == 0);
  }
  if (r.has("rms_norm_eps")) c.rms_norm_eps = r.number(j["rms_norm_eps"], "rms_norm_eps");
  if (r.has("rope_theta")) c.rope_theta = r.number(j["rope_theta"], "rope_theta");
  if (r.has("partial_rotary_factor")) c.partial_rotary_factor = r.number(j["partial_rotary_factor"], "partial_rotary_factor");
  if (r.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (!rp.is_object()) r.fail("'rope_parameters' must be an object");
    if (rp.contains("rope_type") && rp["rope_type"] != "default")
      r.fail("rope_parameters.rope_type " + rp["rope_type"].dump() + " is not supported (only \"default\")");
    if (rp.contains("rope_theta")) c.rope_theta = r.number(rp["rope_theta"], "rope_parameters.rope_theta");
    if (rp.contains("partial_rotary_factor")) c.partial_rotary_factor = r.number(rp["partial_rotary_factor"], "rope_parameters.partial_rotary_factor");
  }
  if (c.partial_rotary_factor > 1.0 || c.rotary_dim() < 2 || c.rotary_dim() % 2 != 0)
    r.fail("head_dim " + std::to_string(c.head_dim) + " times partial_rotary_factor " + std::to_string(c.partial_rotary_factor) +
           " must give an even number of rotary dims of at least 2");
  // Text positions are alike on mRoPE's three axes: the sections only have to cover the rotary
  // dims' frequencies for the rotation to be plain RoPE.
  if (r.has("rope_parameters") && j["rope_parameters"].contains("mrope_section")) {
    const json& ms = j["rope_parameters"]["mrope_section"];
    int64_t sum = 0;
    if (!ms.is_array()) r.fail("rope_parameters.mrope_section must be a list of integers");
    for (const auto& x : ms) {
      if (!x.is_number_integer()) r.fail("rope_parameters.mrope_section must be a list of integers");
      sum += x.get<int64_t>();
      c.mrope_section.push_back(x.get<int64_t>());
    }
    if (2 * sum != c.rotary_dim())
      r.fail("rope_parameters.mrope_section " + ms.dump() + " covers " + std::to_string(2 * sum) + " dims, the rotary dims are " +
             std::to_string(c.rotary_dim()));
  }
  if (r.has("max_position_embeddings")) c.max_position_embeddings = r.integer("max_position_embeddings", 1);
  // The vision-language model ties at its top level; a text config carries its own flag.
  if (outer.has("tie_word_embeddings")) c.tie_word_embeddings = outer.boolean("tie_word_embeddings");
  else if (r.has("tie_word_embeddings")) c.tie_word_embeddings = r.boolean("tie_word_embeddings");
  c.dtype = outer.has("dtype") || outer.has("torch_dtype") ? outer.dtype() : r.dtype();
  r.token_ids(c.eos_token_ids, c.bos_token_id, c.pad_token_id);
  return c;
}

Config load_config(const std::string& path) { return config_from_json(models::read_config_text(path, "qwen3_5::load_config"), path); }

std::string config_to_json(const Config& c) {
  json j;
  j["architectures"] = {c.is_moe() ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"};
  j["model_type"] = c.is_moe() ? "qwen3_5_moe_text" : "qwen3_5_text";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
  } else {
    j["intermediate_size"] = c.intermediate_size;
  }
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["linear_num_key_heads"] = c.linear_num_key_heads;
  j["linear_num_value_heads"] = c.linear_num_value_heads;
  j["linear_key_head_dim"] = c.linear_key_head_dim;
  j["linear_value_head_dim"] = c.linear_value_head_dim;
  j["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  json types = json::array();
  for (bool full : c.full_attention) types.push_back(full ? "full_attention" : "linear_attention");
  j["layer_types"] = types;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["rms_norm_eps"] = c.rms_norm_eps;
  // Sections covering the rotary frequencies as the published configs split them ([11, 11, 10]
  // of 32), when the config read had none.
  std::vector<int64_t> sections = c.mrope_section;
  if (sections.empty()) {
    const int64_t n = c.rotary_dim() / 2;
    sections = {n - 2 * (n / 3), n / 3, n / 3};
  }
  j["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", c.partial_rotary_factor},
                          {"mrope_section", sections},
                          {"mrope_interleaved", true}};
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["dtype"] = models::dtype_name(c.dtype);
  models::write_token_ids(j, c.eos_token_ids, c.bos_token_id, c.pad_token_id);
  return j.dump(2) + "\n";
}

CheckpointKeyMap hf_key_map(const Config& config) {
  const std::string prefix = config.vision_language ? "model.language_model." : "model.";
  const int64_t key_dim = config.linear_num_key_heads * config.linear_key_head_dim;
  const int64_t conv_dim = 2 * key_dim + config.linear_num_value_heads * config.linear_value_head_dim;
  const int64_t moe_i = config.moe_intermediate_size;
  // [Q ‖ K ‖ V] rows of the fused tensors.
  const std::string q_rows = "[0:" + std::to_string(key_dim) + "]", k_rows = "[" + std::to_string(key_dim) + ":" + std::to_string(2 * key_dim) + "]",
                    v_rows = "[" + std::to_string(2 * key_dim) + ":" + std::to_string(conv_dim) + "]";
  return [=](const std::string& fqn) -> std::string {
    if (fqn.rfind("lm_head.", 0) == 0) return fqn;
    // Stacked experts [E, ...] are per-expert Linear weights, as transformers' save_pretrained
    // writes them (and a save writes); or, as the published checkpoints hold them, the fused
    // gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I].
    static const std::string experts = ".mlp.experts.";
    if (const size_t e = fqn.find(experts); e != std::string::npos) {
      const std::string base = prefix + fqn.substr(0, e + experts.size()), proj = fqn.substr(e + experts.size());
      const std::string per_expert = base + "*." + proj + ".weight";
      if (proj == "gate_proj") return per_expert + "|" + base + "gate_up_proj[:, 0:" + std::to_string(moe_i) + "]";
      if (proj == "up_proj") return per_expert + "|" + base + "gate_up_proj[:, " + std::to_string(moe_i) + ":" + std::to_string(2 * moe_i) + "]";
      return per_expert + "|" + base + proj;
    }
    static const std::string linear = ".linear_attn.";
    const size_t at = fqn.find(linear);
    if (at == std::string::npos) return prefix + fqn;
    const std::string layer = prefix + fqn.substr(0, at + linear.size()), name = fqn.substr(at + linear.size());
    if (name == "in_proj_q.weight") return layer + "in_proj_qkv.weight" + q_rows;
    if (name == "in_proj_k.weight") return layer + "in_proj_qkv.weight" + k_rows;
    if (name == "in_proj_v.weight") return layer + "in_proj_qkv.weight" + v_rows;
    if (name == "gdn.conv_q") return layer + "conv1d.weight" + q_rows;
    if (name == "gdn.conv_k") return layer + "conv1d.weight" + k_rows;
    if (name == "gdn.conv_v") return layer + "conv1d.weight" + v_rows;
    if (name == "gdn.A_log" || name == "gdn.dt_bias") return layer + name.substr(4);
    return layer + name;
  };
}

HFLoadOptions hf_load_options(const Config& config) {
  HFLoadOptions options;
  options.key_map = hf_key_map(config);
  options.ignore = {"^model\\.visual\\.", "^mtp\\.", "^model\\.mtp\\."};
  return options;
}

}  // namespace qwen3_5
}  // namespace hyper_parallel
