// Cases A1-A12 (interface and fail-closed) and D1/D2 (glob, single style at the root).
#include "tp_models.h"

#include <typeinfo>

using namespace tp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_tensor_parallel_api_test {
namespace {
const hp::DeviceMesh& tp_mesh() {
  static hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  return mesh;
}

// Every parameter of `m` (for "the module is unchanged" checks).
std::vector<at::Tensor> params_of(torch::nn::Module& m) { return m.parameters(); }
bool same_params(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].unsafeGetTensorImpl() != b[i].unsafeGetTensorImpl()) return false;
  return true;
}
}  // namespace

// C++ turns A1 into a compile-time guarantee: ParallelStyle has a pure virtual apply(), so
// `ParallelStyle()` does not compile; every concrete style is a ParallelStyle.
static_assert(std::is_abstract_v<hp::ParallelStyle>, "ParallelStyle must be abstract");
static_assert(!std::is_constructible_v<hp::ParallelStyle>, "ParallelStyle() must not be possible");
static_assert(std::is_base_of_v<hp::ParallelStyle, hp::ColwiseParallel> && std::is_base_of_v<hp::ParallelStyle, hp::RowwiseParallel> &&
              std::is_base_of_v<hp::ParallelStyle, hp::SequenceParallel> && std::is_base_of_v<hp::ParallelStyle, hp::PrepareModuleInput> &&
              std::is_base_of_v<hp::ParallelStyle, hp::PrepareModuleOutput> && std::is_base_of_v<hp::ParallelStyle, hp::PrepareModuleInputOutput> &&
              std::is_base_of_v<hp::ParallelStyle, hp::NoParallel>);
// A3 at compile time: a list of styles is not a plan.
static_assert(!std::is_constructible_v<hp::ParallelizePlan, std::vector<std::shared_ptr<hp::ParallelStyle>>>);

TEST(ParallelStyleApi, A1_ParallelStyleIsAbstractAndDefaultsSrcDataRankToZero) {
  hp::ColwiseParallel c;
  EXPECT_EQ(c.src_data_rank, c10::optional<int64_t>(0));
  // A subclass that does not implement apply stays abstract.
  struct Incomplete : hp::ParallelStyle {
    void validate(torch::nn::Module&, const std::string&, const hp::DeviceMesh&) const override {}
    std::string name() const override { return "Incomplete"; }
  };
  static_assert(std::is_abstract_v<Incomplete>);
}

TEST(ParallelizeModuleApi, A2_TwoDimensionalMeshIsRejected) {
  auto mesh2d = hp::init_device_mesh("cpu", {tp_size() / 2 > 0 ? 2 : 1, tp_size() / 2 > 0 ? tp_size() / 2 : tp_size()}, {"dp", "tp"});
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size());
  auto before = params_of(*mlp);
  try {
    hp::parallelize_module(*mlp, mesh2d, {{"linear1", hp::ColwiseParallel()}});
    FAIL() << "a 2-D mesh was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("device_mesh[\"tp\"]"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_params(before, params_of(*mlp)));
  // The 1-D slice works.
  hp::parallelize_module(*mlp, mesh2d["tp"], {{"linear1", hp::ColwiseParallel()}});
  EXPECT_TRUE(hp::is_dtensor(mlp->linear1->weight()));
}

TEST(ParallelizeModuleApi, A3_PlanValueThatIsNotAStyleIsTypeError) {
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size());
  auto before = params_of(*mlp);
  std::shared_ptr<hp::ParallelStyle> none;
  EXPECT_THROW(hp::parallelize_module(*mlp, tp_mesh(), {{"linear1", hp::ColwiseParallel()}, {"linear2", none}}), c10::TypeError);
  EXPECT_THROW(hp::parallelize_module(*mlp, tp_mesh(), hp::ParallelizePlan(none)), c10::TypeError);
  EXPECT_TRUE(same_params(before, params_of(*mlp)));  // linear1 was not touched either
}

TEST(ParallelizeModuleApi, A4_EmptyPathOrEmptyAtomIsValueError) {
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size());
  auto before = params_of(*mlp);
  EXPECT_THROW(hp::parallelize_module(*mlp, tp_mesh(), {{"", hp::ColwiseParallel()}}), c10::ValueError);
  EXPECT_THROW(hp::parallelize_module(*mlp, tp_mesh(), {{"linear1..x", hp::ColwiseParallel()}}), c10::ValueError);
  EXPECT_THROW(hp::parallelize_module(*mlp, tp_mesh(), {{"linear1", hp::ColwiseParallel()}, {"a..b", hp::RowwiseParallel()}}),
               c10::ValueError);
  EXPECT_TRUE(same_params(before, params_of(*mlp)));
}

