#pragma once
// Qwen3 text generation with its KV cache: models::generate over a Qwen3 CausalLM.
#include <hyper_parallel/models/generate.h>
#include <hyper_parallel/models/qwen3/model.h>

namespace hyper_parallel {
namespace qwen3 {

using GenerationConfig = hyper_parallel::models::GenerationConfig;
using GenerationResult = hyper_parallel::models::GenerationResult;

/// models::generate over `model` (see models/generate.h), whole or tensor parallel.
/// e.g. `auto out = qwen3::generate(*model, {tok.encode("Hello")}, {/*max_new_tokens=*/32});`
GenerationResult generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& config);

}  // namespace qwen3
}  // namespace hyper_parallel
