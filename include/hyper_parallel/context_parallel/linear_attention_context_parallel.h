#pragma once
// Context parallelism of linear attention (the seed's LinearAttentionContextParallel): a Gated
// DeltaNet carries a recurrent state from each token to the next, so a rank holding positions
// [r·s, (r+1)·s) needs the state the earlier ranks' tokens leave, and its causal convolution needs
// their last kernel-1 inputs. Three ways to provide them:
//
//   ulysses     one all-to-all turns the packed q/k/v/b/a projections from sequence shards into
//               head shards (nk/cp key heads with the nv/cp value heads they serve); the conv runs
//               on this rank's channels and the rule on its heads over the whole sequence; one
//               all-to-all brings the output back to sequence shards. Needs cp to divide the key
//               and value heads this rank holds.
//   all_gather  the sequence stays sharded. The last kernel-1 pre-convolution inputs go to the
//               next rank (the halo); each rank summarises what its tokens do to any incoming
//               state, S_out = M·S_in + S (nn::functional::GatedDeltaStateSummary: exact, since
//               the rule is affine in its state), all-gathers the (S, M) pairs, and folds those of
//               the ranks before it into its incoming state. Any head count.
//   p2p         as all_gather, but the state travels rank to rank: rank r receives S_in from r-1,
//               sends M_r·S_in + S_r to r+1 (cp-1 transfers of B·nv·dk·dv float32 per layer),
//               and its state gradient goes back the same way in backward.
//
// The shards must be contiguous and in rank order (context_parallel_shard without load_balance):
// the recurrence reads the sequence in order, so head-tail load balancing does not apply.
// Gradients of the layer's parameters are this rank's part of the sum over the cp ranks, as for
// ContextParallel (hyper_parallel::all_reduce_gradients, or fully_shard over cp).
//
//   hp::LinearAttentionContextParallel("all_gather").apply(*layer->linear_attn->gdn, mesh["cp"]);
#include <string>

#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/tensor_parallel/style.h>

namespace hyper_parallel {

/// Applied to a hyper_parallel::nn::GatedDeltaNet module on a 1-D cp mesh. Its inputs are this
/// rank's sequence shard of the pre-convolution q, k, v [B, s, nk·dk | nv·dv] and a, b [B, s, nv]
/// (plain tensors, or DTensors Shard(1) on the cp mesh), every rank holding the same s; its output
/// is the shard of the rule's output [B, s, nv, dv]. Under tensor parallelism the heads are this
/// tp rank's (apply it after the tp plan). A call with a generation state is refused.
/// c10::ValueError for an unknown mode or a mesh that is not 1-D; at apply or in forward, for
/// ulysses with key or value heads cp does not divide, and for all_gather/p2p with a local length
/// shorter than the convolution's halo (conv_kernel_size - 1).
class LinearAttentionContextParallel : public ParallelStyle {
 public:
  explicit LinearAttentionContextParallel(std::string mode = "ulysses");
  LinearAttentionContextParallel& mode(std::string m);
  const std::string& mode() const { return mode_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  std::string name() const override { return "LinearAttentionContextParallel"; }
  std::string describe() const override { return name() + "(mode=" + mode_ + ")"; }

 private:
  std::string mode_;
};

}  // namespace hyper_parallel