TEST(ParallelizeModuleApi, A5_UnmatchedPathWarnsAndIsSkipped) {
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size());
  WarningCapture warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  auto before = params_of(*mlp);
  hp::parallelize_module(*mlp, tp_mesh(), {{"does_not_exist", hp::ColwiseParallel()}});
  EXPECT_TRUE(warnings.contains("does_not_exist")) << warnings.messages.size();
  EXPECT_TRUE(same_params(before, params_of(*mlp)));
  // The other entries still apply.
  hp::parallelize_module(*mlp, tp_mesh(), {{"nope.*", hp::RowwiseParallel()}, {"linear1", hp::ColwiseParallel()}});
  EXPECT_TRUE(hp::is_dtensor(mlp->linear1->weight()));
  EXPECT_FALSE(hp::is_dtensor(mlp->linear2->weight()));
}

TEST(ParallelizeModuleApi, A6_ColwiseRowwiseOnlyForLinearAndEmbedding) {
  struct CustomImpl : hnn::ModuleBase<CustomImpl> {
    CustomImpl() { register_parameter("weight", at::ones({4, 4})); }
    at::Tensor forward(const at::Tensor& x) { return x; }
  };
  std::vector<std::pair<const char*, std::shared_ptr<torch::nn::Module>>> modules{
      {"LayerNorm", hnn::LayerNorm(std::vector<int64_t>{4}).ptr()},
      {"ReLU", hnn::ReLU().ptr()},
      {"custom", std::make_shared<CustomImpl>()}};
  for (auto& [what, m] : modules) {
    auto before = params_of(*m);
    for (int row = 0; row < 2; ++row) {
      try {
        if (row) hp::parallelize_module(*m, tp_mesh(), hp::RowwiseParallel());
        else hp::parallelize_module(*m, tp_mesh(), hp::ColwiseParallel());
        FAIL() << what << " accepted";
      } catch (const c10::NotImplementedError& e) {
        EXPECT_NE(std::string(e.what()).find("Linear and Embedding"), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(same_params(before, params_of(*m))) << what;
  }
  // A libtorch module cannot carry hooks: rejected, naming the FQN.
  struct HolderImpl : hnn::ModuleBase<HolderImpl> {
    HolderImpl() { proj = register_module("proj", torch::nn::Linear(4, 4)); }
    torch::nn::Linear proj{nullptr};
  } holder;
  try {
    hp::parallelize_module(holder, tp_mesh(), {{"proj", hp::ColwiseParallel()}});
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'proj'"), std::string::npos) << e.what();
  }
}

TEST(PrepareModuleInputApi, A7_LayoutLengthsMustMatchAtConstruction) {
  EXPECT_THROW(hp::PrepareModuleInput(hp::Layouts{hp::Shard(0), hp::Replicate()}, hp::Layouts{hp::Replicate()}), hp::AssertionError);
  EXPECT_THROW(hp::PrepareModuleInput(hp::Layouts{hp::Shard(0)}, c10::nullopt), hp::AssertionError);
  EXPECT_THROW(hp::PrepareModuleInput(c10::nullopt, c10::nullopt, hp::KwargLayouts{{"a", hp::Shard(0)}}, hp::KwargLayouts{}),
               hp::AssertionError);
  EXPECT_THROW(hp::PrepareModuleOutput(hp::Layouts{hp::Shard(0)}, hp::Layouts{}), hp::AssertionError);
  EXPECT_NO_THROW(hp::PrepareModuleInput(hp::Layouts{hp::Shard(0), c10::nullopt}, hp::Layouts{hp::Replicate(), c10::nullopt}));
}

TEST(PrepareModuleInputApi, A8_ForwardArityMismatchIsValueError) {
  TwoInputs m;
  hp::parallelize_module(*m, tp_mesh(), hp::PrepareModuleInput(hp::Layouts{hp::Shard(0)}, hp::Layouts{hp::Replicate()}));
  try {
    m(at::ones({2, 2}), at::ones({2, 2}), hnn::Kwargs{});
    FAIL();
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("same length"), std::string::npos) << e.what();
  }
}

TEST(SequenceParallelApi, A9_InputMustBeTensorOrDTensor) {
  struct ListInImpl : hnn::ModuleBase<ListInImpl> {
    at::Tensor forward(const std::vector<at::Tensor>& xs) { return xs[0]; }
  };
  struct IntInImpl : hnn::ModuleBase<IntInImpl> {
    at::Tensor forward(int64_t n) { return at::ones({n}); }
  };
  auto list_in = std::make_shared<ListInImpl>();
  auto int_in = std::make_shared<IntInImpl>();
  hp::parallelize_module(*list_in, tp_mesh(), hp::SequenceParallel());
  hp::parallelize_module(*int_in, tp_mesh(), hp::SequenceParallel());
  for (int k = 0; k < 2; ++k) {
    try {
      if (k) hnn::call_with_hooks(*int_in, int64_t{3});
      else hnn::call_with_hooks(*list_in, std::vector<at::Tensor>{at::ones({2})});
      FAIL();
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("tensor or DTensor"), std::string::npos) << e.what();
    }
  }
}

TEST(RowwiseParallelApi, A10_PlainTensorOutputOfLinearIsTypeError) {
  // A Linear-like module that leaves DTensor land inside forward.
  struct LeakyLinearImpl : hnn::ModuleBase<LeakyLinearImpl> {
    LeakyLinearImpl() { register_parameter("weight", at::ones({4, 2 * tp_size()})); }
    hnn::ModuleKind module_kind() const override { return hnn::ModuleKind::Linear; }
    at::Tensor forward(const at::Tensor& x) { return hp::DTensor(at::linear(x, parameter("weight"))).redistribute({hp::Replicate()}).to_local(); }
  };
  auto m = std::make_shared<LeakyLinearImpl>();
  hp::parallelize_module(*m, tp_mesh(), hp::RowwiseParallel());
  EXPECT_THROW(hnn::call_with_hooks(*m, at::ones({1, 2})), c10::TypeError);
}

TEST(DistributeModuleApi, A11_SecondDistributeModuleIsRuntimeError) {
  hnn::Linear l = seeded<hnn::Linear>(1, 4, 2 * tp_size());
  hp::ColwiseParallel().apply(*l, tp_mesh());
  auto before = params_of(*l);
  try {
    hp::ColwiseParallel().apply(*l, tp_mesh());
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_EQ(typeid(e), typeid(c10::Error)) << "expected a RuntimeError (c10::Error), got " << typeid(e).name();
  }
  EXPECT_TRUE(same_params(before, params_of(*l)));
  // Two distributing styles on one module in one plan are refused before anything changes.
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size());
  auto mlp_before = params_of(*mlp);
  EXPECT_THROW(hp::parallelize_module(*mlp, tp_mesh(), {{"linear1", hp::ColwiseParallel()}, {"linear*", hp::NoParallel()}}), c10::Error);
  EXPECT_TRUE(same_params(mlp_before, params_of(*mlp)));
  // PrepareModuleOutput on top of a distributed module is fine (it only converts outputs).
  EXPECT_NO_THROW(hp::PrepareModuleOutput(hp::Layouts{hp::Shard(-1)}, hp::Layouts{hp::Replicate()}).apply(*l, tp_mesh()));
}

