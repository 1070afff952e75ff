#pragma once
// Rotary position embedding as every Qwen family computes it (internal to the models library).
#include <ATen/ATen.h>

#include <utility>

namespace hyper_parallel {
namespace models {

/// cos/sin of the rotary embedding of `dim` dims at `positions` [B or 1, S]: [B or 1, 1, S, dim],
/// computed in float32 as transformers does (one product per angle, then cos and sin) and cast
/// to `dtype`.
inline std::pair<at::Tensor, at::Tensor> rotary_tables(const at::Tensor& positions, int64_t dim, double theta, at::ScalarType dtype) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(positions.device());
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim));
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;
  const at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

/// x [..., head_dim] rotated by the tables: the first cos.size(-1) dims rotate (pairs i and
/// i + half, transformers' rotate_half), the rest pass unchanged (partial rotary).
inline at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rd = cos.size(-1);
  const at::Tensor rot = rd == x.size(-1) ? x : x.narrow(-1, 0, rd);
  const auto halves = rot.chunk(2, -1);
  const at::Tensor rotated = rot * cos + at::cat({-halves[1], halves[0]}, -1) * sin;
  return rd == x.size(-1) ? rotated : at::cat({rotated, x.narrow(-1, rd, x.size(-1) - rd)}, -1);
}

}  // namespace models
}  // namespace hyper_parallel
