// Random ops that do not depend on the layout: every element of a random DTensor has the value
// the same call gives it on a Replicate DTensor and on a plain tensor in one process, whatever the
// mesh and placements (hyper_parallel/dtensor/random.h).
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/tensor_parallel/api.h>
#include <hyper_parallel/tensor_parallel/style.h>

#include <torch/utils.h>

#include <functional>

#include "../../common/test_util.h"

using namespace hp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_random_test {
namespace {

using Draw = std::function<at::Tensor(const at::Tensor& like, const at::Tensor& probs)>;

struct RandomOp {
  std::string name;
  Draw draw;
};

// Each op draws from a tensor laid out like `like` (its values are overwritten or ignored).
std::vector<RandomOp> random_ops() {
  return {
      {"uniform_(-2, 3)", [](const at::Tensor& t, const at::Tensor&) { return t.clone().uniform_(-2, 3); }},
      {"normal_(1, 2)", [](const at::Tensor& t, const at::Tensor&) { return t.clone().normal_(1, 2); }},
      {"bernoulli_(0.3)", [](const at::Tensor& t, const at::Tensor&) { return t.clone().bernoulli_(0.3); }},
      {"bernoulli_(p tensor)", [](const at::Tensor& t, const at::Tensor& p) { return t.clone().bernoulli_(p); }},
      {"bernoulli(p)", [](const at::Tensor&, const at::Tensor& p) { return at::bernoulli(p); }},
      {"bernoulli(p, 0.6)", [](const at::Tensor& t, const at::Tensor&) { return at::bernoulli(t, 0.6); }},
      {"exponential_(2)", [](const at::Tensor& t, const at::Tensor&) { return t.clone().exponential_(2); }},
      {"random_(-3, 9)", [](const at::Tensor& t, const at::Tensor&) { return t.clone().random_(-3, 9); }},
      {"random_(5)", [](const at::Tensor& t, const at::Tensor&) { return t.clone().random_(5); }},
      {"random_() int64", [](const at::Tensor& t, const at::Tensor&) { return t.to(at::kLong).random_(); }},
      {"uniform_ float64", [](const at::Tensor& t, const at::Tensor&) { return t.to(at::kDouble).uniform_(); }},
      {"normal_ bfloat16", [](const at::Tensor& t, const at::Tensor&) { return t.to(at::kBFloat16).normal_(); }},
      {"rand_like", [](const at::Tensor& t, const at::Tensor&) { return at::rand_like(t); }},
      {"randn_like float64", [](const at::Tensor& t, const at::Tensor&) { return at::randn_like(t, at::kDouble); }},
      {"native_dropout(0.4) output", [](const at::Tensor& t, const at::Tensor&) { return std::get<0>(at::native_dropout(t, 0.4, true)); }},
      {"native_dropout(0.4) mask", [](const at::Tensor& t, const at::Tensor&) { return std::get<1>(at::native_dropout(t, 0.4, true)); }},
      {"at::dropout(0.4)", [](const at::Tensor& t, const at::Tensor&) { return at::dropout(t, 0.4, true); }},
      {"hp::dropout(0.25)", [](const at::Tensor& t, const at::Tensor&) { return hp::dropout(t, 0.25, true); }},
      {"hp::uniform_", [](const at::Tensor& t, const at::Tensor&) {
         at::Tensor c = t.clone();
         return hp::uniform_(c, 0.5, 1.5);
       }},
  };
}

at::Tensor full(const at::Tensor& t) { return hp::is_dtensor(t) ? hp::DTensor(t).full_tensor() : t; }

// Every op over `layouts` on `mesh` equals the same op on a Replicate DTensor, bit for bit.
void check_layouts(const hp::DeviceMesh& mesh, const std::vector<P>& layouts) {
  const std::vector<int64_t> shape{5, 7};  // uneven on 2 and 4 ranks
  const at::Tensor x = random(shape, 3);
  const at::Tensor probs = at::rand(shape, at::detail::createCPUGenerator(4)).to(test_device());
  const P replicated(static_cast<size_t>(mesh.ndim()), hp::Replicate());
  for (const auto& op : random_ops()) {
    hp::manual_seed(11);
    const at::Tensor ref = full(op.draw(hp::distribute_tensor(x, mesh, replicated), hp::distribute_tensor(probs, mesh, replicated)));
    for (const auto& p : layouts) {
      hp::manual_seed(11);
      const at::Tensor out = op.draw(hp::distribute_tensor(x, mesh, p), hp::distribute_tensor(probs, mesh, p));
      ASSERT_TRUE(hp::is_dtensor(out)) << op.name;
      EXPECT_EQ(hp::DTensor(out).placements(), hp::normalize_placements(p, 2)) << op.name;
      EXPECT_TRUE(at::equal(full(out).cpu(), ref.cpu())) << op.name << " on " << hp::to_string(p) << ":\n"
                                                         << full(out) << "\nReplicate:\n" << ref;
    }
  }
}

}  // namespace

TEST(RandomDist, EveryElementHasTheSameValueWhateverThePlacements) {
  check_layouts(world_mesh(), {P{hp::Shard(0)}, P{hp::Shard(1)}, P{hp::Shard(-1)}});
}

TEST(Random2x2Dist, EveryElementHasTheSameValueWhateverThePlacements) {
  auto mesh = hp::init_device_mesh(test_device_type(), {2, 2}, {"dp", "tp"});
  check_layouts(mesh, {P{hp::Shard(0), hp::Shard(1)}, P{hp::Shard(1), hp::Shard(0)}, P{hp::Shard(0), hp::Shard(0)},
                       P{hp::Replicate(), hp::Shard(1)}, P{hp::Shard(1), hp::Replicate()}});
}

// What one process draws on plain tensors through hyper_parallel's functions is what a DTensor
// draws, piece by piece.
TEST(RandomDist, PlainTensorsDrawWhatDTensorsDraw) {
  auto mesh = world_mesh();
  const at::Tensor x = random({6, 5}, 1);
  using Fill = std::function<at::Tensor(at::Tensor)>;
  const std::vector<std::pair<std::string, Fill>> fills = {
      {"uniform_", [](at::Tensor t) { return hp::uniform_(t, -1, 2); }},
      {"normal_", [](at::Tensor t) { return hp::normal_(t, 0.5, 3); }},
      {"bernoulli_", [](at::Tensor t) { return hp::bernoulli_(t, 0.7); }},
      {"dropout", [](at::Tensor t) { return hp::dropout(t, 0.3, true); }},
  };
  for (const auto& [name, fill] : fills) {
    hp::manual_seed(5);
    const at::Tensor plain = fill(x.clone());
    hp::manual_seed(5);
    const at::Tensor d = fill(hp::distribute_tensor(x, mesh, {hp::Shard(1)}));
    EXPECT_TRUE(at::equal(full(d).cpu(), plain.cpu())) << name;
  }
  // at::dropout on a DTensor (it decomposes into bernoulli_) is hp::dropout on the plain tensor.
  hp::manual_seed(6);
  const at::Tensor plain = hp::dropout(x, 0.4, true);
  hp::manual_seed(6);
  EXPECT_TRUE(at::equal(full(at::dropout(hp::distribute_tensor(x, mesh, {hp::Shard(0)}), 0.4, true)).cpu(), plain.cpu()));
  // The factories.
  hp::manual_seed(8);
  at::Tensor u = at::empty({9, 4}, at::TensorOptions().device(test_device()));
  hp::uniform_(u);
  hp::manual_seed(8);
  EXPECT_TRUE(at::equal(hp::rand({9, 4}, mesh, {hp::Shard(0)}).full_tensor().cpu(), u.cpu()));
  hp::manual_seed(8);
  at::Tensor n = at::empty({9, 4}, at::TensorOptions().device(test_device()).dtype(at::kDouble));
  hp::normal_(n);
  hp::manual_seed(8);
  const hp::DTensor r = hp::randn({9, 4}, mesh, {hp::Shard(1)}, at::TensorOptions().dtype(at::kDouble).requires_grad(true));
  EXPECT_TRUE(r.requires_grad());
  EXPECT_TRUE(at::equal(r.full_tensor().detach().cpu(), n.cpu()));
}

// The draws are random: the moments of each distribution, successive calls and seeds differ, a
// seed repeats.
TEST(RandomDist, DrawsHaveTheirDistributions) {
  auto mesh = world_mesh();
  const auto draw = [&](const std::function<at::Tensor(at::Tensor)>& f, at::ScalarType dtype = at::kFloat) {
    return full(f(hp::distribute_tensor(at::zeros({200, 100}, at::TensorOptions().dtype(dtype).device(test_device())), mesh,
                                        {hp::Shard(0)})))
        .cpu()
        .to(at::kDouble);
  };
  hp::manual_seed(1);
  const at::Tensor u = draw([](at::Tensor t) { return t.uniform_(); });
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.01);
  EXPECT_NEAR(u.var().item<double>(), 1.0 / 12, 0.003);
  EXPECT_GE(u.min().item<double>(), 0.0);
  EXPECT_LT(u.max().item<double>(), 1.0);
  const at::Tensor n = draw([](at::Tensor t) { return t.normal_(); }, at::kDouble);
  EXPECT_NEAR(n.mean().item<double>(), 0.0, 0.03);
  EXPECT_NEAR(n.std().item<double>(), 1.0, 0.02);
  // Normal tails: about 0.27 % beyond 3 sigma.
  EXPECT_NEAR((n.abs() > 3).to(at::kDouble).mean().item<double>(), 0.0027, 0.0015);
  EXPECT_NEAR(draw([](at::Tensor t) { return t.bernoulli_(0.3); }).mean().item<double>(), 0.3, 0.01);
  EXPECT_NEAR(draw([](at::Tensor t) { return t.exponential_(2.0); }).mean().item<double>(), 0.5, 0.015);
  const at::Tensor k = draw([](at::Tensor t) { return t.random_(0, 10); }, at::kLong);
  EXPECT_EQ(std::get<0>(at::_unique(k)).size(0), 10);
  EXPECT_NEAR(k.mean().item<double>(), 4.5, 0.06);
  // Neighbouring elements (which share a generator block) are not correlated.
  const at::Tensor a = u.reshape({-1}).narrow(0, 0, 19999), b = u.reshape({-1}).narrow(0, 1, 19999);
  EXPECT_NEAR(((a - 0.5) * (b - 0.5)).mean().item<double>() * 12, 0.0, 0.03);
  const at::Tensor u2 = draw([](at::Tensor t) { return t.uniform_(); });
  EXPECT_FALSE(at::equal(u, u2)) << "two calls drew the same numbers";
  hp::manual_seed(2);
  EXPECT_FALSE(at::equal(u, draw([](at::Tensor t) { return t.uniform_(); }))) << "two seeds drew the same numbers";
  hp::manual_seed(1);
  EXPECT_TRUE(at::equal(u, draw([](at::Tensor t) { return t.uniform_(); }))) << "a seed did not repeat";
  EXPECT_EQ(hp::initial_seed(), 1u);
}

