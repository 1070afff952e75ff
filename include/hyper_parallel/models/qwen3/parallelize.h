#pragma once
// The Qwen tensor-parallel plan: attention heads and MLP columns split over tp.
#include <hyper_parallel/hyper_parallel.h>

#include <hyper_parallel/models/qwen3/model.h>

namespace hyper_parallel {
namespace qwen3 {

/// Splits `model` over the 1-D `tp_mesh`:
/// - embed_tokens Rowwise (ids Replicate -> hidden states Shard(1) with sequence parallelism);
/// - input/post-attention/final norms SequenceParallel(sequence_dim=1);
/// - attention and MLP entries PrepareModuleInput(Shard(1) -> Replicate);
/// - q/k/v, gate/up Colwise; q_norm/k_norm SequenceParallel(sequence_dim=2);
/// - o_proj/down_proj Rowwise(Shard(-1) -> Shard(1), use_local_output=false), reducing in
///   `reduce_dtype` when given;
/// - lm_head Colwise(Shard(1) -> Replicate), or with loss_parallel -> Shard(-1) kept a DTensor.
/// Without sequence parallelism activations are replicated and the norms NoParallel.
/// Head counts that do not divide by the mesh size fail (c10::ValueError) before any change.
void parallelize_qwen3_tp(CausalLMImpl& model, const hyper_parallel::DeviceMesh& tp_mesh, bool sequence_parallel = true,
                          bool loss_parallel = false, c10::optional<at::ScalarType> reduce_dtype = c10::nullopt);

}  // namespace qwen3
}  // namespace hyper_parallel
