#pragma once
// The keys a generation step's queries may not see (internal to the models library).
#include <ATen/ATen.h>

namespace hyper_parallel {
namespace models {

/// `s` new queries after `past` cached positions: query i sits at position past + i and sees
/// keys up to there, none of them padding (key_mask [B, past + s], false at padding; may be
/// undefined). [s, past + s], or [B, 1, s, past + s] with a key mask; true where blocked.
inline at::Tensor blocked_keys(int64_t past, int64_t s, const at::Tensor& key_mask, const at::Device& device) {
  const int64_t t = past + s;
  at::Tensor blocked = at::ones({s, t}, at::TensorOptions().dtype(at::kBool).device(device)).triu(past + 1);
  if (key_mask.defined()) blocked = blocked.logical_or(key_mask.to(device).logical_not().view({key_mask.size(0), 1, 1, t}));
  return blocked;
}

}  // namespace models
}  // namespace hyper_parallel