TEST(RandomDist, DropoutGradientsMatchOneProcess) {
  auto mesh = world_mesh();
  const at::Tensor x0 = random({4, 8}, 2), w = random({4, 8}, 3);
  at::Tensor x = x0.clone().requires_grad_(true);
  hp::manual_seed(9);
  (hp::dropout(x, 0.5, true) * w).sum().backward();
  for (const P& p : {P{hp::Shard(0)}, P{hp::Shard(1)}, P{hp::Replicate()}}) {
    at::Tensor d = hp::distribute_tensor(x0, mesh, p);
    d.set_requires_grad(true);
    hp::manual_seed(9);
    (at::dropout(d, 0.5, true) * hp::distribute_tensor(w, mesh, p)).sum().backward();
    EXPECT_TRUE(at::equal(full(d.grad()).cpu(), x.grad().cpu())) << hp::to_string(p);
  }
  // Not training, or p = 0: the input itself.
  at::Tensor d = hp::distribute_tensor(x0, mesh, {hp::Shard(0)});
  EXPECT_TRUE(hp::dropout(d, 0.5, false).is_same(d));
  EXPECT_TRUE(at::equal(full(hp::dropout(d, 1.0, true)).cpu(), at::zeros({4, 8})));
}

TEST(RandomDist, BadCallsAreRefusedOnEveryRank) {
  auto mesh = world_mesh();
  at::Tensor d = hp::distribute_tensor(random({4, 6}, 1), mesh, {hp::Shard(0)});
  auto gen = at::detail::createCPUGenerator(1);
  try {
    d.uniform_(0, 1, gen);
    ADD_FAILURE() << "a torch::Generator was accepted";
  } catch (const c10::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("torch::Generator"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("hyper_parallel::dispatch: aten::uniform_(self: f32[4,6] S(0)", 0), 0u) << e.what();
  }
  at::Tensor partial = hp::DTensor::from_local(at::ones({4, 6}).to(test_device()), mesh, {hp::Partial()});
  EXPECT_THROW(partial.normal_(), c10::ValueError);
  EXPECT_THROW(d.uniform_(2, 1), c10::ValueError);
  EXPECT_THROW(d.normal_(0, -1), c10::ValueError);
  EXPECT_THROW(d.bernoulli_(1.5), c10::ValueError);
  EXPECT_THROW(d.exponential_(0), c10::ValueError);
  EXPECT_THROW(d.to(at::kLong).uniform_(), c10::TypeError);
  EXPECT_THROW(hp::rand({4}, mesh, {hp::Partial()}), c10::ValueError);
  EXPECT_THROW(hp::randn({4}, mesh, {hp::Shard(0), hp::Shard(0)}), c10::ValueError);
  EXPECT_THROW(hp::dropout(d, -0.1, true), c10::ValueError);
  // A refused call draws nothing: the next call gets the numbers it would have had.
  hp::manual_seed(3);
  const at::Tensor a = hp::DTensor(d.clone().uniform_()).full_tensor();
  hp::manual_seed(3);
  EXPECT_THROW(d.uniform_(2, 1), c10::ValueError);
  EXPECT_THROW(d.uniform_(0, 1, gen), c10::NotImplementedError);
  EXPECT_TRUE(at::equal(hp::DTensor(d.clone().uniform_()).full_tensor(), a));
}

