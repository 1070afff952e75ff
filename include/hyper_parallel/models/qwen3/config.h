#pragma once
// Qwen3's config.json (as transformers writes it) to our Config and back, and the names of the
// model's tensors in an HF checkpoint.
#include <string>

#include <hyper_parallel/models/qwen3/model.h>

namespace hyper_parallel {
namespace qwen3 {

/// Reads an HF Qwen3 config.json (model_type "qwen3") or Qwen3-MoE one ("qwen3_moe": num_experts
/// or num_local_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
/// decoder_sparse_step, mlp_only_layers, router_aux_loss_coef, output_router_logits). Keys that change the model in ways this
/// implementation does not (rope_scaling or a rope_type other than "default", sliding-window
/// attention, attention_bias, a hidden_act other than silu) are refused by name with
/// c10::ValueError, as are missing required keys and values of the wrong type; keys that only
/// concern training or other libraries are ignored.
Config config_from_json(const std::string& text, const std::string& origin = "config.json");
/// Reads `path` with config_from_json.
Config load_config(const std::string& path);
/// config.json text that transformers' Qwen3Config.from_pretrained reads back to this model.
std::string config_to_json(const Config& c);

/// Our parameter names (embed_tokens.weight, layers.0.self_attn.q_proj.weight, ...) to HF's
/// (model.embed_tokens.weight, ...; lm_head.weight as is). A CheckpointKeyMap. Stacked experts
/// (layers.1.mlp.experts.gate_proj [E, I, H]) map to HF's per-expert keys
/// (model.layers.1.mlp.experts.*.gate_proj.weight, one [I, H] tensor per expert).
std::string hf_key(const std::string& fqn);

}  // namespace qwen3
}  // namespace hyper_parallel
