// Seed C15: tensor parallelism on mesh["tp"] then fully_shard on mesh["dp"] of one (dp, tp) mesh,
// against one process on the same global batch.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include <hyper_parallel/checkpoint/train_state.h>

#include "../../common/error_message.h"
#include "../checkpoint/train_state_util.h"
#include "../../common/test_util.h"
#include "../tensor_parallel/tp_models.h"
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace qwen3 = hyper_parallel::qwen3;

using namespace tp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_fsdp_fully_shard_test {
namespace {

// The rows of the global batch this dp rank trains on.
at::Tensor dp_rows(const at::Tensor& global, const hp::DeviceMesh& dp) {
  return global.chunk(dp.size(0), 0)[dp.get_local_rank()].contiguous();
}

void expect_params_match(torch::nn::Module& model, torch::nn::Module& ref, const char* when) {
  auto ref_params = ref.named_parameters();
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(hp::is_dtensor(p.value())) << p.key();
    EXPECT_TRUE(close(full(p.value()), ref_params[p.key()])) << p.key() << " " << when;
  }
  EXPECT_TRUE(hp_test::replicas_bitwise_equal(model)) << when;
}

}  // namespace

TEST(FullyShardDist, C15_TensorParallelThenFullyShardMlp) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto model = seeded<Mlp>(61, 8, 12);
  auto ref = seeded<Mlp>(61, 8, 12);
  // The 2-D root mesh is refused by parallelize_module (A2); its tp slice is what TP takes.
  EXPECT_THROW(hp::parallelize_module(*model, mesh, {{"linear1", hp::ColwiseParallel()}}), c10::ValueError);
  hp::parallelize_module(*model, mesh["tp"], {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
  hp::fully_shard(*model->linear1, mesh["dp"]);
  hp::fully_shard(*model->linear2, mesh["dp"]);
  hp::fully_shard(*model, mesh["dp"]);
  // linear1.weight: Colwise Shard(0) on tp, so dp takes dim 1; linear2.weight: Rowwise Shard(1), dp takes dim 0.
  EXPECT_EQ(hp::DTensor(model->linear1->weight()).placements(), (hp::Placements{hp::Shard(1), hp::Shard(0)}));
  EXPECT_EQ(hp::DTensor(model->linear2->weight()).placements(), (hp::Placements{hp::Shard(0), hp::Shard(1)}));
  EXPECT_EQ(hp::DTensor(model->linear2->bias()).placements(), (hp::Placements{hp::Shard(0), hp::Replicate()}));
  EXPECT_EQ(hp::DTensor(model->linear1->bias()).placements(), (hp::Placements{hp::Replicate(), hp::Shard(0)}));
  EXPECT_EQ(hp::DTensor(model->linear1->weight()).to_local().sizes(), (std::vector<int64_t>{6, 4}));  // 1/4 of [12, 8]
  expect_params_match(*model, *ref, "after sharding");

  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 2; ++step) {
    at::Tensor x = random({4, 8}, 10 + step), target = random({4, 8}, 20 + step);
    hp::CommDebugMode fwd;
    at::Tensor y = model(dp_rows(x, mesh["dp"]));
    // One all-gather over dp per fully_shard group with parameters (linear1, linear2; the root
    // holds none), 1 TP all-reduce.
    EXPECT_EQ(fwd.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 2}, {"all_reduce", 1}})) << fwd.summary();
    at::Tensor loss = (y - dp_rows(target, mesh["dp"])).pow(2).mean();
    hp::CommDebugMode bwd;
    opt.zero_grad();
    loss.backward();
    // Per group: the all-gather again (reshard_after_forward freed the parameters) and one
    // reduce-scatter of all its gradients (linear1.bias, replicated over dp, rides in it as an
    // all-reduce); no TP input-gradient reduction (x needs no gradient), nothing reduced twice.
    EXPECT_EQ(bwd.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 2}, {"reduce_scatter", 2}})) << bwd.summary();
    at::Tensor ref_loss = (ref(x) - target).pow(2).mean();
    ref_opt.zero_grad();
    ref_loss.backward();
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters()) {
      EXPECT_EQ(hp::DTensor(p.value().grad()).placements(), hp::DTensor(p.value()).placements()) << p.key();
      EXPECT_TRUE(close(full(p.value().grad()), ref_params[p.key()].grad())) << p.key() << " gradient, step " << step;
    }
    opt.step();
    ref_opt.step();
    expect_params_match(*model, *ref, "after a step");
  }
}

