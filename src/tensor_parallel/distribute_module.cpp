#include <hyper_parallel/platform/platform.h>
#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>

#include "module_state.h"

namespace hyper_parallel {

bool distribute_module_applied(const torch::nn::Module& module) {
  const auto* m = dynamic_cast<const nn::Module*>(&module);
  const TpModuleState* st = m != nullptr ? m->find_state<TpModuleState>() : nullptr;
  return st != nullptr && st->distributed;
}

void agree_on_user_code(const DeviceMesh& mesh, std::exception_ptr error, const std::string& what) {
  int64_t code = 0;
  std::string message;
  if (error) {
    code = 1;
    try {
      std::rethrow_exception(error);
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "an exception that is not a std::exception";
    }
    message = "rank " + std::to_string(get_rank()) + ": " + message;
  }
  // Dimension by dimension: after the last, every rank of the mesh has heard of any failure.
  for (int64_t dim = 0; dim < mesh.ndim(); ++dim) {
    const Verdicts v = gather_verdicts(mesh.get_group(dim), code, message);
    if (v.first >= 0) {
      code = 1;
      message = v.message;
    }
  }
  if (code == 0) return;
  if (error) std::rethrow_exception(error);
  TORCH_CHECK(false, "hyper_parallel::", what, ": failed on ", message);
}

void reduce_gradient_to_placements(const at::Tensor& param) {
  HP_CHECK_T(c10::TypeError, param.defined() && is_dtensor(param), "hyper_parallel::reduce_gradient_to_placements: the parameter is not a DTensor");
  // A parameter's gradient takes the parameter's placements as it reaches AccumulateGrad: reduced
  // once here, not by every optimizer op that reads it.
  const Placements target = DTensor(param).placements();
  const DeviceMesh mesh_of_param = DTensor(param).device_mesh();
  at::Tensor(param).register_hook([target, mesh_of_param](const at::Tensor& grad) -> at::Tensor {
    // A plain gradient of the whole shape comes from libtorch's backward under implicit
    // replication: every rank holds it whole, so slicing it needs no communication.
    if (grad.defined() && !is_dtensor(grad)) {
      const auto [shape, offset] = compute_local_shape_and_offset(
          grad.sizes().vec(), mesh_of_param.shape(), *mesh_of_param.get_coordinate(), target);
      at::Tensor local = grad;
      for (size_t d = 0; d < shape.size(); ++d) local = local.narrow(static_cast<int64_t>(d), offset[d], shape[d]);
      return DTensor::from_local(local.contiguous(), mesh_of_param, target, false, grad.sizes());
    }
    if (!is_dtensor(grad) || DTensor(grad).placements() == target) return grad;
    return DTensor(grad).redistribute(target);
  });
}

void set_distribute_module_applied(torch::nn::Module& module, bool applied) {
  platform::hookable(module, module.name()).state<TpModuleState>().distributed = applied;
}

DTensor distribute_parameter(const at::Tensor& param, const DeviceMesh& mesh, const Placements& placements,
                             c10::optional<int64_t> src_data_rank) {
  return distribute_tensor(param.detach(), mesh, placements, param.is_meta() ? c10::nullopt : src_data_rank);
}

torch::nn::Module& distribute_module(torch::nn::Module& module, const DeviceMesh& mesh, PartitionFn partition_fn,
                                     InputFn input_fn, OutputFn output_fn, c10::optional<int64_t> src_data_rank) {
  nn::Module& root = platform::hookable(module, module.name());
  TORCH_CHECK(!distribute_module_applied(root), "hyper_parallel::distribute_module: distribute_module should only be called once on a module, but it "
              "has already been called on ", module.name(), " (two styles that distribute parameters cannot be "
              "applied to the same module)");
  const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate());
  for (const auto& [name, sub_ptr] : nn::modules_with_names(module)) {
    torch::nn::Module& sub = *sub_ptr;
    if (partition_fn) partition_fn(name, sub, mesh);
    for (const auto& p : sub.named_parameters(/*recurse=*/false))
      if (!is_dtensor(p.value()))
        nn::replace_parameter(sub, p.key(), distribute_parameter(p.value(), mesh, replicate, src_data_rank));
    for (const auto& b : sub.named_buffers(/*recurse=*/false))
      if (b.value().defined() && !is_dtensor(b.value()))
        nn::replace_buffer(sub, b.key(), distribute_parameter(b.value(), mesh, replicate, src_data_rank));
  }
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (p.value().requires_grad() && is_dtensor(p.value())) reduce_gradient_to_placements(p.value());
  if (input_fn)
    platform::register_forward_pre_hook(root, [input_fn, mesh](nn::Module& m, const std::vector<c10::IValue>& args) {
      return input_fn(m, args, mesh);
    });
  if (output_fn)
    platform::register_forward_hook(root, [output_fn, mesh](nn::Module& m, const std::vector<c10::IValue>&, const c10::IValue& out) {
      return output_fn(m, out, mesh);
    });
  root.state<TpModuleState>().distributed = true;
  return module;
}

}  // namespace hyper_parallel