// A per-rank seed (base + rank, a common data idiom) is fine wherever no draw must agree:
// parallelize_module with src_data_rank = None keeps each rank's own slice of its own weights,
// with no collective, whatever the seeds.
TEST(RandomDist, PerRankSeedsThenParallelizeWithoutSourceRankKeepEachRanksSlice) {
  namespace hnn = hyper_parallel::nn;
  auto mesh = hp::init_device_mesh(test_device().str(), {hp::get_world_size()}, {"tp"});
  torch::manual_seed(100 + static_cast<uint64_t>(hp::get_rank()));
  hnn::Linear layer(8, 8);
  const at::Tensor mine = layer->weight().detach().clone();
  hp::CommDebugMode comm;
  hp::parallelize_module(*layer, mesh, hp::ColwiseParallel(), /*src_data_rank=*/c10::nullopt);
  EXPECT_EQ(comm.get_total_counts(), 0) << "src_data_rank = None communicates nothing";
  EXPECT_TRUE(at::equal(hp::DTensor(layer->weight()).to_local().cpu(), mine.chunk(hp::get_world_size(), 0)[hp::get_rank()]));
  // Another seed on each rank really drew other weights (the comparison above can fail).
  const at::Tensor all = hp::DTensor(layer->weight()).full_tensor();
  EXPECT_FALSE(at::equal(all, mine.to(all.device()))) << "the ranks' weights were alike";
}