TEST(ParallelizeModuleApi, A12_NoPlanWarnsAndReturnsTheModule) {
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size());
  WarningCapture warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  auto before = params_of(*mlp);
  torch::nn::Module& out = hp::parallelize_module(*mlp, tp_mesh());
  EXPECT_EQ(&out, mlp.get());
  EXPECT_TRUE(warnings.contains("no parallelize_plan"));
  EXPECT_TRUE(same_params(before, params_of(*mlp)));
}

TEST(ParallelizeModuleApi, CurrentMeshScopeAndMissingMesh) {
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size());
  EXPECT_THROW(hp::parallelize_module(*mlp, c10::nullopt, {{"linear1", hp::ColwiseParallel()}}), c10::Error);
  hp::MeshScope scope(tp_mesh());
  hp::parallelize_module(*mlp, c10::nullopt, {{"linear1", hp::ColwiseParallel()}});
  EXPECT_TRUE(hp::is_dtensor(mlp->linear1->weight()));
}

TEST(ParallelizeModuleApi, IndivisibleShapesFailBeforeAnyChange) {
  auto mlp = seeded<Mlp>(1, 8, 4 * tp_size() + 1);  // hidden does not divide
  auto before = params_of(*mlp);
  try {
    hp::parallelize_module(*mlp, tp_mesh(), {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
    FAIL();
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what();
    for (const char* word : {"linear1", "weight", "dim 0", "out_features"})
      EXPECT_NE(msg.find(word), std::string::npos) << word << " missing in: " << msg;
  }
  EXPECT_TRUE(same_params(before, params_of(*mlp)));
}

TEST(ParallelizeModuleApi, D1_GlobMatchesEveryLayer) {
  struct LayerImpl : hnn::ModuleBase<LayerImpl> {
    LayerImpl() {
      mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
      mlp->register_module("gate_proj", hnn::Linear(8, 2 * tp_size()));
      mlp->register_module("down_proj", hnn::Linear(2 * tp_size(), 8));
    }
    std::shared_ptr<torch::nn::Module> mlp;
  };
  struct ModelImpl : hnn::ModuleBase<ModelImpl> {
    ModelImpl() {
      layers = register_module("layers", hnn::ModuleList());
      for (int i = 0; i < 3; ++i) layers->push_back(std::make_shared<LayerImpl>());
    }
    hnn::ModuleList layers;
  } model;
  hp::parallelize_module(model, tp_mesh(), {{"layers.*.mlp.gate_proj", hp::ColwiseParallel()}, {"layers.[!1].mlp.down_?roj", hp::RowwiseParallel()}});
  auto params = model.named_parameters();
  for (int i = 0; i < 3; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".mlp.";
    EXPECT_EQ(hp::DTensor(params[p + "gate_proj.weight"]).placements(), hp::Placements{hp::Shard(0)}) << p;
    EXPECT_EQ(hp::is_dtensor(params[p + "down_proj.weight"]), i != 1) << p;
  }
}

TEST(ParallelizeModuleApi, D2_SingleStyleAppliesToTheRootWithSrcDataRank) {
  hnn::Linear l = seeded<hnn::Linear>(3, 6, 2 * tp_size());
  hnn::Linear ref = seeded<hnn::Linear>(3, 6, 2 * tp_size());
  auto style = std::make_shared<hp::ColwiseParallel>();
  hp::parallelize_module(*l, tp_mesh(), style, /*src_data_rank=*/c10::nullopt);
  EXPECT_EQ(style->src_data_rank, c10::nullopt);  // written into the given style
  EXPECT_EQ(hp::DTensor(l->weight()).placements(), hp::Placements{hp::Shard(0)});
  at::Tensor x = random({3, 6}, 4);
  at::Tensor y = hp::all_gather(l(x), -1, tp_mesh().get_group());
  EXPECT_TRUE(close(y, ref(x)));
}

TEST(DistributeModuleApi, WorksOnModulesNotHeldByASharedPtr) {
  hnn::LinearImpl l(4, 2 * tp_size());  // on the stack, as users may build a root module
  hp::parallelize_module(l, tp_mesh(), hp::ColwiseParallel());
  EXPECT_TRUE(hp::is_dtensor(l.weight()));
  EXPECT_TRUE(hp::distribute_module_applied(l));
}

// Ranks that disagree (another plan, other shapes or placements) get the agreement error on every
// rank, before anything changes, instead of a hang or a silent divergence.
TEST(ParallelizeModuleApi, DisagreeingRanksAreNamed) {
  auto tp = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  const bool odd = hp::get_rank() % 2 == 1;
  auto expect_disagreement = [](const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << "no agreement error";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("the ranks disagree: rank(s) [1"), std::string::npos) << e.what();
    }
  };
  auto model = seeded<Mlp>(60, 8, 4 * tp_size());
  expect_disagreement([&] {
    if (odd) hp::parallelize_module(*model, tp, {{"linear1", hp::RowwiseParallel()}});
    else hp::parallelize_module(*model, tp, {{"linear1", hp::ColwiseParallel()}});
  });
  EXPECT_FALSE(hp::is_dtensor(model->linear1->weight()));  // nothing changed
  // The same style with other layouts is another plan.
  expect_disagreement([&] {
    hp::parallelize_module(*model, tp, {{"linear1", hp::ColwiseParallel(odd ? hp::Placement(hp::Shard(0)) : hp::Replicate())}});
  });
  EXPECT_FALSE(hp::is_dtensor(model->linear1->weight()));
  auto other = seeded<Mlp>(60, 8, odd ? 8 * tp_size() : 4 * tp_size());
  expect_disagreement([&] { hp::parallelize_module(*other, tp, {{"linear1", hp::ColwiseParallel()}}); });
  expect_disagreement([&] { hp::distribute_tensor(at::ones({4, 4}), tp, {odd ? hp::Shard(1) : hp::Shard(0)}); });
  expect_disagreement([&] { hp::distribute_tensor(at::ones({4, odd ? 5 : 4}), tp, {hp::Shard(0)}); });
  // Agreement still lets the job go on.
  auto y = hp::distribute_tensor(at::ones({4, 4}), tp, {hp::Shard(0)});
  EXPECT_TRUE(at::equal(hp::DTensor(y).full_tensor(), at::ones({4, 4})));
}

