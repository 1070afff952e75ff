// The Qwen3-style model under parallelize_qwen3_tp against the same model in one process.
#include <gtest/gtest.h>

#include <torch/optim.h>
#include <hyper_parallel/dtensor/explicit_redistribution.h>
#include <hyper_parallel/dtensor/random.h>

#include <hyper_parallel/nn/activation_checkpoint.h>

#include "../../common/error_message.h"
#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace qwen3 = hyper_parallel::qwen3;

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_qwen3_test {
namespace {

qwen3::Config small_config() {
  qwen3::Config c;
  c.vocab_size = 32 * hp::get_world_size();
  c.hidden_size = 32;
  c.intermediate_size = 16 * hp::get_world_size();
  c.num_layers = 2;
  c.num_heads = 2 * hp::get_world_size();
  c.num_kv_heads = hp::get_world_size();
  c.head_dim = 8;
  return c;
}

qwen3::CausalLM build(const qwen3::Config& c) {
  hp_test::manual_seed(5);
  qwen3::CausalLM m(c);
  at::NoGradGuard g;
  for (auto& p : m->named_parameters())  // norms away from their all-ones init
    if (p.key().find("norm") != std::string::npos) p.value().copy_(random(p.value().sizes(), 9) * 0.1 + 1);
  return m;
}

void one_step_matches(bool sequence_parallel) {
  const auto c = small_config();
  const int64_t seq = 4 * hp::get_world_size();
  auto model = build(c), ref = build(c);
  auto tp = world_mesh();
  qwen3::parallelize_qwen3_tp(*model, tp, sequence_parallel);
  at::Tensor ids = at::randint(c.vocab_size, {2, seq + 1}, at::detail::createCPUGenerator(3), at::kLong);
  at::Tensor x = ids.narrow(1, 0, seq), y = ids.narrow(1, 1, seq);
  at::Tensor logits = model(x), ref_logits = ref(x);
  EXPECT_FALSE(hp::is_dtensor(logits));  // lm_head hands back whole local logits
  ASSERT_TRUE(close(logits, ref_logits)) << "sequence_parallel=" << sequence_parallel;
  // SGD: an Adam first step is lr * g / (|g| + eps), which turns float rounding in gradients
  // near zero into differences of order lr; the gradients themselves are compared below.
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  qwen3::causal_lm_loss(logits, y).backward();
  qwen3::causal_lm_loss(ref_logits, y).backward();
  opt.step();
  ref_opt.step();
  EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model));
  auto ref_params = ref->named_parameters();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(hp::is_dtensor(p.value())) << p.key();
    EXPECT_EQ(hp::DTensor(p.value().grad()).placements(), hp::DTensor(p.value()).placements()) << p.key();
    EXPECT_TRUE(close(p.value().grad(), ref_params[p.key()].grad())) << p.key() << " gradient";
    EXPECT_TRUE(close(p.value(), ref_params[p.key()])) << p.key() << " after one optimizer step";
  }
  EXPECT_TRUE(close(model(x), ref(x)));
}

}  // namespace

TEST(Qwen3TensorParallel, LogitsAndOneOptimizerStepMatchWithSequenceParallel) { one_step_matches(true); }

TEST(Qwen3TensorParallel, LogitsAndOneOptimizerStepMatchWithoutSequenceParallel) { one_step_matches(false); }

TEST(Qwen3TensorParallel, LossParallelKeepsLogitsShardedOnTheVocab) {
  const auto c = small_config();
  auto model = build(c), ref = build(c);
  qwen3::parallelize_qwen3_tp(*model, world_mesh(), true, /*loss_parallel=*/true);
  at::Tensor x = at::randint(c.vocab_size, {2, 4 * hp::get_world_size()}, at::detail::createCPUGenerator(3), at::kLong);
  hp::DTensor logits(model(x));
  EXPECT_EQ(logits.placements(), hp::Placements{hp::Shard(2)});
  EXPECT_EQ(logits.to_local().size(-1), c.vocab_size / hp::get_world_size());
  EXPECT_TRUE(close(logits, ref(x)));
  EXPECT_TRUE(close(qwen3::causal_lm_loss(logits, x), qwen3::causal_lm_loss(ref(x), x)));
}

