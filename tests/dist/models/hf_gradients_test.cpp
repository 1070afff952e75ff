// Gradients against transformers' own backward, not only against our one-process run
// (tests/tools/hf_reference.py writes grads.safetensors: transformers' loss of 4 rows of 8 tokens,
// with output_router_logits=True and router_aux_loss_coef 0.05 for Qwen3-MoE, every parameter's
// gradient). Each layout loads the same HF checkpoint into its shards, runs one forward and
// backward of the same loss, and every parameter's whole gradient must equal transformers':
// max |g - g_ref| <= 1e-4 max |g_ref|, parameter by parameter. Then one optimizer step, after
// which every replicated parameter must be bitwise equal on the ranks that hold it.
//
// Layouts, at the world sizes where they exist:
// - Qwen3-MoE (unnormalised top-2 of 4 experts, a dense first layer; normalised top-2 of 8 experts
//   with a dense second layer, from bf16 sharded files loaded in float32): one process; attention TP with the experts split
//   over the same ranks, which hold the same tokens (ExpertParallel "all_reduce", from_pretrained's
//   layout), with and without activation checkpointing; attention TP with expert TensorParallel;
//   ExpertParallel "all_to_all" over data ranks (fully_shard over them); ep x tp = 2 x 2
//   (ExpertTensorParallel).
// - dense Qwen3: TP with and without sequence parallelism (q/k norms on head shards, norms on
//   sequence shards) and with loss parallelism; KV heads replicated over the ranks (fp32_kv1); tied
//   embeddings (fp32_sharded_tied).
#include <gtest/gtest.h>

#include <torch/optim.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/runtime/collectives.h>

#include <functional>
#include <map>
#include <set>

