#pragma once
// The expert-parallel styles (the seed's core/expert_parallel; torchtitan's ExpertParallel,
// TensorParallel for experts and ExpertTensorParallel), applied to a GroupedExperts module
// (nn/moe.h). They split the 3-D expert weights and tell the module how tokens reach them; the
// router stays replicated. Apply them with style.apply(experts, mesh) (ExpertTensorParallel takes
// a 2-D mesh, which parallelize_module does not) or in a parallelize_module plan (1-D meshes).
//
//   hp::ExpertParallel().apply(*layer->mlp->experts, mesh["ep"]);                   // tokens differ per ep rank
//   hp::ExpertParallel("all_reduce").apply(*layer->mlp->experts, mesh["tp"]);       // tokens alike (no SP)
//   hp::ExpertTensorParallel().apply(*layer->mlp->experts, mesh[{"ep", "tp"}]);
#include <string>

#include <hyper_parallel/tensor_parallel/style.h>

namespace hyper_parallel {

/// Experts Shard(0) over a 1-D ep mesh: rank r holds experts [r·E/ep, (r+1)·E/ep); num_experts
/// must divide by ep. token_dispatcher:
/// - "all_to_all" (the default): the ep ranks hold different tokens (ep borrowed from the data
///   dims). Each rank sends its routed tokens to their experts' ranks (one all-to-all of the
///   per-expert counts, one of the tokens with those splits), runs its experts on what arrives,
///   grouped by expert, and the results travel back the same way (autograd reverses both). A rank
///   whose experts get no token still takes part in every collective.
/// - "all_reduce": the ep ranks hold the same tokens (ep over the tensor-parallel ranks without
///   sequence parallelism, as in generation): each rank runs only its experts' tokens and the
///   outputs are summed over ep (an all-to-all would do the work ep times).
class ExpertParallel : public ParallelStyle {
 public:
  explicit ExpertParallel(std::string token_dispatcher = "all_to_all") : token_dispatcher_(std::move(token_dispatcher)) {}
  const std::string& token_dispatcher() const { return token_dispatcher_; }
  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  bool distributes_module() const override { return true; }
  std::string name() const override { return "ExpertParallel"; }
  std::string describe() const override { return name() + "(token_dispatcher=" + token_dispatcher_ + ")"; }

 private:
  std::string token_dispatcher_;
};

namespace expert {
/// The seed's TensorParallel for experts: every expert's intermediate dim split over a 1-D tp
/// mesh whose ranks hold the same tokens: gate_proj and up_proj [E, I, H] Shard(1), down_proj
/// [E, H, I] Shard(2) (gate and up are separate tensors, so each rank holds matching columns of
/// both). The partial outputs are summed over tp (one all-reduce per MoE layer forward, one of
/// the input gradient in backward).
class TensorParallel : public ParallelStyle {
 public:
  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  bool distributes_module() const override { return true; }
  std::string name() const override { return "expert::TensorParallel"; }
};
}  // namespace expert

/// ExpertParallel ("all_to_all") over the first dim of a 2-D [ep, tp] mesh and expert
/// TensorParallel over the second: gate_proj/up_proj [Shard(0), Shard(1)], down_proj
/// [Shard(0), Shard(2)].
class ExpertTensorParallel : public ParallelStyle {
 public:
  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  bool distributes_module() const override { return true; }
  std::string name() const override { return "ExpertTensorParallel"; }
};

}  // namespace hyper_parallel
