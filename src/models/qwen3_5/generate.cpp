#include <hyper_parallel/models/qwen3_5/generate.h>

#include "../generating.h"

namespace hyper_parallel {
namespace qwen3_5 {

hyper_parallel::models::GenerationResult generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                                  const hyper_parallel::models::GenerationConfig& config) {
  hyper_parallel::models::Generating<CausalLMImpl, Cache> generating(model);
  return hyper_parallel::models::generate(generating, prompts, config);
}

}  // namespace qwen3_5
}  // namespace hyper_parallel
