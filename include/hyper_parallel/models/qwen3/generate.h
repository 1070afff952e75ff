#pragma once
// Text generation with a KV cache: one prefill of the (left-padded) prompts, then one decode step
// per new token. Under tensor parallelism every rank runs the same loop on its own heads; the
// logits each step are replicated bit for bit (lm_head all-gathers them), and every rank samples
// with the same seeded generator, so every rank picks the same token without exchanging it.
#include <cstdint>
#include <vector>

#include <hyper_parallel/models/qwen3/model.h>

namespace hyper_parallel {
namespace qwen3 {

/// How to pick tokens (transformers' GenerationConfig names).
struct GenerationConfig {
  int64_t max_new_tokens = 32;
  /// 0: greedy (argmax). Otherwise sample from softmax(logits / temperature) after top_k and top_p.
  double temperature = 0;
  int64_t top_k = 0;   // 0: no top-k filter
  double top_p = 1.0;  // 1: no nucleus filter
  uint64_t seed = 0;   // the sampling generator's seed (the same on every rank)
  /// A sequence ends after any of these; its later positions hold pad_token_id.
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = 0;
};

struct GenerationResult {
  /// The new tokens of each prompt, up to and including its stop token.
  std::vector<std::vector<int64_t>> tokens;
  int64_t prefill_tokens = 0;  // prompt tokens (padding included)
  double prefill_seconds = 0;
  int64_t decode_steps = 0;  // steps after the prefill
  double decode_seconds = 0;
};

/// Generates continuations of `prompts` (token ids, any lengths) under c10::InferenceMode: no
/// autograd state is recorded. Prompts are left-padded into one batch, the padding masked out of
/// attention and left out of the positions (as transformers' generate does). Bad input (an empty
/// prompt, an id outside the vocabulary, more positions than max_position_embeddings, top_p
/// outside (0, 1], a negative temperature) raises c10::ValueError before any computation.
GenerationResult generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& config);

}  // namespace qwen3
}  // namespace hyper_parallel
