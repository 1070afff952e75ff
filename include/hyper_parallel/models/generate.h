#pragma once
// Text generation for any causal LM that keeps its own cache: one prefill of the (left-padded)
// prompts, then one decode step per new token. Under tensor parallelism every rank runs the same
// loop on its own heads; the logits each step are replicated bit for bit (lm_head all-gathers
// them), and every rank samples with the same seeded generator, so every rank picks the same
// token without exchanging it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hyper_parallel {
namespace models {

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
  /// Keep each step's logits [B, vocab] (float32, host) in GenerationResult::logits, as
  /// transformers' output_logits.
  bool output_logits = false;
};

struct GenerationResult {
  /// The new tokens of each prompt, up to and including its stop token.
  std::vector<std::vector<int64_t>> tokens;
  /// With output_logits: each step's logits [B, vocab], before any filtering.
  std::vector<at::Tensor> logits;
  int64_t prefill_tokens = 0;  // prompt tokens (padding included)
  double prefill_seconds = 0;
  int64_t decode_steps = 0;  // steps after the prefill
  double decode_seconds = 0;
};

/// What a forward pass of generation adds to whole-sequence training, for a family whose cache is
/// `CacheT`: the positions of the new tokens [B, S] (rotary angles), which keys are real tokens
/// ([B, cached + S], false at padding), the cache the new tokens are appended to, and whether only
/// the last position's logits are wanted.
template <class CacheT>
struct ForwardContext {
  at::Tensor position_ids;
  at::Tensor key_mask;
  CacheT* cache = nullptr;
  bool last_position_only = false;
};

/// What generate() needs of a model: its sizes, and one forward over new tokens that appends them
/// to the model's cache. A model family implements it over its own cache (Qwen3's K/V; Qwen3.5's
/// K/V and its linear layers' conv and recurrent states).
class CausalLMForGeneration {
 public:
  virtual ~CausalLMForGeneration() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_position_embeddings() const = 0;
  /// Where the model's inputs go.
  virtual at::Device device() const = 0;
  /// A new, empty cache for `batch` sequences of up to `capacity` positions.
  virtual void reset_cache(int64_t batch, int64_t capacity) = 0;
  /// The logits [B, 1, vocab] of the last of the new tokens `input_ids` [B, S] (on device()),
  /// at `position_ids` [B, S] (host), which are appended to the cache. `key_mask` [B, cached + S]
  /// (host) is false at padding, which must not affect any real position.
  virtual at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, const at::Tensor& key_mask) = 0;
};

/// Generates continuations of `prompts` (token ids, any lengths) under c10::InferenceMode: no
/// autograd state is recorded. Prompts are left-padded into one batch, the padding masked out and
/// left out of the positions (as transformers' generate does). Bad input (an empty prompt, an id
/// outside the vocabulary, more positions than max_position_embeddings, top_p outside (0, 1], a
/// negative temperature) raises c10::ValueError before any computation.
/// e.g. `auto out = models::generate(adapter, {{9707, 11}}, {/*max_new_tokens=*/16});`
GenerationResult generate(CausalLMForGeneration& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& config);

}  // namespace models
}  // namespace hyper_parallel
