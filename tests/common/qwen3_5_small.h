#pragma once
// A small Qwen3.5 for the distributed training tests: the reference checkpoints' head layout (4 key
// heads serving 8 value heads in the linear layers, 4 query heads over 2 KV heads in the full one),
// and its 1-D weights drawn away from their initial values, so that a norm convention swapped or a
// slice taken from the wrong head shows.
#include <ATen/ATen.h>

#include <hyper_parallel/models/qwen3_5/model.h>

namespace hp_test {

/// vocab 128, hidden 64, MLP 96, [linear, linear, linear, full], heads 4/2 of 16, linear heads 4/8 of 8.
inline hyper_parallel::qwen3_5::Config small_qwen3_5_config() {
  hyper_parallel::qwen3_5::Config c;
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.linear_num_key_heads = 4;
  c.linear_num_value_heads = 8;
  c.linear_key_head_dim = 8;
  c.linear_value_head_dim = 8;
  c.full_attention = {false, false, false, true};
  return c;
}

/// Norm weights, A_log and dt_bias drawn (torch's generator) away from their initial values, and a
/// MoE router wide enough to route decisively.
inline void draw_small_weights(hyper_parallel::qwen3_5::CausalLMImpl& model) {
  at::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    if (p.value().dim() == 1) p.value().copy_(at::randn(p.value().sizes()) * 0.3 + (p.key().find("A_log") != std::string::npos ? 0.5 : 0.0));
    if (p.key().find("mlp.gate.weight") != std::string::npos) p.value().normal_(0.0, 0.5);
  }
}

}  // namespace hp_test