// Also with lm_head tied to embed_tokens: one parameter, sharded and gathered once, whose gradient
// sums both uses as in one process. And with one KV head on the 2 tp ranks: k/v_proj replicated
// on mesh["tp"] unflattened to (kv, kv_replica), which fully_shard takes over on (dp, kv,
// kv_replica), the replicas' partial gradients summed.
TEST(FullyShardDist, C15_TensorParallelThenFullyShardQwen3) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  for (const auto& [tied, kv_heads] : std::vector<std::pair<bool, int64_t>>{{false, 2}, {true, 2}, {false, 1}}) {
  SCOPED_TRACE(std::string(tied ? "tied embeddings" : "untied") + ", " + std::to_string(kv_heads) + " KV heads");
  qwen3::Config c;
  c.tie_word_embeddings = tied;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = kv_heads;
  c.head_dim = 8;
  hp_test::manual_seed(62);
  qwen3::CausalLM model(c);
  hp_test::manual_seed(62);
  qwen3::CausalLM ref(c);
  qwen3::parallelize_qwen3_tp(*model, mesh["tp"], /*sequence_parallel=*/true);
  for (const auto& layer : *model->layers) hp::fully_shard(*layer, mesh["dp"]);
  hp::fully_shard(*model, mesh["dp"]);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  at::Tensor ids = at::randint(c.vocab_size, {4, 9}, at::detail::createCPUGenerator(3), at::kLong);
  at::Tensor x = ids.narrow(1, 0, 8), y = ids.narrow(1, 1, 8);
  at::Tensor loss = qwen3::causal_lm_loss(model(dp_rows(x, mesh["dp"])), dp_rows(y, mesh["dp"]));
  loss.backward();
  at::Tensor ref_loss = qwen3::causal_lm_loss(ref(x), y);
  ref_loss.backward();
  // This dp rank's loss is half the batch; their mean is the global loss.
  at::Tensor mean_loss = hp::all_reduce(loss.detach().reshape({1}), hp::ReduceOp::AVG, mesh["dp"].get_group());
  EXPECT_TRUE(close(mean_loss[0], ref_loss));
  auto ref_params = ref->named_parameters();
  for (const auto& p : model->named_parameters())
    EXPECT_TRUE(close(full(p.value().grad()), ref_params[p.key()].grad())) << p.key() << " gradient";
  opt.step();
  ref_opt.step();
  expect_params_match(*model, *ref, "after a step");
  if (kv_heads == 1) {
    const auto& names = hp::DTensor(model->layers[0]->as<qwen3::DecoderLayerImpl>()->self_attn->k_proj->weight()).device_mesh().mesh_dim_names();
    EXPECT_EQ(names, (std::vector<std::string>{"dp", "kv", "kv_replica"}));
  }
  if (tied) {
    EXPECT_TRUE(model->lm_head->weight().is_same(model->embed_tokens->weight()));
    EXPECT_EQ(model->parameters().size(), ref->parameters().size());
  }
  }
}

// A float layer then a double one (two dtypes: two flat buffers when one group holds both).
class TwoDtypesImpl : public hnn::ModuleBase<TwoDtypesImpl> {
 public:
  TwoDtypesImpl() {
    linear1 = register_module("linear1", hnn::Linear(3, 5));  // weight [5, 3]: 2, 2, 1, 0 rows over 4 ranks
    linear2 = register_module("linear2", hnn::Linear(5, 3));
    linear2->to(at::kDouble);
  }
  at::Tensor forward(const at::Tensor& x) { return linear2(at::relu(linear1(x)).to(at::kDouble)); }
  hnn::Linear linear1{nullptr}, linear2{nullptr};
};
HP_MODULE(TwoDtypes);

