#include <hyper_parallel/models/qwen3/parallelize.h>

#include "../parallelize_experts.h"

#include <memory>

#include "../replicated_kv_heads.h"

namespace hyper_parallel {
namespace qwen3 {
namespace hp = hyper_parallel;

void parallelize_qwen3_tp(CausalLMImpl& model, const hp::DeviceMesh& tp_mesh, bool sequence_parallel, bool loss_parallel,
                          c10::optional<at::ScalarType> reduce_dtype) {
  const int64_t tp = tp_mesh.size(0);
  const Config& c = model.config;
  // A head must not be split: the projections' widths could divide while the head counts do not.
  HP_CHECK_T(c10::ValueError, c.num_heads % tp == 0, "hyper_parallel::qwen3::parallelize_qwen3_tp: num_attention_heads (",
             c.num_heads, ") must be divisible by the tensor-parallel size ", tp);
  const bool replicate_kv = models::kv_heads_replicated("qwen3::parallelize_qwen3_tp", c.num_kv_heads, tp);
  HP_CHECK_T(c10::ValueError, !(sequence_parallel && c.is_moe() && tp > 1), "hyper_parallel::qwen3::parallelize_qwen3_tp: sequence parallelism ",
             "with MoE layers is not supported (their blocks take the replicated stream); pass sequence_parallel=false");
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
      {"layers.*.self_attn.q_proj", hp::ColwiseParallel()},
      {"layers.*.self_attn.q_norm", head_norm},
      {"layers.*.self_attn.k_norm", head_norm},
      {"layers.*.self_attn.o_proj", out_proj},
  };
  // A pipeline stage holds the embedding, the head, both or neither.
  if (model.embed_tokens) entries.emplace_back("embed_tokens", hp::RowwiseParallel(hp::Replicate(), act, /*use_local_output=*/!dtensor_stream));
  if (model.lm_head)
    entries.emplace_back("lm_head", hp::ColwiseParallel(act, loss_parallel ? hp::Shard(-1) : hp::Replicate(), /*use_local_output=*/!loss_parallel));
  if (!replicate_kv)
    for (const char* proj : {"layers.*.self_attn.k_proj", "layers.*.self_attn.v_proj"}) entries.emplace_back(proj, hp::ColwiseParallel());
  std::vector<const char*> norms{"layers.*.input_layernorm", "layers.*.post_attention_layernorm"};
  if (model.norm) norms.push_back("norm");
  for (const char* norm : norms) {
    if (sequence_parallel) entries.emplace_back(norm, hp::SequenceParallel(1));
    else entries.emplace_back(norm, hp::NoParallel());
  }
  // Each block takes its input as one DTensor, so q/k/v (gate/up) share it and the backward
  // reduces their summed input gradient once: an all-gather's reduce-scatter with sequence
  // parallelism, Megatron's all-reduce without.
  entries.emplace_back("layers.*.self_attn", hp::PrepareModuleInput(hp::Layouts{act}, hp::Layouts{hp::Replicate()}));
  // Dense MLPs: Colwise gate/up, Rowwise down; every layer of a dense model by one pattern, the
  // dense layers of a MoE model one by one (their sparse blocks take the stream as it is).
  auto dense_mlp = [&](const std::string& mlp) {
    entries.emplace_back(mlp + ".gate_proj", hp::ColwiseParallel());
    entries.emplace_back(mlp + ".up_proj", hp::ColwiseParallel());
    entries.emplace_back(mlp + ".down_proj", out_proj);
    entries.emplace_back(mlp, hp::PrepareModuleInput(hp::Layouts{act}, hp::Layouts{hp::Replicate()}));
  };
  if (!c.is_moe()) dense_mlp("layers.*.mlp");
  for (int64_t l = model.span.first_layer; c.is_moe() && l < model.span.end_layer; ++l)
    if (!c.is_moe_layer(l)) dense_mlp("layers." + std::to_string(l) + ".mlp");
  hp::parallelize_module(model, tp_mesh, hp::ParallelizePlan(std::move(entries)));
  if (replicate_kv) {
    std::vector<hnn::LinearImpl*> kv;
    for (const auto& layer : *model.layers)
      for (auto* proj : {layer->as<DecoderLayerImpl>()->self_attn->k_proj.get(), layer->as<DecoderLayerImpl>()->self_attn->v_proj.get()})
        kv.push_back(proj);
    models::replicate_kv_heads(kv, c.num_kv_heads, tp_mesh);
  }
  // Both are Shard(0) over the vocabulary, so one DTensor serves both again.
  model.tie_weights();
}

void parallelize_qwen3_experts(CausalLMImpl& model, const hp::DeviceMesh& mesh, bool tensor_parallel, const std::string& token_dispatcher) {
  HP_CHECK_T(c10::ValueError, model.config.is_moe(), "hyper_parallel::qwen3::parallelize_qwen3_experts: the model has no MoE layer (num_experts is 0)");
  std::vector<std::pair<std::string, hnn::GroupedExpertsImpl*>> experts;
  int64_t l = model.layers->first_index();
  for (const auto& layer : *model.layers) {
    if (auto moe = layer->as<DecoderLayerImpl>()->moe) experts.emplace_back("layers." + std::to_string(l) + ".mlp.experts", moe->experts.get());
    ++l;
  }
  models::parallelize_experts(experts, mesh, tensor_parallel, token_dispatcher, "qwen3::parallelize_qwen3_experts");
}

void parallelize_qwen3_cp(CausalLMImpl& model, const hp::DeviceMesh& cp_mesh, const std::string& mode, bool load_balance) {
  hp::parallelize_module(model, cp_mesh, {{"layers.*.self_attn.sdpa", hp::ContextParallel(mode, load_balance)}});
}

}  // namespace qwen3
}  // namespace hyper_parallel
