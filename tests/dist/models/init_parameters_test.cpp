// A Qwen3 model built on meta, parallelized (TP, and FSDP on a dp x tp mesh), then materialised
// by init_parameters: each rank allocates only its shards, and every element equals the one a
// one-process model built eagerly from the same seed holds, bit for bit; nothing is left
// uninitialised; tied weights stay one tensor; the model then trains as the one-process model.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <functional>
#include <torch/optim.h>

#include <hyper_parallel/fsdp/fully_shard.h>
#include <hyper_parallel/nn/init_parameters.h>
#include <hyper_parallel/runtime/collectives.h>

#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace qwen3 = hyper_parallel::qwen3;

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_init_parameters_test {
namespace {

qwen3::Config small_config(bool tied) {
  qwen3::Config c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  c.tie_word_embeddings = tied;
  return c;
}

qwen3::CausalLM meta_model(const qwen3::Config& c) {
  hyper_parallel::nn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
  return qwen3::CausalLM(c);
}

// Every parameter's local piece is real memory of the piece's size, holds no NaN, and the whole
// tensor equals the eager one-process model's bit for bit.
void expect_materialised_as(qwen3::CausalLMImpl& model, qwen3::CausalLMImpl& ref) {
  auto expected = ref.named_parameters();
  ASSERT_EQ(model.named_parameters().size(), expected.size());
  for (const auto& p : model.named_parameters()) {
    const at::Tensor local = hp::local_tensor(p.value());
    EXPECT_FALSE(local.is_meta()) << p.key();
    EXPECT_FALSE(local.isnan().any().item<bool>()) << p.key() << " has an uninitialised element";
    const at::Tensor whole = hp::is_dtensor(p.value()) ? hp::DTensor(p.value()).full_tensor() : p.value();
    EXPECT_TRUE(at::equal(whole.cpu(), expected[p.key()])) << p.key() << " differs from the one-process model";
  }
}

// From one seed: the one-process model of `c` built eagerly, and the same built on meta,
// parallelized by `plan`, then materialised by init_parameters with uninitialised memory filled
// NaN; every element of the second checked against the first. Returns {materialised, eager}.
std::pair<qwen3::CausalLM, qwen3::CausalLM> materialised_and_eager(const qwen3::Config& c, uint64_t seed,
                                                                   const std::function<void(qwen3::CausalLMImpl&)>& plan) {
  hp::manual_seed(seed);
  qwen3::CausalLM ref(c);
  hp::manual_seed(seed);
  qwen3::CausalLM model = meta_model(c);
  plan(*model);
  {
    FillUninitialised nan_fill;
    hp::init_parameters(*model, test_device());
  }
  expect_materialised_as(*model, *ref);
  return {model, ref};
}

}  // namespace

// tp = 1: no parallelism, the meta-built model materialised whole.
TEST(InitParametersDist, OneProcessMetaBuiltEqualsEagerBitwise) {
  materialised_and_eager(small_config(/*tied=*/true), 9, [](qwen3::CausalLMImpl&) {});
}

// tp = the world (2 or 4), with and without tied embeddings.
TEST(InitParametersDist, TensorParallelShardsEqualOneProcessBitwise) {
  const auto tp = world_mesh();
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const qwen3::Config c = small_config(tied);
    auto [model, ref] = materialised_and_eager(
        c, 2024, [&](qwen3::CausalLMImpl& m) { qwen3::parallelize_qwen3_tp(m, tp, /*sequence_parallel=*/true); });
    // Only the local shard was allocated: a Colwise weight holds 1/tp of the rows.
    const at::Tensor q = hp::DTensor(model->layers[0]->as<qwen3::DecoderLayerImpl>()->self_attn->q_proj->weight()).to_local();
    EXPECT_EQ(q.size(0), c.num_heads * c.head_dim / tp.size(0));
    if (tied) EXPECT_TRUE(model->lm_head->weight().is_same(model->embed_tokens->weight()));
  }
}

// Refused on every rank before anything is allocated: a device the mesh does not use, and a
// second materialisation.
TEST(InitParametersDist, WrongDeviceAndSecondCallAreRefused) {
  qwen3::CausalLM model = meta_model(small_config(false));
  qwen3::parallelize_qwen3_tp(*model, world_mesh(), /*sequence_parallel=*/true);
  const std::string other = test_device_type() == "cpu" ? "cuda" : "cpu";
  try {
    hp::init_parameters(*model, other);
    FAIL() << "materialised on " << other;
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("which does not use device " + other), std::string::npos) << e.what();
  }
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.is_meta()) << "nothing was allocated";
  hp::init_parameters(*model, test_device());
  EXPECT_THROW(hp::init_parameters(*model, test_device()), c10::ValueError);
}

// dp x tp = 2 x 2: TP, then FSDP per layer and at the root, all on meta; init_parameters
// materialises the FSDP shards (and the groups' buffers follow), equal to one process's; three
// SGD steps then give one process's losses.
TEST(InitParametersDist, FsdpOverTensorParallelEqualsOneProcess) {
  ASSERT_EQ(hp::get_world_size(), 4);
  const auto mesh = hp::init_device_mesh(test_device_type(), {2, 2}, {"dp", "tp"});
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const qwen3::Config c = small_config(tied);
    auto [model, ref] = materialised_and_eager(c, 77, [&](qwen3::CausalLMImpl& m) {
      qwen3::parallelize_qwen3_tp(m, mesh["tp"], /*sequence_parallel=*/true);
      for (const auto& layer : *m.layers) hp::fully_shard(*layer, mesh["dp"]);
      hp::fully_shard(m, mesh["dp"]);
    });
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      at::Tensor ids = at::randint(c.vocab_size, {4, 9}, at::detail::createCPUGenerator(10 + step), at::kLong);
      at::Tensor x = ids.narrow(1, 0, 8), y = ids.narrow(1, 1, 8);
      const int64_t dp = mesh["dp"].get_local_rank();
      at::Tensor loss = qwen3::causal_lm_loss(model(x.narrow(0, 2 * dp, 2).to(test_device())), y.narrow(0, 2 * dp, 2).to(test_device()));
      opt.zero_grad();
      loss.backward();
      opt.step();
      EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << "step " << step;
      at::Tensor ref_loss = qwen3::causal_lm_loss(ref(x), y);
      ref_opt.zero_grad();
      ref_loss.backward();
      ref_opt.step();
      at::Tensor mean = hp::all_reduce(loss.detach().reshape({1}).cpu(), hp::ReduceOp::AVG, mesh["dp"].get_group());
      EXPECT_TRUE(close(mean[0], ref_loss.detach())) << "step " << step;
    }
  }
}

}  // namespace t_dist_models_init_parameters_test