// Plain parameters over a 4-rank dp mesh with pieces of 2, 2, 1 and 0 rows: per-layer groups
// with prefetch (reshard_after_forward), or one root group holding both dtypes (keeping the
// parameters after forward); explicit unshard()/reshard(). The same numbers as one process, and
// the collectives each setting promises.
TEST(FullyShardDist, UnevenPiecesDtypesAndResharding) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {4}, {"dp"});
  for (const bool per_layer : {true, false}) {
    SCOPED_TRACE(per_layer ? "per-layer groups, reshard_after_forward, prefetch" : "one root group of two dtypes, kept after forward");
    auto model = seeded<TwoDtypes>(64);
    auto ref = seeded<TwoDtypes>(64);
    std::vector<torch::nn::Module*> groups;
    if (per_layer) {
      hp::fully_shard(*model->linear1, mesh);
      hp::fully_shard(*model->linear2, mesh);
      hp::set_modules_to_forward_prefetch(*model->linear1, {model->linear2.get()});
      groups = {model->linear1.get(), model->linear2.get()};
    } else {
      groups = {model.get()};
    }
    hp::fully_shard(*model, mesh, {/*reshard_after_forward=*/per_layer});
    EXPECT_EQ(hp::DTensor(model->linear1->weight()).to_local().size(0), std::vector<int64_t>({2, 2, 1, 0})[hp::get_rank()]);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 2; ++step) {
      at::Tensor x = random({8, 3}, 30 + step), target = random({8, 3}, 40 + step).to(at::kDouble);
      hp::CommDebugMode fwd;
      at::Tensor y = model(dp_rows(x, mesh));
      // Per layer: linear1 gathers itself and prefetches linear2 (whose forward gathers nothing).
      // One group: one all-gather per dtype.
      EXPECT_EQ(fwd.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 2}})) << fwd.summary();
      at::Tensor loss = (y - dp_rows(target, mesh)).pow(2).mean();
      hp::CommDebugMode bwd;
      opt.zero_grad();
      loss.backward();
      const std::map<std::string, int64_t> want_bwd =
          per_layer ? std::map<std::string, int64_t>{{"all_gather", 2}, {"reduce_scatter", 2}}
                    : std::map<std::string, int64_t>{{"reduce_scatter", 2}};
      EXPECT_EQ(bwd.get_comm_counts(), want_bwd) << bwd.summary();
      at::Tensor ref_loss = (ref(x) - target).pow(2).mean();
      ref_opt.zero_grad();
      ref_loss.backward();
      auto ref_params = ref->named_parameters();
      for (const auto& p : model->named_parameters()) {
        EXPECT_EQ(p.value().scalar_type(), ref_params[p.key()].scalar_type()) << p.key();
        EXPECT_TRUE(close(full(p.value().grad()), ref_params[p.key()].grad())) << p.key() << " gradient, step " << step;
      }
      opt.step();
      ref_opt.step();
      expect_params_match(*model, *ref, "after a step");
    }
    // Explicit unshard: the next forward gathers nothing and matches; after reshard it gathers again.
    at::Tensor x = random({8, 3}, 50);
    at::NoGradGuard no_grad;
    for (auto* g : groups) hp::unshard(*g);
    {
      hp::CommDebugMode c;
      at::Tensor y = model(dp_rows(x, mesh));
      EXPECT_TRUE(c.get_comm_counts().empty()) << c.summary();
      EXPECT_TRUE(close(y, dp_rows(ref(x), mesh)));
    }
    for (auto* g : groups) hp::reshard(*g);
    {
      hp::CommDebugMode c;
      at::Tensor y = model(dp_rows(x, mesh));
      EXPECT_EQ(c.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 2}})) << c.summary();
      EXPECT_TRUE(close(y, dp_rows(ref(x), mesh)));
    }
  }
  torch::nn::Linear plain(2, 2);
  EXPECT_THROW(hp::unshard(*plain), c10::ValueError);
}

