#pragma once
// Which model family an HF checkpoint holds: its config.json's model_type, as transformers'
// AutoConfig dispatches on it.
#include <string>

namespace hyper_parallel {
namespace models {

/// The "model_type" of `path`: a checkpoint directory (its config.json) or a config.json itself
/// (e.g. "qwen3", "qwen3_moe", "qwen3_5_text", "qwen3_5").
/// A missing or unreadable file, text that is not a JSON object, or a missing or non-string
/// model_type raise c10::ValueError naming the file.
/// e.g. `if (models::hf_model_type(dir) == "qwen3_5_text") ...`
std::string hf_model_type(const std::string& path);

/// Whether `model_type` is one qwen3_5::load_config reads: "qwen3_5_text", "qwen3_5" (vision-language),
/// "qwen3_5_moe_text" or "qwen3_5_moe".
inline bool is_qwen3_5_type(const std::string& model_type) {
  return model_type == "qwen3_5" || model_type == "qwen3_5_text" || model_type == "qwen3_5_moe" || model_type == "qwen3_5_moe_text";
}

}  // namespace models
}  // namespace hyper_parallel
