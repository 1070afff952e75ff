#pragma once
// Executing a redistribution plan on local tensors (no autograd). Internal.
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include <hyper_parallel/dtensor/dtensor_spec.h>
#include <hyper_parallel/dtensor/redistribute_plan.h>

namespace hyper_parallel {

/// The local shard of `local` (laid out by `src`) once laid out by `dst`.
at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src, const Placements& dst);
/// The same along `steps`, planned by plan_redistribute(src's mesh shape, src.placements, dst).
at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src, const std::vector<RedistributeStep>& steps);

/// This rank's piece of `whole`, which every rank holds whole, laid out by `placements` on a
/// mesh of `mesh_shape` at `coordinate`: the torch.chunk piece along every sharded dim (a view),
/// zeros on a Partial(sum) mesh dim off its coordinate 0 (so the value is counted once). No
/// communication.
at::Tensor local_piece_of_whole(const at::Tensor& whole, const std::vector<int64_t>& mesh_shape,
                                const std::vector<int64_t>& coordinate, const Placements& placements);

/// `spec` with other placements (and contiguous strides when they change).
std::shared_ptr<const DTensorSpec> spec_with_placements(const DTensorSpec& spec, Placements placements);

/// The transition `src` -> `steps`' last placements in the compact form of traces and errors,
/// with each collective, its mesh dim and the bytes this rank contributes, e.g.
/// "S(0) -> R: all_gather over tp (256 B)".
std::string describe_redistribution(const DTensorSpec& src, const std::vector<RedistributeStep>& steps);

}  // namespace hyper_parallel