// A language model whose output projection is its embedding's weight (tie_word_embeddings): one
// tensor registered in two modules.
class TiedLmImpl : public hnn::ModuleBase<TiedLmImpl> {
 public:
  TiedLmImpl(int64_t vocab, int64_t dim) {
    embed = register_module("embed", hnn::Embedding(vocab, dim));
    head = register_module("head", hnn::Linear(hnn::LinearOptions(dim, vocab).bias(false)));
    hnn::replace_parameter(*head, "weight", embed->parameter("weight"));
  }
  at::Tensor forward(const at::Tensor& ids) { return head(embed(ids)); }
  hnn::Embedding embed{nullptr};
  hnn::Linear head{nullptr};
};
HP_MODULE(TiedLm);

TEST(ParallelizeModuleApi, TiedParameterStaysOneParameterAndItsGradientEqualsOneProcess) {
  const int64_t vocab = 4 * tp_size(), dim = 2 * tp_size();
  auto model = seeded<TiedLm>(3, vocab, dim);
  auto ref = seeded<TiedLm>(3, vocab, dim);
  ASSERT_EQ(ref->head->weight().unsafeGetTensorImpl(), ref->embed->parameter("weight").unsafeGetTensorImpl());
  // transformers' plan for a tied Qwen3: the embedding on the vocabulary, the head on its output
  // features: both Shard(0) of the one [vocab, dim] tensor.
  hp::parallelize_module(*model, tp_mesh(), {{"embed", hp::RowwiseParallel().input_layouts(hp::Replicate())},
                                             {"head", hp::ColwiseParallel().output_layouts(hp::Replicate())}});
  const at::Tensor w = model->embed->parameter("weight");
  EXPECT_EQ(model->head->weight().unsafeGetTensorImpl(), w.unsafeGetTensorImpl());
  ASSERT_TRUE(hp::is_dtensor(w));
  EXPECT_EQ(hp::DTensor(w).placements(), hp::Placements{hp::Shard(0)});
  EXPECT_EQ(model->parameters().size(), ref->parameters().size());  // libtorch lists a tie once per owner

  const at::Tensor ids = at::tensor(std::vector<int64_t>{0, 3, vocab - 1, 2, 1, vocab / 2}, at::kLong).view({2, 3});
  const at::Tensor y = model(ids), y_ref = ref(ids);
  EXPECT_TRUE(close(full(y), y_ref));
  (full(y) * y_ref.detach()).sum().backward();
  (y_ref * y_ref.detach()).sum().backward();
  // Both uses' gradients land in the one parameter, as in one process.
  EXPECT_TRUE(close(full(w.grad()), ref->embed->parameter("weight").grad()));
}

