#pragma once
// Qwen3.5's config.json (transformers' Qwen3_5TextConfig, model_type "qwen3_5_text", and
// Qwen3_5MoeTextConfig, "qwen3_5_moe_text", or the vision-language "qwen3_5" / "qwen3_5_moe" whose
// text model sits under "text_config") and the names of the text model's tensors in an HF checkpoint.
#include <string>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/models/qwen3_5/model.h>

namespace hyper_parallel {
namespace qwen3_5 {

/// Reads a Qwen3.5 config.json: the text model's sizes, the layer schedule (`layer_types`, else
/// every `full_attention_interval`-th layer full, default 4), rope_parameters (rope_theta,
/// partial_rotary_factor; mrope_section must cover the rotary dims, and is otherwise plain RoPE for
/// text), tie_word_embeddings (the top level's, else text_config's, else false). What this
/// implementation does not do (another rope_type, rope_scaling, attention_bias, a hidden_act other
/// than silu, a layer type other than linear_attention / full_attention, experts in a dense
/// model_type) is refused by
/// name with c10::ValueError, as are missing keys and values of the wrong type.
Config config_from_json(const std::string& text, const std::string& origin = "config.json");
/// Reads `path` with config_from_json.
Config load_config(const std::string& path);

/// The text model's config.json as transformers writes a Qwen3_5TextConfig (model_type
/// "qwen3_5_text", Qwen3_5ForCausalLM), whatever layout `config` was read from: what
/// save_pretrained writes beside the text model's tensors.
std::string config_to_json(const Config& config);

/// Our parameter names to the checkpoint's, for text checkpoints ("model." prefix) or, with
/// `vision_language`, the published ones ("model.language_model."): a linear-attention layer's
/// in_proj_q/k/v and its GatedDeltaNet's conv_q/k/v are row ranges of HF's fused `in_proj_qkv`
/// and `conv1d` ([Q ‖ K ‖ V]); `A_log` and `dt_bias` are the layer's own. A MoE layer's stacked
/// experts are HF's per-expert `mlp.experts.<e>.{gate,up,down}_proj.weight` (what a save writes) or
/// the fused `mlp.experts.gate_up_proj` [E, 2I, H] (gate and up halves of dim 1) and `down_proj`,
/// whichever the checkpoint holds.
/// e.g. `hp::load_hf_checkpoint(*model, dir, {qwen3_5::hf_key_map(config)});`
CheckpointKeyMap hf_key_map(const Config& config);

/// What loading the text model reads and skips: hf_key_map, and the published checkpoints'
/// vision tower and multi-token-prediction head ignored (`model.visual.*`, `mtp.*`, `model.mtp.*`),
/// as transformers' Qwen3_5ForCausalLM ignores them.
/// e.g. `auto report = hp::load_hf_checkpoint(*model, dir, qwen3_5::hf_load_options(config));`
HFLoadOptions hf_load_options(const Config& config);

}  // namespace qwen3_5
}  // namespace hyper_parallel
