#pragma once
// Ring attention on local tensors (context_parallel.cpp's "ring" mode), with its own backward.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {
namespace context_parallel {

/// q [B, H, s, D], k and v [B, Hk, s, D]: this rank's shard of the sequence (contiguous, or the
/// head-tail chunks r and 2·cp-1-r with load_balance) -> this rank's shard of the output, in q's
/// dtype. Computed in float32 block by block, merged by log-sum-exp. Collective over `group`
/// (every rank in the same order, forward and backward).
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Group& group, bool is_causal,
                          bool load_balance, c10::optional<double> scale);

/// The positions of group rank `rank`'s `s` local positions out of s·cp.
at::Tensor shard_positions(int64_t s, int64_t cp, int64_t rank, bool load_balance, const at::TensorOptions& options);

}  // namespace context_parallel
}  // namespace hyper_parallel
