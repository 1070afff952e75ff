#pragma once
// The seed's Qwen3.5 tensor-parallel plan (HyperParallel's parallelize_qwen3_5_tp), with every
// parameter a DTensor.
#include <hyper_parallel/hyper_parallel.h>

#include <hyper_parallel/models/qwen3_5/model.h>

namespace hyper_parallel {
namespace qwen3_5 {

/// Splits `model` over the 1-D `tp_mesh` in one parallelize_module plan:
/// - embed_tokens Rowwise (ids Replicate -> Shard(1) with sequence parallelism); the layer and final
///   norms SequenceParallel(sequence_dim=1) (NoParallel without);
/// - self_attn, linear_attn and mlp PrepareModuleInput(Shard(1) -> Replicate);
/// - q/k/v_proj, gate/up_proj (a MoE layer's shared_expert.gate/up_proj), in_proj_q/k/v/z/b/a Colwise; q_norm/k_norm and linear_attn.norm
///   SequenceParallel(sequence_dim=2, use_local_output=true): Replicate weights on head shards,
///   their gradients summed over tp;
/// - o_proj, out_proj and down_proj (shared_expert.down_proj) Rowwise(Shard(-1) -> Shard(1), use_local_output=false), in
///   `reduce_dtype` on o_proj, out_proj and the full-attention layers' down_proj;
/// - the GatedDeltaNet's conv_q/k/v, A_log and dt_bias Shard(0): each rank keeps whole key heads
///   with the value heads they serve (HF's fused in_proj_qkv and conv1d load into the q/k/v
///   sections through hf_key_map's row ranges);
/// - lm_head Colwise(Shard(1) -> Replicate), or with loss_parallel -> Shard(-1) kept a DTensor;
/// - with tp > num_key_value_heads (a multiple of it), k/v_proj replicated by KV head on the
///   (kv, kv_replica) view of the tp ranks, as parallelize_qwen3_tp does.
/// num_attention_heads, linear_num_key_heads, linear_num_value_heads or intermediate_size not
/// divisible by tp, or a tp that neither divides num_key_value_heads nor is a multiple of it,
/// fails (c10::ValueError) naming them, before any change.
/// e.g. `qwen3_5::parallelize_qwen3_5_tp(*model, mesh["tp"], /*sequence_parallel=*/true);`
void parallelize_qwen3_5_tp(CausalLMImpl& model, const hyper_parallel::DeviceMesh& tp_mesh, bool sequence_parallel = true,
                            bool loss_parallel = false, c10::optional<at::ScalarType> reduce_dtype = c10::nullopt);

/// Qwen3.5-MoE: every MoE layer's routed experts (`layers.*.mlp.experts`) over `mesh`, as
/// parallelize_qwen3_experts does for Qwen3-MoE: a 1-D ep mesh, ExpertParallel(token_dispatcher)
/// ("all_to_all" when the ranks hold different tokens, ep taken from data ranks; "all_reduce" when
/// they hold the same, ep over the tp ranks); with `tensor_parallel`, each expert's intermediate dim
/// split over a 1-D tp mesh; a 2-D [ep, tp] mesh, ExpertTensorParallel. The router, the shared
/// expert's gate and (without parallelize_qwen3_5_tp) the shared expert stay whole. All or nothing.
/// e.g. `qwen3_5::parallelize_qwen3_5_experts(*model, mesh["ep"]);`
void parallelize_qwen3_5_experts(CausalLMImpl& model, const hyper_parallel::DeviceMesh& mesh, bool tensor_parallel = false,
                                 const std::string& token_dispatcher = "all_to_all");

/// Splits the sequence of `model` over the 1-D `cp_mesh` in one parallelize_module plan:
/// LinearAttentionContextParallel(linear_mode) on every linear-attention layer's sequence mixing
/// (`layers.<i>.linear_attn.gdn`) and ContextParallel(attention_mode) on every full-attention
/// layer's attention (`layers.<i>.self_attn.sdpa`); everything else works on this rank's
/// positions as it is. Feed it this rank's contiguous shard of the ids (context_parallel_shard
/// with load_balance false), their positions (context_parallel_positions) as the position_ids
/// keyword, and the labels sharded alike; average the gradients over cp (fully_shard over the cp
/// dimension, or hyper_parallel::all_reduce_gradients). Composes with parallelize_qwen3_5_tp
/// applied first (heads split by tp, then by cp in ulysses). `load_balance` true is refused: the
/// recurrence reads the sequence in order, so the head-tail order cannot be used on any layer.
/// e.g. `qwen3_5::parallelize_qwen3_5_cp(*model, mesh["cp"], "all_gather", "ring");`
void parallelize_qwen3_5_cp(CausalLMImpl& model, const hyper_parallel::DeviceMesh& cp_mesh, const std::string& linear_mode = "ulysses",
                            const std::string& attention_mode = "ulysses", bool load_balance = false);

}  // namespace qwen3_5
}  // namespace hyper_parallel