// A forward that throws inside a fully_shard module (a bad input shape, raised alike on every
// rank) must leave the model as it was: its registered parameters the sharded DTensors again,
// and the next steps exactly as if nothing had happened (the same numbers as one process, and the
// same collectives: the root group stays the root, so it still keeps its parameters for backward).
TEST(FullyShardDist, ForwardThatThrowsLeavesTheModelSharded) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {4}, {"dp"});
  auto model = seeded<TwoDtypes>(64);
  auto ref = seeded<TwoDtypes>(64);
  hp::fully_shard(*model->linear1, mesh);
  hp::fully_shard(*model->linear2, mesh);
  hp::fully_shard(*model, mesh);
  std::map<std::string, at::Tensor> sharded;
  for (const auto& p : model->named_parameters()) sharded[p.key()] = p.value();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  std::map<std::string, int64_t> first_fwd, first_bwd;
  for (int step = 0; step < 3; ++step) {
    // Before steps 1 and 2: a forward that fails in linear1 (4 input features where it takes 3),
    // once with autograd and once without.
    if (step > 0) {
      c10::optional<at::NoGradGuard> no_grad;
      if (step == 2) no_grad.emplace();
      EXPECT_THROW(model(dp_rows(random({8, 4}, 60 + step), mesh)), c10::Error);
      for (const auto& p : model->named_parameters())
        EXPECT_TRUE(p.value().is_same(sharded[p.key()])) << p.key() << " is not the sharded parameter after the failed forward";
    }
    at::Tensor x = random({8, 3}, 30 + step), target = random({8, 3}, 40 + step).to(at::kDouble);
    hp::CommDebugMode fwd;
    at::Tensor loss = (model(dp_rows(x, mesh)) - dp_rows(target, mesh)).pow(2).mean();
    hp::CommDebugMode bwd;
    opt.zero_grad();
    loss.backward();
    if (step == 0) {
      first_fwd = fwd.get_comm_counts();
      first_bwd = bwd.get_comm_counts();
    } else {
      EXPECT_EQ(fwd.get_comm_counts(), first_fwd) << "step " << step << ": " << fwd.summary();
      EXPECT_EQ(bwd.get_comm_counts(), first_bwd) << "step " << step << ": " << bwd.summary();
    }
    at::Tensor ref_loss = (ref(x) - target).pow(2).mean();
    ref_opt.zero_grad();
    ref_loss.backward();
    opt.step();
    ref_opt.step();
    expect_params_match(*model, *ref, "after a step");
  }
}

TEST(FullyShardDist, BadMeshesAndModulesFailBeforeAnyChange) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto model = seeded<Mlp>(63, 8, 12);
  hp::parallelize_module(*model, mesh["tp"], {{"linear1", hp::ColwiseParallel()}});
  const auto before = model->parameters();
  auto unchanged = [&] {
    const auto after = model->parameters();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].unsafeGetTensorImpl(), after[i].unsafeGetTensorImpl());
  };
  EXPECT_THROW(hp::fully_shard(*model, mesh), c10::ValueError);  // the 2-D root mesh
  unchanged();
  // TP parameters on a mesh that is not the other slice of dp's root mesh.
  auto other = hp::init_device_mesh("cpu", {4}, {"world"});
  EXPECT_THROW(hp::fully_shard(*model, other), c10::ValueError);
  unchanged();
  // A libtorch module cannot run the gathering hooks.
  torch::nn::Linear plain(4, 4);
  EXPECT_THROW(hp::fully_shard(*plain, mesh["dp"]), c10::TypeError);
  // A weight tied across two calls: the second refuses (it would make a second parameter), naming
  // both slots, and changes nothing.
  auto tied = seeded<Mlp>(64, 8, 8);
  tied->linear2->replace_parameter("weight", tied->linear1->weight());
  hp::fully_shard(*tied->linear1, mesh["dp"]);
  const at::Tensor held = tied->linear2->weight();
  const std::string m = hp_test::error_message([&] { hp::fully_shard(*tied, mesh["dp"]); });
  EXPECT_NE(m.find("parameter 'linear2.weight' is the tensor an earlier fully_shard call took over as 'weight' of a"),
            std::string::npos) << m;
  EXPECT_TRUE(tied->linear2->weight().is_same(held));
}

