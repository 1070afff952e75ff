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
/// With tp > num_key_value_heads (tp a multiple of it) the KV heads are replicated, as vLLM does:
/// rank r holds KV head floor(r * kv / tp), the one its query heads use. k/v_proj's weights are
/// then DTensors on the tp ranks viewed as a (kv, kv_replica) mesh, Shard(0) over kv and
/// Replicate over the replicas: a checkpoint loads each rank's head from that head's rows, a save
/// writes each head once, the KV cache holds one head per rank, and a weight's gradient is summed
/// over its replicas.
/// num_heads not divisible by tp, or a tp that neither divides num_key_value_heads nor is a
/// multiple of it, fails (c10::ValueError) before any change. A Qwen3-MoE model's dense layers
/// get the MLP entries above; its sparse blocks take the replicated stream as it is (the router
/// replicated, the experts split by parallelize_qwen3_experts), so sequence parallelism with MoE
/// layers is refused.
void parallelize_qwen3_tp(CausalLMImpl& model, const hyper_parallel::DeviceMesh& tp_mesh, bool sequence_parallel = true,
                          bool loss_parallel = false, c10::optional<at::ScalarType> reduce_dtype = c10::nullopt);

/// Splits the experts of every MoE layer of `model` (router weights stay replicated):
/// - a 1-D `mesh`: ExpertParallel(token_dispatcher) over it, or with tensor_parallel the seed's
///   expert TensorParallel (each expert's intermediate dim split);
/// - a 2-D [ep, tp] `mesh`: ExpertTensorParallel.
/// Every layer is checked before any changes (num_experts not divisible by ep: c10::ValueError).
/// Which tokens the ranks hold decides the dispatcher: ranks with different tokens (ep taken
/// from the data-parallel ranks) use "all_to_all"; ranks with the same tokens (ep over the
/// tensor-parallel ranks without sequence parallelism) "all_reduce".
/// e.g. `parallelize_qwen3_experts(*model, mesh["ep"]);`
void parallelize_qwen3_experts(CausalLMImpl& model, const hyper_parallel::DeviceMesh& mesh, bool tensor_parallel = false,
                               const std::string& token_dispatcher = "all_to_all");

/// Splits the sequence of `model` over the 1-D `cp_mesh`: ContextParallel(mode, load_balance) on
/// every layer's attention (`layers.*.self_attn.sdpa`), through parallelize_module. Everything else
/// works on this rank's positions as it is. Feed it this rank's shard of the ids, with their
/// positions (context_parallel_positions) as ForwardContext::position_ids, and the labels sharded
/// alike; the loss of the shard is the mean over its tokens, so the mean over the cp ranks is the
/// whole sequence's (gradients: fully_shard over the cp dimension, or
/// hyper_parallel::all_reduce_gradients). Composes with parallelize_qwen3_tp (heads split over tp
/// first: ulysses then needs cp to divide the heads per tp rank).
/// e.g. `parallelize_qwen3_cp(*model, mesh["cp"], "ring", true);`
void parallelize_qwen3_cp(CausalLMImpl& model, const hyper_parallel::DeviceMesh& cp_mesh, const std::string& mode = "ulysses",
                          bool load_balance = true);

}  // namespace qwen3
}  // namespace hyper_parallel
