#pragma once
// What the context-parallel styles take as a module input: this rank's sequence shard, a plain
// tensor or a DTensor sharded on the sequence dim over the cp mesh (ContextParallel and
// LinearAttentionContextParallel alike).
#include <ATen/core/ivalue.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>

namespace hyper_parallel {
namespace context_parallel {

/// The local shard of input `name` of `style`'s forward: `v` itself when plain, else its local
/// tensor, refused unless it is Shard(seq_dim) on `mesh`.
inline at::Tensor sequence_shard_input(const c10::IValue& v, const DeviceMesh& mesh, int64_t seq_dim, const char* style, const char* name) {
  HP_CHECK_T(c10::TypeError, v.isTensor(), "hyper_parallel::", style, "::forward: the ", name, " is not a tensor");
  const at::Tensor& t = v.toTensor();
  if (!is_dtensor(t)) return t;
  const DTensor d(t);
  HP_CHECK_T(c10::ValueError, d.device_mesh() == mesh && d.placements().size() == 1 && d.placements()[0].is_shard(seq_dim),
             "hyper_parallel::", style, "::forward: the ", name, " must be sequence-sharded (Shard(", seq_dim, ")) on ", mesh.short_string(),
             ", got ", to_string(d.placements()), " on ", d.device_mesh().short_string());
  return d.to_local();
}

}  // namespace context_parallel
}  // namespace hyper_parallel
