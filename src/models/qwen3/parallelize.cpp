#include <hyper_parallel/models/qwen3/parallelize.h>

#include <memory>

namespace hyper_parallel {
namespace qwen3 {
namespace hp = hyper_parallel;

namespace {

// k/v_proj of every layer as DTensors on the tp ranks viewed as (kv, kv_replica): rank r holds
// rows of KV head floor(r * kv / tp). distribute_module gives each weight the hook that reduces
// its Partial gradient over the replicas (AttentionImpl::forward computes them locally).
void replicate_kv_heads(CausalLMImpl& model, const hp::DeviceMesh& tp_mesh) {
  const int64_t kv = model.config.num_kv_heads, tp = tp_mesh.size(0);
  const hp::DeviceMesh kv_mesh = tp_mesh.unflatten(0, {kv, tp / kv}, {"kv", "kv_replica"});
  auto by_head = [](const std::string&, torch::nn::Module& m, const hp::DeviceMesh& mesh) {
    for (const auto& p : m.named_parameters(/*recurse=*/false))
      hnn::replace_parameter(m, p.key(), hp::distribute_tensor(p.value().detach(), mesh, {hp::Shard(0), hp::Replicate()},
                                                               p.value().is_meta() ? c10::nullopt : c10::optional<int64_t>(0)));
  };
  for (const auto& layer : *model.layers) {
    auto& attn = layer->as<DecoderLayerImpl>()->self_attn;
    for (auto* proj : {attn->k_proj.get(), attn->v_proj.get()}) hp::distribute_module(*proj, kv_mesh, by_head);
  }
}

}  // namespace

void parallelize_qwen3_tp(CausalLMImpl& model, const hp::DeviceMesh& tp_mesh, bool sequence_parallel, bool loss_parallel,
                          c10::optional<at::ScalarType> reduce_dtype) {
  const int64_t tp = tp_mesh.size(0);
  const Config& c = model.config;
  // A head must not be split: the projections' widths could divide while the head counts do not.
  HP_CHECK_T(c10::ValueError, c.num_heads % tp == 0, "hyper_parallel::qwen3::parallelize_qwen3_tp: num_attention_heads (",
             c.num_heads, ") must be divisible by the tensor-parallel size ", tp);
  const bool replicate_kv = tp > c.num_kv_heads;
  HP_CHECK_T(c10::ValueError, c.num_kv_heads > 0 && (replicate_kv ? tp % c.num_kv_heads == 0 : c.num_kv_heads % tp == 0),
             "hyper_parallel::qwen3::parallelize_qwen3_tp: the tensor-parallel size ", tp, " must divide num_key_value_heads (",
             c.num_kv_heads, "), or be a multiple of it (each KV head is then replicated on tp / num_key_value_heads ranks)");
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
  if (replicate_kv) replicate_kv_heads(model, tp_mesh);
  // Both are Shard(0) over the vocabulary, so one DTensor serves both again.
  model.tie_weights();
}

void parallelize_qwen3_experts(CausalLMImpl& model, const hp::DeviceMesh& mesh, bool tensor_parallel, const std::string& token_dispatcher) {
  HP_CHECK_T(c10::ValueError, model.config.is_moe(), "hyper_parallel::qwen3::parallelize_qwen3_experts: the model has no MoE layer (num_experts is 0)");
  HP_CHECK_T(c10::ValueError, mesh.defined() && (mesh.ndim() == 1 || (mesh.ndim() == 2 && !tensor_parallel)),
             "hyper_parallel::qwen3::parallelize_qwen3_experts: expects a 1-D mesh (ep, or tp with tensor_parallel) or a 2-D [ep, tp] mesh, got ",
             mesh.defined() ? mesh.ndim() : 0, "-D");
  std::unique_ptr<hp::ParallelStyle> style;
  if (mesh.ndim() == 2) style = std::make_unique<hp::ExpertTensorParallel>();
  else if (tensor_parallel) style = std::make_unique<hp::expert::TensorParallel>();
  else style = std::make_unique<hp::ExpertParallel>(token_dispatcher);
  std::vector<std::pair<std::string, hnn::GroupedExpertsImpl*>> experts;
  int64_t l = model.layers->first_index();
  for (const auto& layer : *model.layers) {
    if (auto moe = layer->as<DecoderLayerImpl>()->moe) experts.emplace_back("layers." + std::to_string(l) + ".mlp.experts", moe->experts.get());
    ++l;
  }
  // All or nothing: every layer is checked before the first is split.
  for (auto& [fqn, e] : experts) style->validate(*e, fqn, mesh);
  for (auto& [fqn, e] : experts) style->apply(*e, mesh);
}

void parallelize_qwen3_cp(CausalLMImpl& model, const hp::DeviceMesh& cp_mesh, const std::string& mode, bool load_balance) {
  hp::parallelize_module(model, cp_mesh, {{"layers.*.self_attn.sdpa", hp::ContextParallel(mode, load_balance)}});
}

}  // namespace qwen3
}  // namespace hyper_parallel