// More ranks than KV heads (kv = tp / 2: 2 at tp=4, MQA at tp=2): the heads are replicated, and
// five SGD steps give one process's losses, gradients and parameters, with and without sequence
// parallelism. The replicas' partial gradients are summed (a wrong sum would double or halve them).
TEST(Qwen3TensorParallel, ReplicatedKVHeadsTrainAsOneProcess) {
  for (const bool sp : {true, false}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallel");
    auto c = small_config();
    c.num_kv_heads = hp::get_world_size() / 2;
    const int64_t seq = 4 * hp::get_world_size();
    auto model = build(c), ref = build(c);
    qwen3::parallelize_qwen3_tp(*model, world_mesh(), sp);
    const hp::DTensor k(model->layers[0]->as<qwen3::DecoderLayerImpl>()->self_attn->k_proj->weight());
    ASSERT_EQ(k.device_mesh().ndim(), 2);
    ASSERT_EQ(k.to_local().size(0), c.head_dim);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 5; ++step) {
      at::Tensor ids = at::randint(c.vocab_size, {2, seq + 1}, at::detail::createCPUGenerator(40 + step), at::kLong);
      at::Tensor x = ids.narrow(1, 0, seq), y = ids.narrow(1, 1, seq);
      opt.zero_grad();
      ref_opt.zero_grad();
      at::Tensor loss = qwen3::causal_lm_loss(model(x), y), ref_loss = qwen3::causal_lm_loss(ref(x), y);
      EXPECT_TRUE(close(loss, ref_loss)) << "step " << step;
      loss.backward();
      ref_loss.backward();
      auto ref_params = ref->named_parameters();
      for (const auto& p : model->named_parameters()) {
        EXPECT_EQ(hp::DTensor(p.value().grad()).placements(), hp::DTensor(p.value()).placements()) << p.key();
        EXPECT_TRUE(close(p.value().grad(), ref_params[p.key()].grad())) << p.key() << " gradient at step " << step;
      }
      opt.step();
      ref_opt.step();
      EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << "step " << step;
    }
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters()) EXPECT_TRUE(close(p.value(), ref_params[p.key()])) << p.key();
  }
}

// A tp that neither divides the KV heads nor is a multiple of them is refused before any change.
TEST(Qwen3TensorParallel, KVHeadsThatNeitherDivideNorAreDividedByTpAreRefused) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "needs tp=4 (6 KV heads neither divide nor are divided by 4)";
  auto c = small_config();
  c.num_heads = 12;
  c.num_kv_heads = 6;
  auto model = build(c);
  try {
    qwen3::parallelize_qwen3_tp(*model, world_mesh());
    FAIL() << "tp=4 over 6 KV heads was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("hyper_parallel::qwen3::parallelize_qwen3_tp: the tensor-parallel size 4 must divide "
                                         "num_key_value_heads (6)"),
              std::string::npos)
        << e.what();
  }
  for (const auto& p : model->parameters()) EXPECT_FALSE(hp::is_dtensor(p)) << "the model was changed";
}

TEST(Qwen3TensorParallel, IndivisibleHeadsAndSequenceFailCleanly) {
  auto c = small_config();
  c.num_heads = 2 * hp::get_world_size() + 1;  // q_proj width may divide, heads do not
  c.num_kv_heads = 1;
  c.head_dim = 2 * hp::get_world_size();
  auto model = build(c);
  const auto before = model->parameters();
  EXPECT_THROW(qwen3::parallelize_qwen3_tp(*model, world_mesh()), c10::ValueError);
  const auto after = model->parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].unsafeGetTensorImpl(), after[i].unsafeGetTensorImpl());
  // A sequence length that does not divide is refused at the first sequence split.
  auto ok = build(small_config());
  qwen3::parallelize_qwen3_tp(*ok, world_mesh(), true);
  try {
    ok(at::zeros({1, 4 * hp::get_world_size() + 1}, at::kLong));
    FAIL() << "an indivisible sequence ran";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
}

