#pragma once
// One parameter under fully_shard (internal): how it is sharded over dp and rebuilt for compute,
// and where its piece lives in its group's flat buffers. Every rank's piece is padded to the
// same size (ceil(n / dp) along the sharded dim), so one even all-gather and one even
// reduce-scatter move a whole group.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <memory>
#include <string>

#include <hyper_parallel/dtensor/dtensor_spec.h>
#include <hyper_parallel/mesh/device_mesh.h>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace hyper_parallel {
namespace fsdp {

struct FSDPParam {
  torch::nn::Module* owner = nullptr;
  std::string name;   // in owner
  // The other slots that hold this very parameter (tied weights, e.g. lm_head sharing
  // embed_tokens' weight): sharded once, and every slot gets the same tensors.
  std::vector<std::pair<torch::nn::Module*, std::string>> aliases;
  at::Tensor sharded; // the DTensor parameter optimizers and state dicts see

  int64_t dp_size = 1, dp_rank = 0;           // over the dp mesh's shard dimension (its last)
  int64_t dp_dim = -1;                         // tensor dim sharded over dp; -1: replicated over dp
  std::vector<int64_t> compute_shape;          // local shape of the compute tensor (the TP piece)
  std::vector<int64_t> padded_shape;           // a rank's padded piece (compute_shape, padded along dp_dim)
  int64_t padded_numel = 0;
  int64_t offset = 0;                          // of the padded piece in the group's flat row
  c10::optional<DeviceMesh> tp_mesh;           // the compute tensor is a DTensor on it, else plain
  Placements tp_placements;
  // With tp_mesh: the root the sharded parameter lives on (dp's, or that root with the tp
  // dimension unflattened), and dp's (last) dimension in it.
  c10::optional<DeviceMesh> shard_root;
  int64_t dp_dim_in_root = -1;
  std::vector<int64_t> global_shape;
  at::Tensor unsharded;                        // persistent compute-local storage (freed when resharded)

  /// Rows of dp_dim that dp rank `r` holds (torch.chunk); only for dp_dim >= 0.
  int64_t piece_size(int64_t r) const;
  int64_t piece_offset(int64_t r) const;
  /// This parameter's padded piece in a flat row of its group, shaped padded_shape.
  at::Tensor slot(const at::Tensor& row) const;
  /// Writes this rank's piece into its padded slot of `row` (the group's flat send row).
  void copy_in(const at::Tensor& row) const;
  /// Fills `unsharded` from the all-gathered rows ([dp, row numel]).
  void copy_out(const at::Tensor& rows);
  /// The tensor forward computes with, sharing `unsharded`'s storage (a DTensor under TP).
  at::Tensor compute_tensor() const;
  /// Adds gradient `grad` (of the compute tensor) to the reduce-scatter input ([dp, row], in the
  /// reduction's dtype): rank r's row gets the piece rank r keeps; a parameter replicated over dp
  /// goes to every row, so the reduce-scatter all-reduces it.
  void pack_grad(const at::Tensor& grad, const at::Tensor& rows) const;
  /// The sharded parameter's gradient, in its dtype, from this rank's reduced row.
  at::Tensor unpack_grad(const at::Tensor& row) const;
  /// Puts `value` into the owner's slot and every alias's (the sharded or the compute tensor).
  void install(const at::Tensor& value) const;
};

}  // namespace fsdp
}  // namespace hyper_parallel
