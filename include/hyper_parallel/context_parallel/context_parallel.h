#pragma once
// Context parallelism (the seed's core/context_parallel; PyTorch's context_parallel): every
// activation of a long sequence is split by positions over a 1-D cp mesh, and the attention,
// the only part of a transformer that mixes positions, is run by one of three algorithms:
//
//   ulysses       all-to-all from sequence shards to head shards, attention over the whole
//                 sequence on H/cp heads, and back (4 all-to-alls of the local q/k/v/out per layer
//                 forward). H/cp query heads and, after replicating key heads when there are
//                 fewer than cp, Hk/cp key heads.
//   allgather_kv  the queries stay sequence-sharded; keys and values are all-gathered ((cp-1)/cp
//                 of K and V arrive), their gradients reduce-scattered. Any head count.
//   ring          key/value blocks travel around the cp ranks by point-to-point transfers while
//                 each rank attends to the block it holds; the partial results are merged with a
//                 float32 log-sum-exp. Only one remote block is held at a time, and backward sends
//                 the blocks round again with their gradients.
//
// load_balance (for causal attention) splits the sequence into 2·cp chunks and gives rank r
// chunks r and 2·cp-1-r (head-tail), so every rank attends to about as many keys. Shard the
// model's inputs, positions and labels with context_parallel_shard (one permutation, applied
// before sharding); gather results with context_parallel_unshard.
//
//   auto cp = mesh["cp"];
//   for (auto& l : *model->layers)
//     hp::ContextParallel("ring", /*load_balance=*/true).apply(*l->as<Layer>()->self_attn->sdpa, cp);
//   auto ids = hp::context_parallel_shard(input_ids, cp, 1, true);
//   auto pos = hp::context_parallel_shard(positions, cp, 1, true);
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/tensor_parallel/style.h>

namespace hyper_parallel {

/// Applied to a hyper_parallel::nn::ScaledDotProductAttention module ([B, H, S, D] layout, as
/// PyTorch's SDPA: seq_dim 2, head_dim 1) on a 1-D cp mesh. Its query, key and value are this
/// rank's sequence shard: plain tensors, or DTensors Shard(2) on the cp mesh; its output is the
/// shard of the output (a plain tensor, or with use_local_output(false) a DTensor Shard(2)).
/// Causal attention is the module's is_causal; a call with an explicit mask is refused, as is
/// attention dropout. c10::ValueError for an unknown mode, a mesh that is not 1-D, or a
/// ulysses head count that cp does not divide.
class ContextParallel : public ParallelStyle {
 public:
  explicit ContextParallel(std::string mode = "ulysses", bool load_balance = false, bool use_local_output = true);
  ContextParallel& mode(std::string m);
  ContextParallel& load_balance(bool b) { load_balance_ = b; return *this; }
  ContextParallel& use_local_output(bool b) { use_local_output_ = b; return *this; }
  const std::string& mode() const { return mode_; }
  bool load_balance() const { return load_balance_; }
  bool use_local_output() const { return use_local_output_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  std::string name() const override { return "ContextParallel"; }
  std::string describe() const override {
    return name() + "(mode=" + mode_ + ", load_balance=" + std::to_string(load_balance_) +
           ", use_local_output=" + std::to_string(use_local_output_) + ")";
  }

 private:
  std::string mode_;
  bool load_balance_;
  bool use_local_output_;
};

/// The head-tail order of `seq_len` positions over `cp` ranks: the sequence in 2·cp chunks,
/// rank r's shard being chunks r and 2·cp-1-r. permuted = x.index_select(seq_dim, indices);
/// with `restore`, the inverse permutation. c10::ValueError unless 2·cp divides seq_len.
/// e.g. head_tail_indices(8, 2) == [0, 1, 6, 7, 2, 3, 4, 5].
at::Tensor head_tail_indices(int64_t seq_len, int64_t cp, bool restore = false);

/// This rank's shard of `tensor` along `seq_dim` over the 1-D `cp_mesh` (every rank passes the
/// whole tensor): a contiguous cp-th, or with load_balance chunks r and 2·cp-1-r. For input ids,
/// positions and labels alike. c10::ValueError, naming the length, when cp (2·cp with
/// load_balance) does not divide the sequence.
at::Tensor context_parallel_shard(const at::Tensor& tensor, const DeviceMesh& cp_mesh, int64_t seq_dim, bool load_balance);

/// The whole tensor from every rank's shard (all-gathered, and put back in order when
/// load_balanced): the inverse of context_parallel_shard, on every rank.
at::Tensor context_parallel_unshard(const at::Tensor& shard, const DeviceMesh& cp_mesh, int64_t seq_dim, bool load_balance);

/// The positions [seq_len / cp] (int64) of this rank's shard: context_parallel_shard of
/// arange(seq_len). What rotary embeddings take as position ids.
at::Tensor context_parallel_positions(int64_t seq_len, const DeviceMesh& cp_mesh, bool load_balance);

/// Whether key block i of ring attention (the block that started on rank (rank - i) mod
/// world_size) is attended with the causal mask, in full, or skipped (PyTorch's
/// _is_causal_behavior). With load_balance every later block is attended in part, never skipped.
enum class CausalBehavior { skip, not_is_causal, is_causal };
CausalBehavior is_causal_behavior(int64_t rank, int64_t world_size, int64_t i, bool is_causal, bool load_balance);

/// The mesh a context-parallel style (ContextParallel, LinearAttentionContextParallel) was applied
/// over, on `module` or a module inside it; nullopt when none was. What needs every token of a
/// sequence (the MoE load-balancing loss's statistics) asks it which ranks hold the others.
c10::optional<DeviceMesh> context_parallel_mesh(const torch::nn::Module& module);

/// Sums each parameter's gradient over the cp ranks and divides by cp: without fully_shard over
/// the cp dimension, this makes every rank's gradient that of the mean loss over all of the
/// sequence's tokens (each rank's loss being the mean over its own). Collective over cp_mesh:
/// one all-reduce per bucket of same-dtype gradients, packed in parameter order up to
/// bucket_cap_mb MiB each (DDP's default size; a larger gradient is a bucket of its own).
/// e.g. `loss.backward(); hp::all_reduce_gradients(*model, mesh["cp"]);`
void all_reduce_gradients(torch::nn::Module& module, const DeviceMesh& cp_mesh, double bucket_cap_mb = 25);

}  // namespace hyper_parallel