// Attention dropout draws its mask from the layout-independent generator: 20 AdamW steps under TP
// (heads sharded) give the losses of one process, within float rounding, and the dropout does
// change them (the test could not pass with a mask that ignored the draws).
TEST(Qwen3TensorParallel, DropoutTrainsToTheLossesOfOneProcess) {
  auto c = small_config();
  c.attention_dropout = 0.2;
  const int64_t seq = 4 * hp::get_world_size();
  const auto losses = [&](const c10::optional<hp::DeviceMesh>& tp, double dropout) {
    auto cfg = c;
    cfg.attention_dropout = dropout;
    auto model = build(cfg);
    if (tp) qwen3::parallelize_qwen3_tp(*model, *tp, /*sequence_parallel=*/true);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
    hp::manual_seed(21);
    std::vector<double> out;
    for (int64_t step = 0; step < 20; ++step) {
      at::Tensor ids = at::randint(cfg.vocab_size, {2, seq + 1}, at::detail::createCPUGenerator(100 + step), at::kLong);
      at::Tensor loss = qwen3::causal_lm_loss(model(ids.narrow(1, 0, seq)), ids.narrow(1, 1, seq));
      opt.zero_grad();
      loss.backward();
      opt.step();
      EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << "step " << step;
      out.push_back(loss.item<double>());
    }
    return out;
  };
  const auto tp = losses(world_mesh(), 0.2), single = losses(c10::nullopt, 0.2), no_dropout = losses(c10::nullopt, 0.0);
  double worst = 0, dropout_effect = 0;
  for (size_t i = 0; i < tp.size(); ++i) {
    worst = std::max(worst, std::abs(tp[i] - single[i]));
    dropout_effect = std::max(dropout_effect, std::abs(single[i] - no_dropout[i]));
  }
  EXPECT_LT(worst, 1e-4) << "max |loss_tp - loss_single| over 20 steps with dropout 0.2";
  EXPECT_GT(dropout_effect, 1e-3) << "dropout did not change the losses";
}

// The Qwen3 plan asks for every collective it needs by name (the styles' hooks): forward and
// backward run cleanly under ExplicitRedistribution(raise), with and without sequence parallelism.
TEST(Qwen3TensorParallel, ThePlanRunsUnderExplicitRedistribution) {
  const auto c = small_config();
  const int64_t seq = 4 * hp::get_world_size();
  at::Tensor ids = at::randint(c.vocab_size, {2, seq + 1}, at::detail::createCPUGenerator(3), at::kLong);
  for (bool sp : {true, false}) {
    auto model = build(c), ref = build(c);
    qwen3::parallelize_qwen3_tp(*model, world_mesh(), sp);
    at::Tensor loss;
    {
      hp::ExplicitRedistribution guard;
      loss = qwen3::causal_lm_loss(model(ids.narrow(1, 0, seq)), ids.narrow(1, 1, seq));
      loss.backward();
    }
    EXPECT_TRUE(close(loss, qwen3::causal_lm_loss(ref(ids.narrow(1, 0, seq)), ids.narrow(1, 1, seq)))) << "sp=" << sp;
  }
}

// A checkpointed layer replays its arguments in backward; a generation cache is an object that a
// replay would write again, so a checkpointed forward that records gradients refuses it by name,
// and under NoGradGuard (how generation runs) the same call simply runs.
TEST(Qwen3TensorParallel, CheckpointedLayerRefusesAGenerationCacheWhileRecordingGradients) {
  auto model = build(small_config());
  hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::full());
  const at::Tensor ids = at::randint(small_config().vocab_size, {2, 5}, at::detail::createCPUGenerator(3), at::kLong);
  qwen3::KVCache cache = model->make_cache(2, 8);
  qwen3::ForwardContext context;
  context.cache = &cache;
  const std::string msg = hp_test::error_message([&] { model->forward(ids, context); });
  EXPECT_NE(msg.find("hyper_parallel::checkpoint_wrapper: 'layers.0' was called with keyword 'cache', an object"), std::string::npos) << msg;
  qwen3::KVCache fresh = model->make_cache(2, 8);
  context.cache = &fresh;
  at::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(ids, context);
  EXPECT_EQ(fresh.length, 5);
  qwen3::CausalLM plain = build(small_config());
  qwen3::KVCache plain_cache = plain->make_cache(2, 8);
  context.cache = &plain_cache;
  EXPECT_TRUE(close(logits, plain->forward(ids, context)));
}

}  // namespace t_dist_models_qwen3_test
