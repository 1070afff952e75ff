#include <hyper_parallel/models/generate.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <hyper_parallel/runtime/errors.h>

#include <algorithm>
#include <chrono>

namespace hyper_parallel {
namespace models {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The next token of each row of `logits` [B, V] (float32, on the host).
at::Tensor pick(at::Tensor logits, const GenerationConfig& g, at::Generator& gen) {
  if (g.temperature == 0) return logits.argmax(-1);
  logits = logits / g.temperature;
  const int64_t v = logits.size(-1);
  if (g.top_k > 0 && g.top_k < v) {
    const at::Tensor kth = std::get<0>(logits.topk(g.top_k, -1)).narrow(-1, g.top_k - 1, 1);
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  if (g.top_p < 1.0) {
    auto [sorted, order] = logits.sort(-1, /*descending=*/true);
    const at::Tensor probs = sorted.softmax(-1);
    // Drop a token when the tokens ranked above it already reach top_p: the first always stays.
    const at::Tensor drop_sorted = (probs.cumsum(-1) - probs) >= g.top_p;
    logits = logits.masked_fill(at::zeros_like(drop_sorted).scatter(-1, order, drop_sorted), -std::numeric_limits<float>::infinity());
  }
  return at::multinomial(logits.softmax(-1), 1, /*replacement=*/false, gen).squeeze(-1);
}

}  // namespace

GenerationResult generate(CausalLMForGeneration& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& g) {
  const int64_t vocab = model.vocab_size();
  HP_CHECK_T(c10::ValueError, !prompts.empty(), "hyper_parallel::models::generate: no prompts");
  HP_CHECK_T(c10::ValueError, g.max_new_tokens >= 1, "hyper_parallel::models::generate: max_new_tokens must be at least 1, got ", g.max_new_tokens);
  HP_CHECK_T(c10::ValueError, g.temperature >= 0, "hyper_parallel::models::generate: temperature must be >= 0, got ", g.temperature);
  HP_CHECK_T(c10::ValueError, g.top_p > 0 && g.top_p <= 1, "hyper_parallel::models::generate: top_p must be in (0, 1], got ", g.top_p);
  HP_CHECK_T(c10::ValueError, g.top_k >= 0, "hyper_parallel::models::generate: top_k must be >= 0, got ", g.top_k);
  HP_CHECK_T(c10::ValueError, g.pad_token_id >= 0 && g.pad_token_id < vocab, "hyper_parallel::models::generate: pad_token_id ", g.pad_token_id,
             " is outside the vocabulary [0, ", vocab, ")");
  size_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    HP_CHECK_T(c10::ValueError, !prompts[b].empty(), "hyper_parallel::models::generate: prompt ", b, " is empty");
    for (int64_t id : prompts[b])
      HP_CHECK_T(c10::ValueError, id >= 0 && id < vocab, "hyper_parallel::models::generate: prompt ", b, " holds token ", id,
                 ", outside the vocabulary [0, ", vocab, ")");
    longest = std::max(longest, prompts[b].size());
  }
  const int64_t batch = static_cast<int64_t>(prompts.size()), len = static_cast<int64_t>(longest);
  HP_CHECK_T(c10::ValueError, len + g.max_new_tokens <= model.max_position_embeddings(), "hyper_parallel::models::generate: ", len, " prompt positions and ",
             g.max_new_tokens, " new tokens exceed max_position_embeddings (", model.max_position_embeddings(), ")");

  c10::InferenceMode inference;
  at::Tensor ids = at::full({batch, len}, g.pad_token_id, at::kLong);
  at::Tensor mask = at::zeros({batch, len + g.max_new_tokens}, at::kBool);
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const int64_t pad = len - static_cast<int64_t>(p.size());
    ids[b].narrow(0, pad, static_cast<int64_t>(p.size())).copy_(at::tensor(p, at::kLong));
    mask[b].narrow(0, pad, len + g.max_new_tokens - pad).fill_(true);
  }
  const at::Tensor prompt_mask = mask.narrow(1, 0, len);
  // Positions count real tokens only; padding gets 1, as transformers' generate gives it.
  at::Tensor positions = (prompt_mask.to(at::kLong).cumsum(1) - 1).masked_fill(prompt_mask.logical_not(), 1);
  const at::Device device = model.device();
  model.reset_cache(batch, len + g.max_new_tokens);
  at::Generator gen = at::detail::createCPUGenerator(g.seed);

  GenerationResult out;
  out.tokens.resize(static_cast<size_t>(batch));
  std::vector<bool> done(static_cast<size_t>(batch), false);
  at::Tensor input = ids.to(device);
  const at::Tensor last_prompt_position = positions.narrow(1, len - 1, 1);
  auto t0 = std::chrono::steady_clock::now();
  int64_t cached = 0;
  for (int64_t step = 0; step < g.max_new_tokens; ++step) {
    // Decode step `step` feeds the token sampled at step - 1, one past the last prompt position.
    const at::Tensor step_positions = step == 0 ? positions : last_prompt_position + step;
    cached += input.size(1);
    const at::Tensor logits = model.forward_step(input, step_positions, mask.narrow(1, 0, cached)).select(1, 0).to(at::kCPU, at::kFloat);
    if (g.output_logits) out.logits.push_back(logits.clone());
    at::Tensor next = pick(logits, g, gen);
    auto* p = next.data_ptr<int64_t>();
    bool all_done = true;
    for (int64_t b = 0; b < batch; ++b) {
      if (done[static_cast<size_t>(b)]) {
        p[b] = g.pad_token_id;
        continue;
      }
      out.tokens[static_cast<size_t>(b)].push_back(p[b]);
      if (std::find(g.eos_token_ids.begin(), g.eos_token_ids.end(), p[b]) != g.eos_token_ids.end()) done[static_cast<size_t>(b)] = true;
      all_done = all_done && done[static_cast<size_t>(b)];
    }
    if (step == 0) {
      out.prefill_tokens = batch * len;
      out.prefill_seconds = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    } else {
      ++out.decode_steps;
    }
    if (all_done || step + 1 == g.max_new_tokens) break;
    input = next.unsqueeze(1).to(device);
  }
  out.decode_seconds = out.decode_steps ? seconds_since(t0) : 0;
  return out;
}

}  // namespace models
}  // namespace hyper_parallel
