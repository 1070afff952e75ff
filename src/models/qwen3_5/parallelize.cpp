#include <hyper_parallel/models/qwen3_5/parallelize.h>

#include "../parallelize_experts.h"
#include "../replicated_kv_heads.h"

namespace hyper_parallel {
namespace qwen3_5 {
namespace hp = hyper_parallel;

void parallelize_qwen3_5_tp(CausalLMImpl& model, const hp::DeviceMesh& tp_mesh, bool sequence_parallel, bool loss_parallel,
                            c10::optional<at::ScalarType> reduce_dtype) {
  HP_CHECK_T(c10::ValueError, tp_mesh.defined() && tp_mesh.ndim() == 1, "hyper_parallel::qwen3_5::parallelize_qwen3_5_tp: expects a 1-D ",
             "tp mesh, got a ", tp_mesh.defined() ? tp_mesh.ndim() : 0, "-D one");
  const int64_t tp = tp_mesh.size(0);
  const Config& c = model.config;
  // A head (and a key head with the value heads it serves) must not be split; KV heads fewer than
  // the ranks are replicated.
  const std::vector<std::pair<const char*, int64_t>> sizes{{"num_attention_heads", c.num_heads},
                                                          {"linear_num_key_heads", c.linear_num_key_heads},
                                                          {"linear_num_value_heads", c.linear_num_value_heads},
                                                          {"intermediate_size", c.intermediate_size}};
  std::vector<std::string> bad;
  for (const auto& [name, value] : sizes)
    if (value % tp != 0) bad.push_back(std::string(name) + " (" + std::to_string(value) + ")");
  HP_CHECK_T(c10::ValueError, bad.empty(), "hyper_parallel::qwen3_5::parallelize_qwen3_5_tp: ", hp::join_listed(bad),
             " must be divisible by the tensor-parallel size ", tp);
  const bool replicate_kv = models::kv_heads_replicated("qwen3_5::parallelize_qwen3_5_tp", c.num_kv_heads, tp);
  const hp::Placement act = sequence_parallel ? hp::Placement(hp::Shard(1)) : hp::Placement(hp::Replicate());
  const bool dtensor_stream = sequence_parallel;
  auto rowwise = [&](bool reduced) {
    return hp::RowwiseParallel(hp::Shard(-1), act, /*use_local_output=*/!dtensor_stream, reduced ? reduce_dtype : c10::nullopt);
  };
  const hp::SequenceParallel head_norm(/*sequence_dim=*/2, /*use_local_output=*/true);
  const hp::PrepareModuleInput replicate_input(hp::Layouts{act}, hp::Layouts{hp::Replicate()});
  // A MoE layer's shared expert splits as the dense MLP does; its routed experts go over the ranks
  // with parallelize_qwen3_5_experts, and the router and shared_expert_gate stay whole.
  const std::string mlp = c.is_moe() ? "layers.*.mlp.shared_expert" : "layers.*.mlp";
  std::vector<hp::PlanEntry> entries{
      {mlp + ".gate_proj", hp::ColwiseParallel()},
      {mlp + ".up_proj", hp::ColwiseParallel()},
  };
  if (!c.is_moe()) {
    entries.emplace_back("layers.*.mlp", replicate_input);
  } else {
    // The sparse block takes the whole stream as a plain tensor on every tp rank (the routed
    // experts over the ranks sum their outputs; the router and shared_expert_gate see every
    // token) and gives it back in the stream's layout: with sequence parallelism its own positions.
    entries.emplace_back("layers.*.mlp", hp::PrepareModuleInputOutput(hp::Layouts{act}, hp::Layouts{hp::Replicate()}, hp::Layouts{hp::Replicate()},
                                                                      hp::Layouts{act}, c10::nullopt, c10::nullopt, /*use_local_input=*/true,
                                                                      /*use_local_output=*/!dtensor_stream));
  }
  // A pipeline stage holds the embedding, the head, both or neither.
  if (model.embed_tokens) entries.emplace_back("embed_tokens", hp::RowwiseParallel(hp::Replicate(), act, /*use_local_output=*/!dtensor_stream));
  if (model.lm_head)
    entries.emplace_back("lm_head", hp::ColwiseParallel(act, loss_parallel ? hp::Shard(-1) : hp::Replicate(), /*use_local_output=*/!loss_parallel));
  std::vector<const char*> norms{"layers.*.input_layernorm", "layers.*.post_attention_layernorm"};
  if (model.norm) norms.push_back("norm");
  for (const char* norm : norms) {
    if (sequence_parallel) entries.emplace_back(norm, hp::SequenceParallel(1));
    else entries.emplace_back(norm, hp::NoParallel());
  }
  for (int64_t l = model.span.first_layer; l < model.span.end_layer; ++l) {
    const std::string layer = "layers." + std::to_string(l);
    const bool full = c.full_attention.at(static_cast<size_t>(l));
    // HyperParallel's training plan reduces the mixers' outputs, and a full layer's MLP, in reduce_dtype.
    // A shared expert's output joins the routed experts' (plain, replicated) inside the block.
    if (c.is_moe())
      entries.emplace_back(layer + ".mlp.shared_expert.down_proj",
                           hp::RowwiseParallel(hp::Shard(-1), hp::Replicate(), /*use_local_output=*/true, full ? reduce_dtype : c10::nullopt));
    else
      entries.emplace_back(layer + ".mlp.down_proj", rowwise(full));
    if (full) {
      const std::string a = layer + ".self_attn";
      entries.emplace_back(a, replicate_input);
      entries.emplace_back(a + ".q_proj", hp::ColwiseParallel());
      if (!replicate_kv)
        for (const char* proj : {".k_proj", ".v_proj"}) entries.emplace_back(a + proj, hp::ColwiseParallel());
      entries.emplace_back(a + ".q_norm", head_norm);
      entries.emplace_back(a + ".k_norm", head_norm);
      entries.emplace_back(a + ".o_proj", rowwise(true));
    } else {
      const std::string a = layer + ".linear_attn";
      entries.emplace_back(a, replicate_input);
      for (const char* proj : {".in_proj_q", ".in_proj_k", ".in_proj_v", ".in_proj_z", ".in_proj_b", ".in_proj_a"})
        entries.emplace_back(a + proj, hp::ColwiseParallel());
      entries.emplace_back(a + ".norm", head_norm);
      entries.emplace_back(a + ".out_proj", rowwise(true));
    }
  }
  hp::parallelize_module(model, tp_mesh, hp::ParallelizePlan(std::move(entries)));
  // The sequence mixing's own parameters by head (conv channels in the order of their heads), as
  // DTensors: FSDP, clipping, checkpoints and resharding see them like any other parameter.
  auto by_head = [](const std::string&, torch::nn::Module& m, const hp::DeviceMesh& mesh) {
    for (const auto& p : m.named_parameters(/*recurse=*/false))
      hnn::replace_parameter(m, p.key(), hp::distribute_parameter(p.value(), mesh, {hp::Shard(0)},
                                                                  p.value().is_meta() ? c10::nullopt : c10::optional<int64_t>(0)));
  };
  std::vector<hnn::LinearImpl*> kv;
  for (const auto& layer : *model.layers) {
    auto* l = layer->as<DecoderLayerImpl>();
    if (l->linear_attn) hp::distribute_module(*l->linear_attn->gdn.ptr(), tp_mesh, by_head);
    else kv.insert(kv.end(), {l->self_attn->k_proj.get(), l->self_attn->v_proj.get()});
  }
  if (replicate_kv) models::replicate_kv_heads(kv, c.num_kv_heads, tp_mesh);
  model.tie_weights();
}

void parallelize_qwen3_5_experts(CausalLMImpl& model, const hp::DeviceMesh& mesh, bool tensor_parallel, const std::string& token_dispatcher) {
  HP_CHECK_T(c10::ValueError, model.config.is_moe(), "hyper_parallel::qwen3_5::parallelize_qwen3_5_experts: the model has no MoE layer ",
             "(num_experts is 0)");
  std::vector<std::pair<std::string, hnn::GroupedExpertsImpl*>> experts;
  int64_t l = model.layers->first_index();
  for (const auto& layer : *model.layers) {
    if (auto moe = layer->as<DecoderLayerImpl>()->moe) experts.emplace_back("layers." + std::to_string(l) + ".mlp.experts", moe->experts.get());
    ++l;
  }
  models::parallelize_experts(experts, mesh, tensor_parallel, token_dispatcher, "qwen3_5::parallelize_qwen3_5_experts");
}

void parallelize_qwen3_5_cp(CausalLMImpl& model, const hp::DeviceMesh& cp_mesh, const std::string& linear_mode,
                            const std::string& attention_mode, bool load_balance) {
  HP_CHECK_T(c10::ValueError, !load_balance, "hyper_parallel::qwen3_5::parallelize_qwen3_5_cp: load_balance cannot be used: a Gated ",
             "DeltaNet layer reads the sequence in order (each rank's convolution and recurrent state continue from the ranks before it), ",
             "and the head-tail order would have to be undone around every such layer; shard the sequence contiguously ",
             "(context_parallel_shard with load_balance false)");
  // Both styles are built (and their modes checked) before the plan changes anything.
  const hp::LinearAttentionContextParallel linear(linear_mode);
  const hp::ContextParallel attention(attention_mode, /*load_balance=*/false);
  std::vector<hp::PlanEntry> entries;
  for (int64_t l = model.span.first_layer; l < model.span.end_layer; ++l) {
    const std::string layer = "layers." + std::to_string(l);
    if (model.config.full_attention.at(static_cast<size_t>(l))) entries.emplace_back(layer + ".self_attn.sdpa", attention);
    else entries.emplace_back(layer + ".linear_attn.gdn", linear);
  }
  hp::parallelize_module(model, cp_mesh, hp::ParallelizePlan(std::move(entries)));
}

}  // namespace qwen3_5
}  // namespace hyper_parallel
