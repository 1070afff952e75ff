#pragma once
// What the training-at-scale tests share: a small Qwen3 model and the rows of a global batch a
// data-parallel rank trains on.
#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

#include "../../common/test_util.h"

namespace training_test {
namespace hp = hyper_parallel;
namespace qwen3 = hyper_parallel::qwen3;

/// 2 layers, hidden 32, 4 heads over 2 KV heads: every split the tests use divides it.
inline qwen3::Config small_config(double dropout = 0.0, bool tied = false) {
  qwen3::Config c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.attention_dropout = dropout;
  c.tie_word_embeddings = tied;
  return c;
}

/// The rows of `global` (dim 0) that data-parallel rank `rank` of `size` trains on.
inline at::Tensor dp_rows(const at::Tensor& global, int64_t rank, int64_t size) {
  return global.chunk(size, 0)[rank].contiguous();
}

/// Token ids [batch, seq + 1] from a fixed seed (inputs: the first seq, targets: the last seq).
inline at::Tensor token_batch(int64_t vocab, int64_t batch, int64_t seq, uint64_t seed) {
  return at::randint(vocab, {batch, seq + 1}, at::detail::createCPUGenerator(seed), at::kLong);
}

/// A DTensor's whole value, or a plain tensor.
inline at::Tensor whole(const at::Tensor& t) { return hp::is_dtensor(t) ? hp::DTensor(t).full_tensor() : t; }

}  // namespace training_test