TEST(ParallelizeModuleApi, TiedParameterWithDifferentLayoutsIsRefusedNamingBothOwnersAndLeavesTheModule) {
  const int64_t vocab = 4 * tp_size(), dim = 2 * tp_size();
  auto model = seeded<TiedLm>(3, vocab, dim);
  const auto before = params_of(*model);
  const auto expect_refused = [&](const hp::ParallelizePlan& plan, const std::string& layout) {
    try {
      hp::parallelize_module(*model, tp_mesh(), plan);
      FAIL() << "a tie laid out two ways was accepted";
    } catch (const c10::ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'embed.weight'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'head.weight'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(layout), std::string::npos) << msg;
    }
    EXPECT_EQ(model->head->weight().unsafeGetTensorImpl(), model->embed->parameter("weight").unsafeGetTensorImpl());
    EXPECT_TRUE(same_params(before, params_of(*model)));
    EXPECT_FALSE(model->embed->has_hooks());
    EXPECT_FALSE(model->head->has_hooks());
    EXPECT_FALSE(hp::distribute_module_applied(*model->embed));
  };
  // Rowwise on the head shards its weight on dim 1.
  expect_refused({{"embed", hp::RowwiseParallel().input_layouts(hp::Replicate())}, {"head", hp::RowwiseParallel()}}, "Shard(dim=1)");
  // The module is usable as it was: the right plan then applies.
  hp::parallelize_module(*model, tp_mesh(), {{"embed", hp::RowwiseParallel().input_layouts(hp::Replicate())},
                                             {"head", hp::ColwiseParallel().output_layouts(hp::Replicate())}});
  EXPECT_EQ(model->head->weight().unsafeGetTensorImpl(), model->embed->parameter("weight").unsafeGetTensorImpl());
}

}  // namespace t_dist_tensor_parallel_api_test
