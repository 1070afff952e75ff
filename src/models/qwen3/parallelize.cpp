#include <hyper_parallel/models/qwen3/parallelize.h>

namespace hyper_parallel {
namespace qwen3 {
namespace hp = hyper_parallel;

void parallelize_qwen3_tp(CausalLMImpl& model, const hp::DeviceMesh& tp_mesh, bool sequence_parallel, bool loss_parallel,
                          c10::optional<at::ScalarType> reduce_dtype) {
  const int64_t tp = tp_mesh.size(0);
  const Config& c = model.config;
  // A head must not be split: the projections' widths could divide while the head counts do not.
  HP_CHECK_T(c10::ValueError, c.num_heads % tp == 0 && c.num_kv_heads % tp == 0, "hyper_parallel::qwen3::parallelize_qwen3_tp: num_heads (",
             c.num_heads, ") and num_kv_heads (", c.num_kv_heads, ") must be divisible by the tensor-parallel size ", tp);
  const hp::Placement seq = hp::Shard(1);
  // The residual stream: sequence-sharded DTensors with sequence parallelism; otherwise plain
  // (replicated) local tensors, as in Megatron.
  const bool dtensor_stream = sequence_parallel;
  const hp::Placement act = sequence_parallel ? seq : hp::Replicate();
  hp::RowwiseParallel out_proj = hp::RowwiseParallel(hp::Shard(-1), act, /*use_local_output=*/!dtensor_stream, reduce_dtype);
  // q/k norms see (B, S, heads, head_dim) with this rank's heads: Colwise split the heads, which
  // sit on dim 2 - the seed's "sequence_dim=2". The norm is per head over head_dim, so any split
  // of dim 2 is exact; the output goes back to a local tensor for the attention math.
  hp::SequenceParallel head_norm(/*sequence_dim=*/2, /*use_local_output=*/true);
  std::vector<hp::PlanEntry> entries{
      {"embed_tokens", hp::RowwiseParallel(hp::Replicate(), act, /*use_local_output=*/!dtensor_stream)},
      {"layers.*.self_attn.q_proj", hp::ColwiseParallel()},
      {"layers.*.self_attn.k_proj", hp::ColwiseParallel()},
      {"layers.*.self_attn.v_proj", hp::ColwiseParallel()},
      {"layers.*.self_attn.q_norm", head_norm},
      {"layers.*.self_attn.k_norm", head_norm},
      {"layers.*.self_attn.o_proj", out_proj},
      {"layers.*.mlp.gate_proj", hp::ColwiseParallel()},
      {"layers.*.mlp.up_proj", hp::ColwiseParallel()},
      {"layers.*.mlp.down_proj", out_proj},
      {"lm_head", hp::ColwiseParallel(act, loss_parallel ? hp::Shard(-1) : hp::Replicate(), /*use_local_output=*/!loss_parallel)},
  };
  for (const char* norm : {"layers.*.input_layernorm", "layers.*.post_attention_layernorm", "norm"}) {
    if (sequence_parallel) entries.emplace_back(norm, hp::SequenceParallel(1));
    else entries.emplace_back(norm, hp::NoParallel());
  }
  // Each block takes its input as one DTensor, so q/k/v (gate/up) share it and the backward
  // reduces their summed input gradient once: an all-gather's reduce-scatter with sequence
  // parallelism, Megatron's all-reduce without.
  for (const char* block : {"layers.*.self_attn", "layers.*.mlp"})
    entries.emplace_back(block, hp::PrepareModuleInput(hp::Layouts{act}, hp::Layouts{hp::Replicate()}));
  hp::parallelize_module(model, tp_mesh, hp::ParallelizePlan(std::move(entries)));
  // Both are Shard(0) over the vocabulary, so one DTensor serves both again.
  model.tie_weights();
}

}  // namespace qwen3
}  // namespace hyper_parallel
