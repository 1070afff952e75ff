#include <hyper_parallel/expert_parallel/expert_parallel.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/moe.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>

#include "../tensor_parallel/module_state.h"

namespace hyper_parallel {
namespace {

// The experts module, or a TypeError naming the style and the module.
nn::GroupedExpertsImpl& experts_of(torch::nn::Module& module, const std::string& fqn, const std::string& style) {
  auto* e = dynamic_cast<nn::GroupedExpertsImpl*>(&module);
  HP_CHECK_T(c10::TypeError, e != nullptr, "hyper_parallel::", style, "::validate: '", module_label(fqn),
             "' is not a GroupedExperts module (", module.name(), "); apply it to the experts of a mixture-of-experts block");
  HP_CHECK_T(c10::ValueError, !distribute_module_applied(module), "hyper_parallel::", style, "::validate: '", module_label(fqn),
             "' is already split by another style");
  return *e;
}

void check_mesh(const DeviceMesh& mesh, int64_t ndim, const std::string& style, const char* expected) {
  HP_CHECK_T(c10::ValueError, mesh.defined() && mesh.ndim() == ndim, "hyper_parallel::", style, "::validate: needs a ", ndim,
             "-D DeviceMesh (", expected, "), got a ", mesh.defined() ? mesh.ndim() : 0, "-D one");
}

void check_ep(const nn::GroupedExpertsImpl& e, int64_t ep, const std::string& fqn, const std::string& style) {
  HP_CHECK_T(c10::ValueError, e.options.num_experts() % ep == 0, "hyper_parallel::", style, "::validate: num_experts (",
             e.options.num_experts(), ") of '", module_label(fqn), "' must be divisible by the expert-parallel size ", ep);
}

// Splits the three weights with one placement list each, keeps them parameters.
torch::nn::Module& split(torch::nn::Module& module, const DeviceMesh& mesh, const Placements& gate_up, const Placements& down,
                         c10::optional<int64_t> src) {
  auto partition = [=](const std::string& name, torch::nn::Module& m, const DeviceMesh& mesh) {
    if (!name.empty()) return;
    for (const auto& p : m.named_parameters(false))
      nn::replace_parameter(m, p.key(), distribute_parameter(p.value(), mesh, p.key() == "down_proj" ? down : gate_up, src));
  };
  return distribute_module(module, mesh, partition, nullptr, nullptr, src);
}

}  // namespace

void ExpertParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  nn::GroupedExpertsImpl& e = experts_of(module, fqn, "ExpertParallel");
  check_mesh(mesh, 1, "ExpertParallel", "the ep dimension");
  HP_CHECK_T(c10::ValueError, token_dispatcher_ == "all_to_all" || token_dispatcher_ == "all_reduce",
             "hyper_parallel::ExpertParallel::validate: token_dispatcher must be \"all_to_all\" or \"all_reduce\", got \"",
             token_dispatcher_, "\"");
  check_ep(e, mesh.size(0), fqn, "ExpertParallel");
}

torch::nn::Module& ExpertParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, module.name(), mesh);
  auto& e = dynamic_cast<nn::GroupedExpertsImpl&>(module);
  split(module, mesh, {Shard(0)}, {Shard(0)}, src_data_rank);
  e.placement.ep = mesh.get_group(0);
  e.placement.dispatch = token_dispatcher_ == "all_reduce" ? nn::ExpertPlacement::Dispatch::all_reduce
                                                           : nn::ExpertPlacement::Dispatch::all_to_all;
  return module;
}

namespace expert {

void TensorParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  experts_of(module, fqn, "expert::TensorParallel");
  check_mesh(mesh, 1, "expert::TensorParallel", "the tp dimension");
}

torch::nn::Module& TensorParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, module.name(), mesh);
  split(module, mesh, {Shard(1)}, {Shard(2)}, src_data_rank);
  dynamic_cast<nn::GroupedExpertsImpl&>(module).placement.tp = mesh.get_group(0);
  return module;
}

}  // namespace expert

void ExpertTensorParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  nn::GroupedExpertsImpl& e = experts_of(module, fqn, "ExpertTensorParallel");
  check_mesh(mesh, 2, "ExpertTensorParallel", "[ep, tp]");
  check_ep(e, mesh.size(0), fqn, "ExpertTensorParallel");
}

torch::nn::Module& ExpertTensorParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, module.name(), mesh);
  auto& e = dynamic_cast<nn::GroupedExpertsImpl&>(module);
  split(module, mesh, {Shard(0), Shard(1)}, {Shard(0), Shard(2)}, src_data_rank);
  e.placement.ep = mesh.get_group(0);
  e.placement.dispatch = nn::ExpertPlacement::Dispatch::all_to_all;
  e.placement.tp = mesh.get_group(1);
  return module;
}

}  // namespace hyper_parallel
