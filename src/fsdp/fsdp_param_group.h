#pragma once
// The parameters one fully_shard call manages (internal): gathered with one all-gather and
// their gradients reduced with one reduce-scatter per dtype, through persistent flat buffers.
// Both are asynchronous: the next group's all-gather is issued before this group computes, and
// a group's reduce-scatter runs while the backward of the groups before it computes.
// The compute tensors share a persistent storage per dtype that reshard() frees and unshard()
// refills, so tensors autograd saved in forward read the refilled data in backward.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/custom_class.h>

#include <vector>

#include <hyper_parallel/fsdp/fully_shard.h>
#include <hyper_parallel/runtime/collectives.h>

#include "fsdp_param.h"

namespace hyper_parallel {
namespace fsdp {

class FSDPParamGroup : public torch::CustomClassHolder {
 public:
  /// dp_mesh: 1-D (shard), or 2-D (replicate, shard) for HSDP.
  FSDPParamGroup(std::vector<FSDPParam> params, DeviceMesh dp_mesh, FullyShardOptions options);

  /// Gathers every parameter into its compute storage (one all-gather per dtype); nothing when
  /// already unsharded. Completes a gather that issue_unshard() started.
  void unshard();
  /// Starts the all-gathers and returns (a prefetch); unshard() completes them.
  void issue_unshard();
  /// Frees the compute storage (after completing a gather in flight); nothing when sharded.
  void reshard();
  bool is_unsharded() const { return unsharded_; }

  /// Before the module's forward: unshard (and the prefetched groups); returns the compute
  /// tensors for the module's parameter slots, outputs of one autograd node whose backward
  /// reduce-scatters the whole group's gradients (a frozen parameter's is not differentiable).
  std::vector<at::Tensor> pre_forward();
  /// After it, once the caller put the sharded parameters back in their slots: reshard if asked;
  /// make backward unshard again before it needs the parameters (hooks on the output's
  /// tensors). Also after a forward that threw (`output` None): the running-forward count is
  /// restored.
  void post_forward(const c10::IValue& output);

  /// Adds the compute tensors' gradients (undefined: zero) to the group's reduction buffer; with
  /// gradient sync on, starts its reduce-scatter and has the end of the backward pass complete it
  /// (and the all-reduce over HSDP's replicate dimension) and accumulate the sharded parameters'
  /// .grad, so that it overlaps the backward of the groups before this one (as FSDP2 does).
  void reduce_grads(const std::vector<at::Tensor>& grads);
  /// Completes the reduce-scatters in flight and accumulates the sharded gradients.
  void finish_reduce_grads();

  /// Names the group in its collectives' labels (CollectiveLabel): `fqn` is the module's path
  /// from the root ("" for the root), set by the root's first forward.
  void set_fqn(const std::string& fqn);
  /// Decides, at the group's first forward, whether it is the root (no fully_shard forward is
  /// running on this thread); true only then and only for the root.
  bool claim_root();

  const std::vector<FSDPParam>& params() const { return params_; }
  /// set_requires_gradient_sync.
  bool requires_gradient_sync = true;
  /// Whether backward frees the gathered parameters once this group's gradients are packed.
  bool reshard_after_backward = true;
  /// Groups whose all-gather is issued right after this group's in pre_forward.
  std::vector<c10::weak_intrusive_ptr<FSDPParamGroup>> forward_prefetch;

 private:
  struct Bucket {  // the parameters of one dtype
    std::vector<size_t> params;
    int64_t row_numel = 0;      // one rank's padded pieces, flat
    // The reduce-scatter's row: the pieces, then one flag per parameter (1 where this rank's
    // backward produced a gradient). Summed over the ranks, a flag says whether any rank did, so
    // every rank makes the same decision from the reduction it already waits for.
    int64_t grad_row_numel = 0;
    // This rank's own flags: what decides when the reduction has shapes only (a fake world, where
    // every rank is taken to be this one).
    std::vector<bool> used_here;
    int64_t compute_numel = 0;  // the compute tensors, flat
    at::Tensor send;            // [row_numel]: this rank's pieces
    at::Tensor storage;         // [compute_numel]: the compute tensors' storage (freed when sharded)
    at::Tensor grad_rows;       // [dp, grad_row_numel]: the reduce-scatter input, in the reduction's dtype
    Work gather;                // the all-gather in flight (issue_unshard)
    Work reduce;                // the reduce-scatter in flight (reduce_grads)
  };
  at::TensorOptions options_of(const Bucket& b) const;  // of the bucket's sharded parameters
  at::ScalarType compute_dtype(const Bucket& b) const;  // of its gather and compute tensors
  at::ScalarType reduce_dtype(const Bucket& b) const;
  void allocate(Bucket& b);
  void follow_parameters();
  std::vector<FSDPParam> params_;
  std::vector<Bucket> buckets_;
  Group shard_group_;               // the dp mesh's last dimension
  c10::optional<Group> replicate_group_;  // HSDP: its first
  int64_t shard_size_ = 1;
  FullyShardOptions options_;
  bool grads_accumulated_ = false;  // grad_rows hold gradients not reduced yet (no sync)
  bool unsharded_ = false;    // compute storage allocated (its all-gather may be in flight)
  bool gather_pending_ = false;
  bool reduce_pending_ = false;
  bool in_forward_ = false;  // between pre_forward and post_forward
  bool root_known_ = false, is_root_ = false;  // the root (outermost) group keeps its parameters after forward
  // The labels of its all-gathers, reduce-scatters and HSDP all-reduces: ranks that pair one of
  // them with another group's collective (a group some rank's forward never called) stop there,
  // every rank naming the group.
  std::string gather_label_, reduce_label_, replicas_label_;
};

}  // namespace fsdp
}  // namespace hyper_parallel
