#include <hyper_parallel/models/qwen3/generate.h>

#include "../generating.h"

namespace hyper_parallel {
namespace qwen3 {

GenerationResult generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& config) {
  hyper_parallel::models::Generating<CausalLMImpl, KVCache> generating(model);
  return hyper_parallel::models::generate(generating, prompts, config);
}

}  // namespace qwen3
}  // namespace hyper_parallel
