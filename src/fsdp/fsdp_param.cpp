#include "fsdp_param.h"

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/chunking.h>

#include <ATen/ATen.h>

namespace hyper_parallel {
namespace fsdp {

int64_t FSDPParam::piece_size(int64_t r) const {
  return chunk_size(compute_shape[static_cast<size_t>(dp_dim)], dp_size, r);
}

int64_t FSDPParam::piece_offset(int64_t r) const {
  return chunk_offset(compute_shape[static_cast<size_t>(dp_dim)], dp_size, r);
}

at::Tensor FSDPParam::slot(const at::Tensor& row) const { return row.narrow(0, offset, padded_numel).view(padded_shape); }

void FSDPParam::copy_in(const at::Tensor& row) const {
  at::Tensor mine = slot(row);
  if (dp_dim >= 0) mine = mine.narrow(dp_dim, 0, piece_size(dp_rank));
  mine.copy_(DTensor(sharded).to_local());
}

void FSDPParam::copy_out(const at::Tensor& rows) {
  if (dp_dim < 0) {  // replicated over dp: this rank's piece is the whole compute tensor
    unsharded.copy_(DTensor(sharded).to_local());
    return;
  }
  for (int64_t r = 0; r < dp_size; ++r) {
    const int64_t n = piece_size(r);
    if (n > 0)
      unsharded.narrow(dp_dim, piece_offset(r), n)
          .copy_(slot(rows[r]).narrow(dp_dim, 0, n));
  }
}

at::Tensor FSDPParam::compute_tensor() const {
  // A new tensor on the same storage: autograd sees a fresh output each forward, and the tensors
  // it saves keep reading this storage, refilled by unshard() before backward.
  at::Tensor local = at::empty({0}, unsharded.options()).set_(unsharded);
  if (!tp_mesh) return local;
  return DTensor::from_local(local, *tp_mesh, tp_placements, false, c10::IntArrayRef(global_shape));
}

void FSDPParam::pack_grad(const at::Tensor& grad, const at::Tensor& rows) const {
  for (int64_t r = 0; r < dp_size; ++r) {
    at::Tensor to = slot(rows[r]);
    if (dp_dim < 0) {
      to.add_(grad);
      continue;
    }
    const int64_t n = piece_size(r);
    if (n > 0) to.narrow(dp_dim, 0, n).add_(grad.narrow(dp_dim, piece_offset(r), n));
  }
}

at::Tensor FSDPParam::unpack_grad(const at::Tensor& row) const {
  at::Tensor g = slot(row);
  if (dp_dim >= 0) g = g.narrow(dp_dim, 0, piece_size(dp_rank));
  const DTensor p(sharded);
  // In the parameter's own dtype whatever the reduction's (mixed precision reduces in another).
  return DTensor::from_local(g.to(p.scalar_type(), false, /*copy=*/true, at::MemoryFormat::Contiguous), p.device_mesh(),
                             p.placements(), false, c10::IntArrayRef(global_shape));
}

void FSDPParam::install(const at::Tensor& value) const {
  // The compute tensor may have another dtype than the parameter (mixed precision).
  nn::detail::set_parameter_unchecked(*owner, name, value);
  for (const auto& [module, slot] : aliases) nn::detail::set_parameter_unchecked(*module, slot, value);
}

}  // namespace fsdp
}  // namespace hyper_parallel
