#pragma once
// Tensor parallelism over more ranks than KV heads (tp > num_key_value_heads, a multiple of it),
// shared by the model families: k/v_proj live on the tp ranks viewed as (kv, kv_replica), rank r
// holding the rows of KV head floor(r · kv / tp), as Megatron and vLLM replicate them.
#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>

#include <vector>

namespace hyper_parallel {
namespace models {

// Whether `proj` holds replicated KV heads: its weight lives on the (kv, kv_replica) view.
inline bool replicated_heads(const nn::LinearImpl& proj) {
  const at::Tensor& w = proj.weight();
  return is_dtensor(w) && DTensor(w).device_mesh().ndim() == 2;
}

// k_proj or v_proj of `x`: through the module (its style's hooks), or for a replicated KV head on
// local tensors. Only this rank's query heads use its copy of the head, so the input's gradient
// through it is a partial sum over the tp ranks (as through a Colwise projection), and the
// weight's a partial sum over the head's replicas, which the weight's gradient hook reduces.
inline at::Tensor kv_projection(nn::Linear& proj, const at::Tensor& x) {
  if (!replicated_heads(*proj)) return proj(x);
  const at::Tensor x_local = is_dtensor(x) ? DTensor(x).to_local(Placements{Partial()}) : x;
  return at::linear(x_local, DTensor(proj->weight()).to_local(Placements{Shard(0), Partial()}));
}

// Refuses (as hyper_parallel::<caller>) a tp that neither divides the KV heads nor is a multiple
// of them; true when the heads are to be replicated.
inline bool kv_heads_replicated(const char* caller, int64_t kv_heads, int64_t tp) {
  const bool replicate = tp > kv_heads;
  HP_CHECK_T(c10::ValueError, kv_heads > 0 && (replicate ? tp % kv_heads == 0 : kv_heads % tp == 0), "hyper_parallel::", caller,
             ": the tensor-parallel size ", tp, " must divide num_key_value_heads (", kv_heads,
             "), or be a multiple of it (each KV head is then replicated on tp / num_key_value_heads ranks)");
  return replicate;
}

// Distributes `projections` (every layer's k_proj and v_proj) by KV head over the (kv, kv_replica)
// view of `tp_mesh`; distribute_module gives each weight the hook that reduces its Partial
// gradient over the replicas.
inline void replicate_kv_heads(const std::vector<nn::LinearImpl*>& projections, int64_t kv_heads, const DeviceMesh& tp_mesh) {
  const DeviceMesh kv_mesh = tp_mesh.unflatten(0, {kv_heads, tp_mesh.size(0) / kv_heads}, {"kv", "kv_replica"});
  auto by_head = [](const std::string&, torch::nn::Module& m, const DeviceMesh& mesh) {
    for (const auto& p : m.named_parameters(/*recurse=*/false))
      nn::replace_parameter(m, p.key(), distribute_tensor(p.value().detach(), mesh, {Shard(0), Replicate()},
                                                          p.value().is_meta() ? c10::nullopt : c10::optional<int64_t>(0)));
  };
  for (auto* proj : projections) distribute_module(*proj, kv_mesh, by_head);
}

}  // namespace models
}  // namespace hyper_parallel
