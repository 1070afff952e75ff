#pragma once
// Qwen3.5 text generation with its hybrid cache (per full-attention layer K/V, per linear-attention
// layer the conv and recurrent state): models::generate over a Qwen3.5 CausalLM.
#include <hyper_parallel/models/generate.h>
#include <hyper_parallel/models/qwen3_5/model.h>

namespace hyper_parallel {
namespace qwen3_5 {

/// models::generate over `model` (see models/generate.h), whole or after parallelize_qwen3_5_tp
/// without sequence parallelism. Padding is zeroed before the linear layers' projections and
/// masked out of full attention, so a left-padded prompt generates as it would alone.
/// e.g. `auto out = qwen3_5::generate(*model, {{9707, 11}}, {/*max_new_tokens=*/32});`
hyper_parallel::models::GenerationResult generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                                  const hyper_parallel::models::GenerationConfig& config);

}  // namespace qwen3_5
}  // namespace hyper_parallel