#include "../../common/hf_reference.h"
#include "../nn/training_util.h"
#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace qwen3 = hyper_parallel::qwen3;
namespace hnn = hyper_parallel::nn;

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_hf_gradients_test {
namespace {

const char* kMoeVariants[] = {"moe_fp32_e4", "moe_bf16_e8_sharded"};
const char* kDenseVariants[] = {"fp32_single", "fp32_kv1", "fp32_sharded_tied"};

struct Reference {
  at::Tensor ids;
  double loss = 0, aux_coef = 0;
  std::map<std::string, at::Tensor> grads;  // by our parameter name
};

Reference read_reference(const std::string& dir) {
  hp::SafetensorsFile f(dir + "/grads.safetensors");
  Reference r;
  r.ids = f.tensor("input_ids").clone();
  r.loss = f.tensor("loss").item<double>();
  r.aux_coef = f.tensor("aux_coef").item<double>();
  for (const auto& t : f.tensors())
    if (t.name.rfind("grad.", 0) == 0) r.grads[t.name.substr(5)] = f.tensor(t.name).clone();
  return r;
}

using Split = std::function<void(qwen3::CausalLMImpl&)>;

// How a layout splits the model and which of the reference's rows this rank trains on.
struct Layout {
  Split split;
  hp::Group data;  // the ranks that hold different rows (undefined: every rank holds them all)
  int64_t data_rank = 0, data_size = 1;
  bool checkpointing = false;
};

// Experts over the data ranks of a [dp, ep, tp] mesh (with ExpertTensorParallel when tp > 1),
// attention TP over tp, and fully_shard over the data ranks: the non-expert gradients averaged
// over them, the experts' (which already hold every data rank's tokens) divided by their number.
Layout data_parallel_experts(const hp::DeviceMesh& mesh) {
  Layout l;
  const int64_t ep = mesh.size(1), tp = mesh.size(2), data_ranks = mesh.size(0) * ep;
  l.split = [mesh, ep, tp, data_ranks](qwen3::CausalLMImpl& m) {
    if (tp > 1) qwen3::parallelize_qwen3_tp(m, mesh["tp"], /*sequence_parallel=*/false);
    qwen3::parallelize_qwen3_experts(m, tp > 1 ? mesh[{"ep", "tp"}] : mesh["ep"]);
    hp::FullyShardOptions experts;
    experts.gradient_divide_factor = static_cast<double>(data_ranks);
    for (const auto& layer : *m.layers)
      if (auto moe = layer->as<qwen3::DecoderLayerImpl>()->moe) hp::fully_shard(*moe->experts, mesh["dp"], experts);
    hp::fully_shard(m, mesh[{"dp", "ep"}]);
  };
  l.data = training_test::data_group(mesh);
  l.data_rank = mesh.get_local_rank(0) * ep + mesh.get_local_rank(1);
  l.data_size = data_ranks;
  return l;
}

// One forward and backward of the reference's loss under `layout` from `dir`'s checkpoint, every
// gradient against transformers', then one optimizer step and the replicas compared.
void expect_gradients_match(const std::string& dir, const Layout& layout) {
  const Reference ref = read_reference(dir);
  qwen3::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = qwen3::CausalLM(qwen3::load_config(dir + "/config.json"));
  }
  if (layout.split) layout.split(*model);
  if (layout.checkpointing) hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::full());
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, {qwen3::hf_key});
  model->train();  // no dropout in these configs: train mode changes nothing but is what training runs in

  const at::Tensor rows = ref.ids.chunk(layout.data_size, 0)[layout.data_rank].contiguous();
  const int64_t s = rows.size(1);
  at::Tensor loss = qwen3::causal_lm_loss(model(rows).narrow(1, 0, s - 1), rows.narrow(1, 1, s - 1));
  if (ref.aux_coef != 0) loss = loss + ref.aux_coef * model->aux_loss(layout.data);
  loss.backward();
  // The data ranks' mean loss is the whole batch's (each holds as many rows; the aux loss is
  // already the whole batch's).
  at::Tensor mean_loss = training_test::whole(loss.detach()).reshape({1}).clone();
  if (layout.data.defined()) hp::all_reduce_(mean_loss, hp::ReduceOp::AVG, layout.data);
  EXPECT_NEAR(mean_loss.item<double>(), ref.loss, 1e-5 * std::max(1.0, std::abs(ref.loss))) << "loss";

  std::set<std::string> seen;
  const bool tied = model->config.tie_word_embeddings;
  for (const auto& p : model->named_parameters()) {
    // A tied lm_head is embed_tokens' weight: one tensor, one gradient (both uses summed).
    const std::string key = tied && p.key() == "lm_head.weight" ? "embed_tokens.weight" : p.key();
    ASSERT_TRUE(ref.grads.count(key)) << p.key() << " has no gradient in transformers' reference";
    ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
    const at::Tensor g = training_test::whole(p.value().grad()), want = ref.grads.at(key);
    ASSERT_EQ(g.sizes(), want.sizes()) << p.key();
    const double err = (g - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
    EXPECT_LE(err, 1e-4 * scale + 1e-9) << p.key() << ": max |g - g_ref| = " << err << ", max |g_ref| = " << scale
                                        << " (relative " << err / std::max(scale, 1e-30) << ")";
    seen.insert(key);
  }
  for (const auto& [name, g] : ref.grads)
    if (!seen.count(name))
      ADD_FAILURE() << name << " has a reference gradient but is not a parameter of ours";

  // A step moves every replica alike only if their gradients are alike.
  torch::optim::AdamW opt(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-2));
  opt.step();
  EXPECT_TRUE(replicas_bitwise_equal(*model)) << "after a step";
}

#define REQUIRE_REFERENCE(dir) HP_REQUIRE_HF_REFERENCE(dir, "moe_fp32_e4")

}  // namespace

TEST(HFGradients, OneProcessMatchesTransformersBackward) {
  REQUIRE_REFERENCE(ref);
  if (hp::get_world_size() != 1) GTEST_SKIP() << "one process";
  for (bool checkpointing : {false, true})
    for (const char* v : kMoeVariants) {
      SCOPED_TRACE(std::string(v) + (checkpointing ? " with activation checkpointing" : ""));
      Layout l;
      l.checkpointing = checkpointing;
      expect_gradients_match(ref + "/" + v, l);
    }
  for (const char* v : kDenseVariants) {
    SCOPED_TRACE(v);
    expect_gradients_match(ref + "/" + v, Layout{});
  }
}