// The sharded gradients reach .grad at the end of each backward (the reduce-scatters complete
// there, after overlapping the rest of backward): two backward passes without zero_grad add up
// as autograd's accumulation does in one process.
TEST(FullyShardDist, GradientsAccumulateAcrossBackwardPasses) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto model = seeded<Mlp>(71, 8, 12);
  auto ref = seeded<Mlp>(71, 8, 12);
  hp::parallelize_module(*model, mesh["tp"], {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
  hp::fully_shard(*model->linear1, mesh["dp"]);
  hp::fully_shard(*model->linear2, mesh["dp"]);
  hp::fully_shard(*model, mesh["dp"]);
  for (int micro = 0; micro < 2; ++micro) {
    at::Tensor x = random({4, 8}, 30 + micro), target = random({4, 8}, 40 + micro);
    (model(dp_rows(x, mesh["dp"])) - dp_rows(target, mesh["dp"])).pow(2).mean().backward();
    (ref(x) - target).pow(2).mean().backward();
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_TRUE(close(full(p.value().grad()), ref_params[p.key()].grad())) << p.key() << " after backward " << micro;
    }
  }
}

namespace {

// `a` always; `b` after it only where `use_b` is set (a branch some data ranks' batches take).
class BranchImpl : public hnn::ModuleBase<BranchImpl> {
 public:
  BranchImpl() {
    a = register_module("a", hnn::Linear(4, 4));
    b = register_module("b", hnn::Linear(4, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = a(x);
    return use_b ? b(h) : h;
  }
  bool use_b = true;
  hnn::Linear a{nullptr}, b{nullptr};
};
HP_MODULE(Branch);

// The one-process reference of data ranks 0..dp-1, rank r training on rows `x.chunk(dp)[r]`, and
// using `b` iff `uses_b(r)`: the mean of the ranks' losses, as the data-parallel mean of gradients.
at::Tensor reference_loss(Branch& ref, const at::Tensor& x, int64_t dp, const std::function<bool(int64_t)>& uses_b) {
  at::Tensor loss;
  for (int64_t r = 0; r < dp; ++r) {
    ref->use_b = uses_b(r);
    const at::Tensor l = ref(x.chunk(dp, 0)[r]).pow(2).mean() / static_cast<double>(dp);
    loss = loss.defined() ? loss + l : l;
  }
  return loss;
}

// The data-parallel meshes of the tests below, each with its trace label: dp = world size, and
// at 4 ranks HSDP (replicate, shard) = 2 x 2.
std::vector<std::pair<std::string, hp::DeviceMesh>> data_parallel_meshes() {
  const int64_t ws = hp::get_world_size();
  std::vector<std::pair<std::string, hp::DeviceMesh>> out;
  out.emplace_back("dp = " + std::to_string(ws), hp::init_device_mesh("cpu", {ws}, {"dp"}));
  if (ws == 4) out.emplace_back("HSDP 2 x 2", hp::init_device_mesh("cpu", {2, 2}, {"replicate", "shard"}));
  return out;
}

}  // namespace

// A parameter some data ranks' batches do not use (`b`, used by data rank 0 only, in the root's
// group): every rank still takes its piece of the reduced gradient, which holds rank 0's share,
// and one process on the whole batch is matched by one SGD step (lr 1) and three AdamW steps; a
// parameter no rank used gets no gradient, as in one process. The train state saved after it
// loads at the same layout. dp = world size, and at 4 ranks HSDP 2 x 2 too.
TEST(FullyShardDist, ParameterSomeRanksDidNotUseGetsEveryShardOfItsGradient) {
  const int64_t ws = hp::get_world_size();
  ASSERT_GE(ws, 2);
  for (const auto& [label, mesh] : data_parallel_meshes()) {
    SCOPED_TRACE(label);
    const bool hsdp = mesh.ndim() == 2;
    const int64_t dp_rank = hp::get_rank();  // the data rank: this rank's rows
    for (const char* optimizer : {"sgd", "adamw"}) {
      SCOPED_TRACE(optimizer);
      auto model = seeded<Branch>(81), ref = seeded<Branch>(81);
      hp::fully_shard(*model, mesh);
      auto make = [&](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
        if (std::string(optimizer) == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1.0));
        return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.1));
      };
      auto opt = make(model->parameters()), ref_opt = make(ref->parameters());
      const int steps = std::string(optimizer) == "sgd" ? 1 : 3;
      for (int step = 0; step < steps; ++step) {
        const at::Tensor x = random({2 * ws, 4}, 90 + step);
        // Step 1 (AdamW): no rank uses b, which then gets no gradient and is not stepped.
        auto uses_b = [&](int64_t r) { return step != 1 && r == 0; };
        opt->zero_grad();
        ref_opt->zero_grad();
        model->use_b = uses_b(dp_rank);
        model(x.chunk(ws, 0)[dp_rank]).pow(2).mean().backward();
        reference_loss(ref, x, ws, uses_b).backward();
        auto ref_params = ref->named_parameters();
        for (const auto& p : model->named_parameters()) {
          const at::Tensor& want = ref_params[p.key()].grad();
          ASSERT_EQ(p.value().grad().defined(), want.defined()) << p.key() << " at step " << step;
          if (want.defined()) EXPECT_TRUE(close(full(p.value().grad()), want)) << p.key() << " gradient at step " << step;
        }
        opt->step();
        ref_opt->step();
        expect_params_match(*model, *ref, "after a step");
      }
      // The moments of every shard were written, so the state loads at the same layout (train
      // states hold Adam and AdamW).
      if (std::string(optimizer) == "sgd") continue;
      const train_state_test::Scratch dir(std::string("fsdp_unused_") + optimizer + (hsdp ? "_hsdp" : ""));
      hp::TrainState state{model.get(), opt.get()};
      hp::save_train_state(dir, state);
      auto loaded = seeded<Branch>(82);
      hp::fully_shard(*loaded, mesh);
      auto loaded_opt = make(loaded->parameters());
      hp::TrainState back{loaded.get(), loaded_opt.get()};
      hp::load_train_state(dir, back);
      expect_params_match(*loaded, *ref, "loaded");
      const auto saved = train_state_test::gathered_state(*model, *opt), restored = train_state_test::gathered_state(*loaded, *loaded_opt);
      ASSERT_EQ(saved.size(), restored.size());
      for (const auto& [name, t] : saved) EXPECT_TRUE(train_state_test::same_bits(restored.at(name), t)) << name << " after the load";
    }
  }
}

