#pragma once
// DTensor: a distributed tensor that *is* an at::Tensor. Its sizes are the global sizes; its data
// is this rank's local shard; every aten op on it is sharded by the op's rule (dtensor/ops) and
// autograd records on the DTensor itself, so gradients are DTensors and torch::optim works on
// DTensor parameters unchanged.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <ostream>

#include <hyper_parallel/dtensor/dtensor_spec.h>
#include <hyper_parallel/dtensor/placement.h>
#include <hyper_parallel/mesh/device_mesh.h>

namespace hyper_parallel {

/// Whether `t` is a DTensor.
bool is_dtensor(const at::Tensor& t);

/// A handle on a DTensor: an at::Tensor with the DTensor accessors, and no state of its own.
/// Constructing one from a plain tensor throws.
class DTensor : public at::Tensor {
 public:
  DTensor() = default;
  /// Views `t` (which must be a DTensor) through the DTensor accessors.
  explicit DTensor(at::Tensor t);

  const DTensorSpec& spec() const;
  const Placements& placements() const;
  const DeviceMesh& device_mesh() const;
  /// Whether this is a view whose local data is a copy: making it needed communication (e.g.
  /// `x.narrow(0, 1, 2)` of a Shard(0) `x`). It shares no data with its base, unlike the plain
  /// view, so in-place writes into it are refused on every rank.
  bool is_copy_view() const;
  /// This rank's shard as a plain tensor. Differentiable: the gradient flowing back becomes a
  /// DTensor with `grad_placements` (default: this tensor's placements, Partial as Replicate).
  at::Tensor to_local(c10::optional<Placements> grad_placements = c10::nullopt) const;
  /// The same values laid out by `placements` on `mesh` (which must be this tensor's mesh).
  /// Differentiable, with PyTorch's backward rules (e.g. Shard -> Replicate is an all-gather
  /// forward and a local chunk backward). e.g. `y = x.redistribute(mesh, {hp::Replicate()});`
  DTensor redistribute(const DeviceMesh& mesh, const Placements& placements) const;
  DTensor redistribute(const Placements& placements) const;
  /// redistribute with PyTorch's forward_dtype/backward_dtype: the forward collective runs in
  /// `forward_dtype` (the result keeps it), the backward one in `backward_dtype`, and the gradient
  /// returns in this tensor's dtype. e.g. `x.redistribute(mesh, {hp::Replicate()}, at::kBFloat16, at::kFloat)`.
  DTensor redistribute(const DeviceMesh& mesh, const Placements& placements, c10::optional<c10::ScalarType> forward_dtype,
                       c10::optional<c10::ScalarType> backward_dtype) const;
  /// The whole tensor on every rank (redistribute to Replicate, then to_local). Differentiable.
  at::Tensor full_tensor() const;

  /// Wraps each rank's `local` into one DTensor without communication. The global shape is
  /// `shape` when given, otherwise `local`'s sizes times the mesh sizes of the sharded dims
  /// (even shards). With `run_check` the ranks compare their local shapes (one all_gather per
  /// mesh dim) and, for Replicate, take the values of coordinate 0 (a broadcast). Differentiable:
  /// the gradient of `local` is the DTensor gradient redistributed to `placements` (Partial as
  /// Replicate), then its local shard.
  /// e.g. `auto x = hp::DTensor::from_local(local, tp, {hp::Shard(0)});`
  static DTensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                            const Placements& placements, bool run_check = false,
                            c10::optional<at::IntArrayRef> shape = c10::nullopt,
                            c10::optional<at::IntArrayRef> stride = c10::nullopt);
};

/// This rank's piece of `t`: a DTensor's local shard (DTensor::to_local, differentiable), a plain
/// tensor itself. The one spelling of "the local tensor of a maybe-DTensor".
/// e.g. `const int64_t local_rows = hp::local_tensor(weight).size(0);`
at::Tensor local_tensor(const at::Tensor& t);

/// Splits or replicates a whole tensor over `mesh` (PyTorch's distribute_tensor).
/// `src_data_rank` = k: the values of the rank at coordinate k on every mesh dimension are what
/// every rank ends up with (scatter / broadcast; other ranks may pass anything of the same shape,
/// e.g. zeros). `c10::nullopt`: each rank slices its own copy, no communication (all ranks must
/// hold the same values). Meta tensors never communicate. Uneven dims follow torch.chunk.
/// The result is a leaf that requires grad when `tensor` does.
/// e.g. `auto w = hp::distribute_tensor(weight, tp, {hp::Shard(0)});`
DTensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                          const Placements& placements,
                          c10::optional<int64_t> src_data_rank = 0);

/// RAII: while alive, plain tensors mixed with DTensors in an op are treated as Replicate
/// DTensors on the other operands' mesh (instead of being an error).
class ImplicitReplicationGuard {
 public:
  ImplicitReplicationGuard();
  ~ImplicitReplicationGuard();
  ImplicitReplicationGuard(const ImplicitReplicationGuard&) = delete;
  ImplicitReplicationGuard& operator=(const ImplicitReplicationGuard&) = delete;
  static bool enabled();

 private:
  bool previous_;
};

/// Prints the spec and the local shard (a DTensor has no storage for torch's printer to read).
std::ostream& operator<<(std::ostream& os, const DTensor& t);

}  // namespace hyper_parallel