// from_pretrained's layout: attention TP, the experts split over the same ranks, which hold the
// same tokens. Each rank runs its experts' slots only, so the router weights' gradient (and
// through the router the residual stream's) is summed over the ranks with the tokens'.
TEST(HFGradients, ExpertParallelAllReduceOverTensorParallelRanksMatchesTransformersBackward) {
  REQUIRE_REFERENCE(ref);
  if (hp::get_world_size() == 1) GTEST_SKIP() << "needs ranks";
  for (bool checkpointing : {false, true})
    for (const char* v : kMoeVariants) {
      SCOPED_TRACE(std::string(v) + (checkpointing ? " with activation checkpointing" : ""));
      Layout l;
      l.split = [](qwen3::CausalLMImpl& m) {
        qwen3::parallelize_qwen3_tp(m, world_mesh(), /*sequence_parallel=*/false);
        qwen3::parallelize_qwen3_experts(m, world_mesh(), /*tensor_parallel=*/false, "all_reduce");
      };
      l.checkpointing = checkpointing;
      expect_gradients_match(ref + "/" + v, l);
    }
}

TEST(HFGradients, ExpertTensorParallelMatchesTransformersBackward) {
  REQUIRE_REFERENCE(ref);
  if (hp::get_world_size() == 1) GTEST_SKIP() << "needs ranks";
  for (const char* v : kMoeVariants) {
    SCOPED_TRACE(v);
    Layout l;
    l.split = [](qwen3::CausalLMImpl& m) {
      qwen3::parallelize_qwen3_tp(m, world_mesh(), /*sequence_parallel=*/false);
      qwen3::parallelize_qwen3_experts(m, world_mesh(), /*tensor_parallel=*/true);
    };
    expect_gradients_match(ref + "/" + v, l);
  }
}

// Ranks with different rows (ep taken from the data ranks): tokens travel to their experts by
// all-to-all; with and without activation checkpointing.
TEST(HFGradients, ExpertParallelAllToAllOverDataRanksMatchesTransformersBackward) {
  REQUIRE_REFERENCE(ref);
  const int64_t ws = hp::get_world_size();
  if (ws == 1) GTEST_SKIP() << "needs ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {1, ws, 1}, {"dp", "ep", "tp"});
  for (bool checkpointing : {false, true})
    for (const char* v : kMoeVariants) {
      SCOPED_TRACE(std::string(v) + (checkpointing ? " with activation checkpointing" : ""));
      Layout l = data_parallel_experts(mesh);
      l.checkpointing = checkpointing;
      expect_gradients_match(ref + "/" + v, l);
    }
}

TEST(HFGradients, ExpertTensorParallelTwoByTwoMatchesTransformersBackward) {
  REQUIRE_REFERENCE(ref);
  if (hp::get_world_size() != 4) GTEST_SKIP() << "ep x tp = 2 x 2 needs 4 ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {1, 2, 2}, {"dp", "ep", "tp"});
  for (const char* v : kMoeVariants) {
    SCOPED_TRACE(v);
    expect_gradients_match(ref + "/" + v, data_parallel_experts(mesh));
  }
}

// Dense Qwen3 under TP: q/k norms on head shards, norms on sequence shards (sequence
// parallelism), the vocabulary-parallel loss, and with fp32_kv1 the one KV head replicated
// over every rank: replicated weights whose gradients come from rank-local work.
TEST(HFGradients, DenseTensorParallelMatchesTransformersBackward) {
  REQUIRE_REFERENCE(ref);
  if (hp::get_world_size() == 1) GTEST_SKIP() << "needs ranks";
  struct Case {
    bool sp, loss_parallel;
  };
  for (const Case c : {Case{false, false}, Case{true, false}, Case{true, true}})
    for (const char* v : kDenseVariants) {
      SCOPED_TRACE(std::string(v) + (c.sp ? " sequence parallel" : "") + (c.loss_parallel ? " loss parallel" : ""));
      Layout l;
      l.split = [c](qwen3::CausalLMImpl& m) { qwen3::parallelize_qwen3_tp(m, world_mesh(), c.sp, c.loss_parallel); };
      expect_gradients_match(ref + "/" + v, l);
    }
}

