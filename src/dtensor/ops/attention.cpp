// Scaled dot-product attention on DTensors. libtorch decomposes it above autograd
// (aten::scaled_dot_product_attention into math or a fused kernel), and the math builds plain
// tensors of its own (the causal mask), which cannot meet DTensors. Attention is independent per
// batch entry and per head, so with q/k/v sharded on those dims (as Colwise q/k/v projections leave them) each rank
// runs it on its local heads: no collective, forward or backward. This kernel takes the op's place
// at the Autograd keys; plain tensors get libtorch's own math, unchanged.
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <memory>
#include <vector>

#include "../../runtime/dispatch_keys.h"
#include <ATen/ops/scaled_dot_product_attention_native.h>

namespace hyper_parallel {
namespace ops {
namespace {

// Redistributes q/k/v (and the mask) for a local attention, runs `local` on the local tensors and
// wraps its outputs: the attention output and, when `local` gives them, the attention weights.
template <typename Local>
std::pair<at::Tensor, at::Tensor> sdpa_on_dtensors(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                                   const c10::optional<at::Tensor>& attn_mask, Local local) {
  HP_CHECK_T(c10::ValueError, is_dtensor(query) && is_dtensor(key) && is_dtensor(value),
             "hyper_parallel::dispatch: aten::scaled_dot_product_attention needs query, key and value all DTensors or all plain");
  const DTensor q(query), k(key), v(value);
  const DeviceMesh& mesh = q.device_mesh();
  const int64_t nd = query.dim();
  // Batch and head dims (all but the last two) may stay sharded, alike on q, k and v; the sequence
  // and head-size dims must be whole; Partial values are reduced.
  Placements want = q.placements();
  for (auto& p : want)
    if (p.is_partial() || (p.is_shard() && p.dim() >= nd - 2)) p = Replicate();
  HP_CHECK_T(c10::ValueError, k.device_mesh() == mesh && v.device_mesh() == mesh && key.dim() == nd && value.dim() == nd,
             "hyper_parallel::dispatch: aten::scaled_dot_product_attention needs query, key and value on one mesh with the same rank");
  const DTensor lq = q.redistribute(want), lk = k.redistribute(want), lv = v.redistribute(want);
  c10::optional<at::Tensor> mask = attn_mask;
  if (mask && mask->defined()) {
    at::Tensor m = is_dtensor(*mask) ? DTensor(*mask).full_tensor() : *mask;
    // The mask broadcasts from the right: a sharded batch/head dim must be of size 1 (or absent) in it.
    bool sharded = false;
    for (const auto& p : want) {
      if (!p.is_shard()) continue;
      const int64_t md = p.dim() - (nd - m.dim());
      sharded = sharded || (md >= 0 && m.size(md) > 1);
    }
    HP_CHECK_T(c10::NotImplementedError, !sharded, "hyper_parallel::dispatch: aten::scaled_dot_product_attention with a mask of shape ",
               m.sizes(), " over dims that ", to_string(want), " shards is not supported; give a [L, S] mask");
    mask = m;
  }
  auto [out, weights] = local(lq.to_local(), lk.to_local(), lv.to_local(), mask);
  std::vector<int64_t> out_shape = query.sizes().vec();
  out_shape.back() = value.size(-1);
  at::Tensor dout = DTensor::from_local(out, mesh, want, false, out_shape);
  at::Tensor dweights;
  if (weights.defined() && weights.numel() > 0) {
    std::vector<int64_t> w_shape = query.sizes().vec();
    w_shape.back() = key.size(-2);
    dweights = DTensor::from_local(weights, mesh, want, false, w_shape);
  } else {
    dweights = weights;
  }
  return {dout, dweights};
}

// 2.x: the public op chooses a kernel (math, or flash attention on CPU and CUDA) from the inputs.
// Plain tensors take that same path; DTensors run it on their local heads.
at::Tensor sdpa(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                const c10::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                c10::optional<double> scale, bool enable_gqa) {
  if (!is_dtensor(query) && !is_dtensor(key) && !is_dtensor(value))
    return at::native::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  return sdpa_on_dtensors(query, key, value, attn_mask,
                          [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& m) {
                            return std::pair<at::Tensor, at::Tensor>(
                                at::scaled_dot_product_attention(q, k, v, m, dropout_p, is_causal, scale, enable_gqa), at::Tensor());
                          })
      .first;
}
constexpr const char* kSdpaOp = "scaled_dot_product_attention";

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel

// At the Autograd keys of every device, where libtorch's decomposition would run.
namespace {
const int kSdpaRegistered = [] {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  for (const c10::DispatchKey key : hyper_parallel::autograd_dispatch_keys()) {
    libs.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__));
    libs.back()->impl(hyper_parallel::ops::kSdpaOp, TORCH_FN(hyper_parallel::ops::sdpa));
  }
  return 0;
}();
}  // namespace
