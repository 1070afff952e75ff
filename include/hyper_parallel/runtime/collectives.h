#pragma once
// Collectives on a Group, device-agnostic and autograd-free (the DTensor layer wraps them in
// autograd functions). Every call is blocking and records itself in active CommDebugModes.
// Uneven shards follow torch.chunk: a dim of size n split over g ranks gives ceil(n/g) to the
// leading ranks and less (or nothing) to the trailing ones.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <hyper_parallel/runtime/process_group.h>
#include <hyper_parallel/runtime/reduce_op.h>

namespace hyper_parallel {

/// Concatenates every rank's `local` along `dim`. `full_size` is the size of the result along
/// `dim`; when the shards are uneven (torch.chunk of full_size) it must be given, otherwise all
/// shards are taken to be as large as this rank's.
/// e.g. rank r holds rows of torch.chunk(x, g)[r]: `all_gather(local, 0, g, x.size(0))` == x.
at::Tensor all_gather(const at::Tensor& local, int64_t dim, const Group& group,
                      c10::optional<int64_t> full_size = c10::nullopt);

/// Reduces `tensor` across the group in place and returns it.
at::Tensor& all_reduce_(at::Tensor& tensor, ReduceOp op, const Group& group);
/// Out-of-place all_reduce; `tensor` is left untouched.
at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op, const Group& group);

/// Reduces `input` (same shape on every rank) and returns this rank's torch.chunk piece along
/// `dim`. Built from one all-to-all plus a local reduction (bandwidth-optimal; Gloo has no
/// reduce_scatter); counted as one "reduce_scatter".
at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op, int64_t dim, const Group& group);

/// Splits `local` along `split_dim` into group-size torch.chunk pieces, sends piece j to rank j,
/// and concatenates what arrives along `concat_dim` in rank order. `concat_full_size` is the
/// size of the result along concat_dim when the peers' pieces are uneven.
at::Tensor all_to_all(const at::Tensor& local, int64_t split_dim, int64_t concat_dim,
                      const Group& group, c10::optional<int64_t> concat_full_size = c10::nullopt);

/// Overwrites `tensor` on every rank with group rank `src`'s values.
at::Tensor& broadcast_(at::Tensor& tensor, int64_t src, const Group& group);

/// Group rank `src` splits `full` along `dim` (torch.chunk); every rank returns its piece.
/// Every rank passes a tensor of the full shape and dtype; only `src`'s values are read.
at::Tensor scatter(const at::Tensor& full, int64_t dim, int64_t src, const Group& group);

/// Waits until every rank of the group arrives.
void barrier(const Group& group);

}  // namespace hyper_parallel
