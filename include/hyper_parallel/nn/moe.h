#pragma once
// Mixture-of-experts layers: a top-k softmax router, experts held as 3-D weights (one matrix per
// expert, stacked), and the sparse block that routes each token to its top-k experts and sums
// their outputs weighted by the router (dropless: no capacity, no token dropped). The expert
// parallel styles (expert_parallel/) split the experts and set how tokens reach them; the block's
// code is the same on one process and split.
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/nn/swiglu_mlp.h>
#include <hyper_parallel/runtime/process_group.h>

#include <vector>

namespace hyper_parallel {
namespace nn {

struct MoEOptions {
  MoEOptions(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts, int64_t top_k)
      : hidden_size_(hidden_size), intermediate_size_(intermediate_size), num_experts_(num_experts), top_k_(top_k) {}
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, intermediate_size);  ///< each expert's (HF's moe_intermediate_size)
  TORCH_ARG(int64_t, num_experts);
  TORCH_ARG(int64_t, top_k);              ///< experts per token (HF's num_experts_per_tok)
  TORCH_ARG(bool, norm_topk_prob) = false;  ///< renormalise the top-k probabilities to sum to 1
  /// A shared expert beside the routed ones (transformers' shared_expert_intermediate_size): every
  /// token goes through it, scaled by sigmoid(shared_expert_gate(x)). 0: none.
  TORCH_ARG(int64_t, shared_expert_intermediate_size) = 0;
};

/// What the router decided for T tokens: the scores before the softmax [T, E] (in the input's
/// dtype), the top-k experts of each token [T, k] and their weights [T, k] (the softmax in
/// float32, renormalised when norm_topk_prob, cast to the input's dtype), as transformers' Qwen3-MoE.
struct RouterOutput {
  at::Tensor logits, indices, weights;
};

/// The router: logits = x W^T with W [E, H] (HF's `mlp.gate.weight`).
class TopKRouterImpl : public ModuleBase<TopKRouterImpl> {
 public:
  explicit TopKRouterImpl(const MoEOptions& options);
  void reset_parameters() override;
  /// x [T, H] -> RouterOutput.
  RouterOutput route(const at::Tensor& x);
  at::Tensor forward(const at::Tensor& x) { return route(x).logits; }
  const at::Tensor& weight() const { return parameter("weight"); }
  MoEOptions options;
};
HP_MODULE(TopKRouter);

/// How routed tokens reach the experts' ranks (set by the expert-parallel styles).
struct ExpertPlacement {
  /// The ranks the experts are split over (Shard(0) of the expert dim); undefined: all local.
  Group ep;
  /// all_to_all: the ep ranks hold different tokens, which travel to their experts' ranks and
  /// back (two all-to-alls of the tokens, one of the counts). all_reduce: the ep ranks hold the
  /// same tokens; each runs its experts on those routed to them and the outputs are summed.
  enum class Dispatch { all_to_all, all_reduce } dispatch = Dispatch::all_to_all;
  /// Expert tensor parallelism: each expert's intermediate dim split over these ranks, which
  /// hold the same tokens (their partial outputs are summed); undefined: none.
  Group tp;
};

/// E experts of SwiGLU MLPs as three 3-D weights: gate_proj and up_proj [E, I, H], down_proj
/// [E, H, I], each expert's slice being HF's per-expert Linear weight
/// (`mlp.experts.<e>.gate_proj.weight`, ...). Under the expert-parallel styles the weights are
/// DTensors (Shard(0) over ep; Shard(1), Shard(1), Shard(2) over an expert tp) and forward uses
/// this rank's experts and columns.
class GroupedExpertsImpl : public ModuleBase<GroupedExpertsImpl> {
 public:
  explicit GroupedExpertsImpl(const MoEOptions& options);
  void reset_parameters() override;
  /// Tokens x [T, H] with their routing (indices, weights [T, k]) -> the weighted sum of their
  /// experts' outputs [T, H]. Collective over the placement's groups when set.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights);
  /// x [N, H] ordered by local expert, `counts` rows per local expert -> each row through its
  /// expert [N, H] (one matmul per expert and projection).
  at::Tensor run_local(const at::Tensor& x, const std::vector<int64_t>& counts);
  MoEOptions options;
  ExpertPlacement placement;
};
HP_MODULE(GroupedExperts);

/// The sparse block (HF's Qwen3MoeSparseMoeBlock): `gate` (the router) and `experts`; with
/// shared_expert_intermediate_size, also `shared_expert` (a SwiGLU MLP) and `shared_expert_gate`
/// (H -> 1), added as sigmoid(shared_expert_gate(x)) · shared_expert(x) (Qwen3_5MoeSparseMoeBlock).
/// A step's routing as sums, which is all the load-balancing loss needs and what adds up over
/// layers, microbatches and data ranks: per expert the number of top-k choices that picked it
/// (`counts` [E], float32, no gradient) and the sum of its router probabilities (`prob_sum` [E],
/// float32, in the graph), and the number of tokens (`tokens` [1]); padding is left out.
struct RouterStatistics {
  at::Tensor counts, prob_sum, tokens;
  bool empty() const { return !tokens.defined(); }
  /// Adds `other` (another layer's, microbatch's) to these sums.
  void add(const RouterStatistics& other);
};

/// The statistics of router logits [T, E] under top-k routing; `keep` [T] (1 at real tokens, 0 at
/// padding) or undefined (every token counts).
RouterStatistics router_statistics(const at::Tensor& logits, int64_t top_k, const at::Tensor& keep = {});

/// forward(x [..., H]) -> [..., H]; forward(x, {"keep": [..., 1] or x's leading shape}) leaves the
/// padded tokens out of the router statistics. Every forward that records gradients adds its
/// routing to `statistics` (running sums, taken by take_statistics(): one step's); the router
/// logits of the last forward stay in `router_logits` [T, E] (transformers' output_router_logits).
/// Under activation checkpointing both leave the checkpoint's node as side outputs, so the router
/// gets the load-balancing loss's gradient through the recompute, and a recompute adds nothing.
class SparseMoeBlockImpl : public ModuleBase<SparseMoeBlockImpl> {
 public:
  explicit SparseMoeBlockImpl(const MoEOptions& options);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor forward(const at::Tensor& x, const Kwargs& kwargs);
  /// The statistics added since the last call (empty when no forward ran), and a fresh start.
  RouterStatistics take_statistics();
  MoEOptions options;
  TopKRouter gate{nullptr};
  GroupedExperts experts{nullptr};
  SwiGLUMlp shared_expert{nullptr};  // empty without a shared expert
  Linear shared_expert_gate{nullptr};
  at::Tensor router_logits;
  RouterStatistics statistics;
};
HP_MODULE(SparseMoeBlock);

/// The load-balancing loss of Switch Transformer as transformers computes it
/// (load_balancing_loss_func, with its attention_mask: padding left out), from summed statistics:
/// E · (Σ_e counts_e · prob_sum_e) / tokens². With `data_group`, the sums are first summed over
/// its ranks, so the loss is the whole batch's (every rank holding other tokens must be in it:
/// the data ranks, and under context parallelism the cp ranks too). c10::ValueError when the
/// statistics are empty.
at::Tensor load_balancing_loss(RouterStatistics statistics, int64_t num_experts, const Group& data_group = Group());

/// The same over router logits (without padding mask): over the router logits of every MoE layer
/// ([T, E] each), E · Σ_e f_e · P_e, where f_e is the fraction of top-k choices that picked e and
/// P_e the mean softmax probability of e, both over every token of every layer. With
/// `data_group`, the counts and probability sums are summed over its ranks first, so the loss is
/// that of the whole batch (and its gradient, once the data ranks average theirs, is the
/// whole batch's).
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                               const Group& data_group = Group());

}  // namespace nn
}  // namespace hyper_parallel