// A random op on a DTensor needs one key on every rank: after per-rank seeding, dropout on a
// Replicate DTensor is refused on every rank, naming the ranks whose keys differ from rank 0's;
// seeded alike again, it runs.
TEST(RandomDist, DropoutOnAReplicatedDTensorAfterPerRankSeedsNamesTheRanks) {
  auto mesh = world_mesh();
  const at::Tensor x = hp::distribute_tensor(at::ones({4, 8}).to(test_device()), mesh, {hp::Replicate()});
  torch::manual_seed(200 + static_cast<uint64_t>(hp::get_rank()));
  try {
    at::dropout(x, 0.5, true);
    ADD_FAILURE() << "ranks seeded differently drew a replicated dropout mask";
  } catch (const c10::ValueError& e) {
    const std::string m = e.what();
    std::string ranks;
    for (int64_t r = 1; r < hp::get_world_size(); ++r) ranks += (r > 1 ? ", " : "") + std::to_string(r);
    EXPECT_NE(m.find("the ranks disagree: rank(s) [" + ranks + "] differ from rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("random key"), std::string::npos) << m;
    EXPECT_NE(m.find("call torch.manual_seed(s) with the same s on every rank of " + mesh.to_string()), std::string::npos) << m;
    // (the op is bernoulli_ where dropout decomposes, native_dropout where it does not)
    EXPECT_EQ(m.rfind("hyper_parallel::dispatch: aten::", 0), 0u) << m;
  }
  torch::manual_seed(200);
  const at::Tensor y = hp::DTensor(at::dropout(x, 0.5, true)).to_local();
  // Every rank's local mask, side by side: all equal to rank 0's, and not all kept.
  const at::Tensor masks = hp::DTensor::from_local(y, mesh, {hp::Shard(0)}).full_tensor().cpu();
  for (const auto& m : masks.chunk(hp::get_world_size(), 0)) EXPECT_TRUE(at::equal(m, masks.narrow(0, 0, 4))) << "one mask on every rank";
  EXPECT_TRUE(y.eq(0).any().item<bool>());
}

}  // namespace t_dist_dtensor_random_test

