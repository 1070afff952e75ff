#pragma once
// The routed experts of every MoE layer of a model over a mesh, one style for all (the Qwen3-MoE
// and Qwen3.5-MoE plans share it).
#include <hyper_parallel/expert_parallel/expert_parallel.h>
#include <hyper_parallel/nn/moe.h>
#include <hyper_parallel/runtime/errors.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hyper_parallel {
namespace models {

/// ExpertTensorParallel on a 2-D [ep, tp] mesh; expert::TensorParallel on a 1-D mesh with
/// `tensor_parallel`; ExpertParallel(token_dispatcher) otherwise. `experts` are (fqn, module) pairs
/// for messages. All or nothing: every layer is validated before the first is split.
inline void parallelize_experts(const std::vector<std::pair<std::string, nn::GroupedExpertsImpl*>>& experts, const DeviceMesh& mesh,
                                bool tensor_parallel, const std::string& token_dispatcher, const char* fn) {
  HP_CHECK_T(c10::ValueError, mesh.defined() && (mesh.ndim() == 1 || (mesh.ndim() == 2 && !tensor_parallel)), "hyper_parallel::", fn,
             ": expects a 1-D mesh (ep, or tp with tensor_parallel) or a 2-D [ep, tp] mesh, got ", mesh.defined() ? mesh.ndim() : 0, "-D");
  std::unique_ptr<ParallelStyle> style;
  if (mesh.ndim() == 2) style = std::make_unique<ExpertTensorParallel>();
  else if (tensor_parallel) style = std::make_unique<expert::TensorParallel>();
  else style = std::make_unique<ExpertParallel>(token_dispatcher);
  for (const auto& [fqn, e] : experts) style->validate(*e, fqn, mesh);
  for (const auto& [fqn, e] : experts) style->apply(*e, mesh);
}

}  // namespace models
}  // namespace hyper_parallel