// A left-padded batch (rows padded by 3, 0 and 6 tokens) given with its key mask, cross-entropy over
// the targets whose position and predecessor are real, under every activation-checkpointing policy
// at tp = world size: every gradient equals transformers' (forward with attention_mask). The mask
// and the padding reach each layer as its arguments, which a checkpointed layer's recompute replays.
TEST(HFGradients, LeftPaddedBatchUnderEveryCheckpointingPolicyMatchesTransformersBackward) {
  REQUIRE_REFERENCE(ref);
  const std::string dir = ref + "/fp32_single";
  hp::SafetensorsFile f(dir + "/padded.safetensors");
  const at::Tensor ids = f.tensor("input_ids").clone(), mask = f.tensor("attention_mask").to(at::kBool);
  ASSERT_FALSE(mask.all().item<bool>());
  ASSERT_TRUE(mask[1].all().item<bool>()) << "one row without padding";
  const at::Tensor valid = mask.narrow(1, 0, ids.size(1) - 1).logical_and(mask.narrow(1, 1, ids.size(1) - 1));
  const at::Tensor targets = ids.narrow(1, 1, ids.size(1) - 1).masked_fill(valid.logical_not(), -100).reshape({-1});
  const int64_t ws = hp::get_world_size();
  for (const char* policy : {"none", "full", "selective", "full:2"}) {
    SCOPED_TRACE(std::string("activation checkpointing ") + policy + " at tp = " + std::to_string(ws));
    qwen3::CausalLM model{nullptr};
    {
      hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
      model = qwen3::CausalLM(qwen3::load_config(dir + "/config.json"));
    }
    if (ws > 1) qwen3::parallelize_qwen3_tp(*model, world_mesh(), /*sequence_parallel=*/false);
    hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::parse(policy));
    hp::to_empty(*model, "cpu");
    hp::load_hf_checkpoint(*model, dir, {qwen3::hf_key});
    model->train();
    qwen3::ForwardContext context;
    context.key_mask = mask;
    const at::Tensor logits = training_test::whole(model->forward(ids, context));
    const at::Tensor loss = at::cross_entropy_loss(logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, logits.size(-1)}), targets, {},
                                                   at::Reduction::Mean, -100);
    EXPECT_NEAR(loss.item<double>(), f.tensor("loss").item<double>(), 1e-5) << "loss";
    loss.backward();
    int64_t compared = 0;
    for (const auto& p : model->named_parameters()) {
      const at::Tensor want = f.tensor(p.key() == "lm_head.weight" ? "grad.lm_head.weight" : "grad.model." + p.key());
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
      EXPECT_TRUE(near_relative(p.value().grad(), want, 1e-4)) << p.key();
      ++compared;
    }
    EXPECT_EQ(compared, 25);
  }
}

// transformers computes the load-balancing loss of a left-padded batch with its attention_mask,
// leaving the padded tokens out: ours, given the key mask, equals it (and differs from the loss
// that counts the padding, so the comparison can fail).
TEST(HFGradients, PaddedBatchLoadBalancingLossLeavesThePaddingOutAsTransformers) {
  REQUIRE_REFERENCE(ref);
  const std::string dir = ref + "/moe_fp32_e4";
  hp::SafetensorsFile f(dir + "/padded.safetensors");
  ASSERT_GT(f.tensor("router_gap").item<double>(), 1e-4) << "a near tie in the padded batch's routing";
  const at::Tensor ids = f.tensor("input_ids").clone(), mask = f.tensor("attention_mask").to(at::kBool);
  qwen3::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    model = qwen3::CausalLM(qwen3::load_config(dir + "/config.json"));
  }
  hp::to_empty(*model, "cpu");
  hp::load_hf_checkpoint(*model, dir, {qwen3::hf_key});
  qwen3::ForwardContext context;
  context.key_mask = mask;
  model->forward(ids, context);
  const double aux = model->aux_loss().item<double>();
  EXPECT_NEAR(aux, f.tensor("aux_loss").item<double>(), 1e-5);
  EXPECT_GT(std::abs(aux - f.tensor("aux_loss_unmasked").item<double>()), 1e-4);
}

}  // namespace t_dist_models_hf_gradients_test

#undef REQUIRE_REFERENCE
