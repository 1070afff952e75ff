// Gradient norms over a device mesh (nn/clip_grad.h).
#include <hyper_parallel/nn/clip_grad.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace hyper_parallel {

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : module.parameters(true))
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

namespace {

// The gradients whose pieces are summed over the same ranks: one mesh, the same sharded dims.
struct Partition {
  DeviceMesh mesh;  // undefined: plain gradients (this rank's own)
  std::vector<int64_t> shard_dims;
  at::Tensor acc;   // sum of |x|^p (or max |x|) over this rank's pieces, float64
};

}  // namespace

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type, bool error_if_nonfinite,
                           const DeviceMesh& pp_mesh) {
  HP_CHECK_T(c10::ValueError, !pp_mesh.defined() || pp_mesh.ndim() == 1, "hyper_parallel::clip_grad_norm_: pp_mesh must be 1-D, got ",
             pp_mesh.defined() ? pp_mesh.ndim() : 0, "-D");
  HP_CHECK_T(c10::ValueError, norm_type > 0.0, "hyper_parallel::clip_grad_norm_: norm_type must be positive (or inf), got ", norm_type);
  HP_CHECK_T(c10::ValueError, max_norm >= 0.0 && !std::isnan(max_norm), "hyper_parallel::clip_grad_norm_: max_norm must be non-negative, got ",
             max_norm);
  const bool inf = std::isinf(norm_type);
  std::vector<Partition> parts;
  std::vector<at::Tensor> grads;  // what is scaled in the end: the local pieces
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : parameters) {
    if (!p.defined() || !p.grad().defined() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    at::Tensor g = p.grad();
    Partition key;
    at::Tensor local = g;
    if (is_dtensor(g)) {
      DTensor d(g);
      Placements target = d.placements();
      bool partial = false;
      for (auto& pl : target)
        if (pl.is_partial()) {
          pl = Replicate();
          partial = true;
        }
      // A Partial gradient's value is the sum of its pieces: the norm needs the sum.
      const DTensor reduced = partial ? d.redistribute(target) : d;
      key.mesh = d.device_mesh();
      for (size_t k = 0; k < target.size(); ++k)
        if (target[k].is_shard()) key.shard_dims.push_back(static_cast<int64_t>(k));
      local = reduced.to_local();
      grads.push_back(d.to_local());
    } else {
      grads.push_back(g);
    }
    at::Tensor contribution = local.numel() == 0 ? at::zeros({}, local.options().dtype(at::kDouble))
                              : inf ? local.detach().abs().max().to(at::kDouble)
                                    : at::linalg_vector_norm(local.detach(), norm_type, c10::nullopt, false, at::kDouble).pow(norm_type);
    auto it = std::find_if(parts.begin(), parts.end(), [&](const Partition& q) {
      return q.mesh.defined() == key.mesh.defined() && (!key.mesh.defined() || q.mesh == key.mesh) && q.shard_dims == key.shard_dims;
    });
    if (it == parts.end()) {
      key.acc = contribution;
      parts.push_back(std::move(key));
    } else {
      it->acc = inf ? at::maximum(it->acc, contribution) : it->acc + contribution;
    }
  }
  at::Tensor total;
  for (Partition& q : parts) {
    for (int64_t dim : q.shard_dims) all_reduce_(q.acc, inf ? ReduceOp::MAX : ReduceOp::SUM, q.mesh.get_group(dim));
    total = !total.defined() ? q.acc : inf ? at::maximum(total, q.acc.to(total.device())) : total + q.acc.to(total.device());
  }
  // The stages' sums (or maxima) together: each holds other parameters.
  if (pp_mesh.defined()) {
    if (!total.defined()) total = at::zeros({}, at::kDouble);
    all_reduce_(total, inf ? ReduceOp::MAX : ReduceOp::SUM, pp_mesh.get_group(0));
  }
  if (!total.defined()) return at::zeros({}, at::kFloat);
  if (!inf) total = total.pow(1.0 / norm_type);
  if (error_if_nonfinite) {
    const double n = total.item<double>();
    HP_CHECK_T(c10::ValueError, std::isfinite(n), "hyper_parallel::clip_grad_norm_: the total norm of order ", norm_type,
               " of the gradients is ", n, ", so they cannot be clipped; pass error_if_nonfinite=false to scale them anyway");
  }
  const at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  at::NoGradGuard no_grad;
  for (at::Tensor& g : grads) g.mul_(coef.to(g.device()));
  return total.to(at::kFloat);
}

}  // namespace hyper_parallel