// `b` in its own fully_shard group. When every rank calls it, a step matches one process. When
// data rank 0 of each shard group calls it and the others never do, rank 0 gathers b's group
// while the others reduce the root's gradients: that pairing is refused at once, on every rank,
// each naming b's group (no rank waits for the timeout, no data is exchanged between the two),
// and the job goes on (the next case runs on the same groups). dp = world size, and HSDP 2 x 2.
TEST(FullyShardDist, GroupSomeRanksNeverCallStopsOnEveryRankNamingIt) {
  const int64_t ws = hp::get_world_size();
  ASSERT_GE(ws, 2);
  for (const auto& [label, mesh] : data_parallel_meshes()) {
    SCOPED_TRACE(label);
    const int64_t dp_rank = hp::get_rank();
    const int64_t shard_rank = mesh.get_local_rank(mesh.ndim() - 1);
    const at::Tensor x = random({2 * ws, 4}, 95);
    {  // every rank calls b: one process
      auto model = seeded<Branch>(83), ref = seeded<Branch>(83);
      hp::fully_shard(*model->b, mesh);
      hp::fully_shard(*model, mesh);
      model(x.chunk(ws, 0)[dp_rank]).pow(2).mean().backward();
      reference_loss(ref, x, ws, [](int64_t) { return true; }).backward();
      auto ref_params = ref->named_parameters();
      for (const auto& p : model->named_parameters())
        EXPECT_TRUE(close(full(p.value().grad()), ref_params[p.key()].grad())) << p.key();
    }
    auto model = seeded<Branch>(83);
    hp::fully_shard(*model->b, mesh);
    hp::fully_shard(*model, mesh);
    model->use_b = shard_rank == 0;
    const std::string m = hp_test::error_message([&] { model(x.chunk(ws, 0)[dp_rank]).pow(2).mean().backward(); });
    EXPECT_NE(m.find("fully_shard of 'b': all_gather of its parameters"), std::string::npos) << m;
    EXPECT_NE(m.find("fully_shard of the root module: reduce_scatter of its gradients"), std::string::npos) << m;
  }
}

}  // namespace t_dist_fsdp_fully_shard_test
