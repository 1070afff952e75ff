// Cases B1-B9: how each style lays out parameters, and where they come from.
#include "tp_models.h"

using namespace tp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_tensor_parallel_geometry_test {
namespace {
hp::DeviceMesh mesh() { return hp::init_device_mesh("cpu", {tp_size()}, {"tp"}); }
hp::DTensor dt(const at::Tensor& t) { return hp::DTensor(t); }
}  // namespace

TEST(StyleGeometry, B1_ColwiseLinear) {
  const int64_t n = tp_size();
  auto l = seeded<hnn::Linear>(1, 32, 16 * n);
  auto ref = seeded<hnn::Linear>(1, 32, 16 * n);
  hp::parallelize_module(*l, mesh(), hp::ColwiseParallel());
  EXPECT_EQ(dt(l->weight()).placements(), P{hp::Shard(0)});
  EXPECT_EQ(dt(l->weight()).to_local().sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(dt(l->bias()).placements(), P{hp::Shard(0)});
  EXPECT_EQ(dt(l->bias()).to_local().sizes(), (std::vector<int64_t>{16}));
  EXPECT_TRUE(at::equal(dt(l->weight()).to_local(), piece(ref->weight(), 0)));  // out rows [16r, 16r+16)
  EXPECT_EQ(l->weight().sizes(), ref->weight().sizes());  // global shape
  EXPECT_TRUE(l->weight().requires_grad());
}

TEST(StyleGeometry, B2_RowwiseLinear) {
  const int64_t n = tp_size();
  auto l = seeded<hnn::Linear>(1, 16 * n, 24);
  auto ref = seeded<hnn::Linear>(1, 16 * n, 24);
  hp::parallelize_module(*l, mesh(), hp::RowwiseParallel());
  EXPECT_EQ(dt(l->weight()).placements(), P{hp::Shard(1)});
  EXPECT_EQ(dt(l->weight()).to_local().sizes(), (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(dt(l->bias()).placements(), P{hp::Replicate()});
  EXPECT_EQ(dt(l->bias()).to_local().sizes(), (std::vector<int64_t>{24}));
  EXPECT_TRUE(at::equal(dt(l->weight()).to_local(), piece(ref->weight(), 1)));
  EXPECT_TRUE(at::equal(dt(l->bias()).to_local(), ref->bias()));
}

TEST(StyleGeometry, B3_ColwiseEmbedding) {
  const int64_t n = tp_size();
  auto e = seeded<hnn::Embedding>(1, 10, 4 * n);
  hp::parallelize_module(*e, mesh(), hp::ColwiseParallel());
  EXPECT_EQ(dt(e->weight()).placements(), P{hp::Shard(1)});
  EXPECT_EQ(dt(e->weight()).to_local().sizes(), (std::vector<int64_t>{10, 4}));
}

TEST(StyleGeometry, B4_RowwiseEmbedding) {
  const int64_t n = tp_size();
  auto e = seeded<hnn::Embedding>(1, 5 * n, 6);
  hp::RowwiseParallel style;
  EXPECT_EQ(style.desired_input_layouts(), hp::Shard(-1));
  hp::parallelize_module(*e, mesh(), style);
  EXPECT_EQ(dt(e->weight()).placements(), P{hp::Shard(0)});
  EXPECT_EQ(dt(e->weight()).to_local().sizes(), (std::vector<int64_t>{5, 6}));
  // apply() switched the (copied) style's desired input to Replicate for the Embedding.
  auto shared = std::make_shared<hp::RowwiseParallel>();
  auto e2 = seeded<hnn::Embedding>(1, 5 * n, 6);
  hp::parallelize_module(*e2, mesh(), shared);
  EXPECT_EQ(shared->desired_input_layouts(), hp::Replicate());
}

TEST(StyleGeometry, B5_SequenceParallelLayerNorm) {
  hnn::LayerNorm ln(std::vector<int64_t>{12});
  hp::parallelize_module(*ln, mesh(), hp::SequenceParallel());
  for (const auto& p : ln->named_parameters()) {
    EXPECT_EQ(dt(p.value()).placements(), P{hp::Replicate()}) << p.key();
    EXPECT_EQ(dt(p.value()).to_local().sizes(), (std::vector<int64_t>{12})) << p.key();
  }
}

TEST(StyleGeometry, B6_NoParallelLinear) {
  auto l = seeded<hnn::Linear>(1, 6, 5);
  hp::parallelize_module(*l, mesh(), hp::NoParallel());
  EXPECT_EQ(dt(l->weight()).placements(), P{hp::Replicate()});
  EXPECT_EQ(dt(l->bias()).placements(), P{hp::Replicate()});
  EXPECT_EQ(dt(l->weight()).to_local().sizes(), (std::vector<int64_t>{5, 6}));
}

TEST(StyleGeometry, B7_SrcDataRankZeroScattersRankZerosWeights) {
  const int64_t n = tp_size();
  auto ref = seeded<Mlp>(7, 8, 4 * n);
  auto m = seeded<Mlp>(7, 8, 4 * n);
  if (rank() != 0) {  // only rank 0 holds the real weights
    at::NoGradGuard g;
    for (auto& p : m->parameters()) p.zero_();
  }
  auto tp = mesh();  // mesh creation itself broadcasts a seed
  hp::CommDebugMode comm;
  hp::parallelize_module(*m, tp, {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}}, 0);
  EXPECT_GT(comm.get_comm_count("scatter") + comm.get_comm_count("broadcast"), 0);
  EXPECT_TRUE(at::equal(dt(m->linear1->weight()).to_local(), piece(ref->linear1->weight(), 0)));
  EXPECT_TRUE(at::equal(dt(m->linear2->weight()).to_local(), piece(ref->linear2->weight(), 1)));
  EXPECT_TRUE(at::equal(dt(m->linear2->bias()).to_local(), ref->linear2->bias()));
}

TEST(StyleGeometry, B8_SrcDataRankNoneSlicesLocally) {
  const int64_t n = tp_size();
  auto ref = seeded<Mlp>(7, 8, 4 * n);
  auto m = seeded<Mlp>(7, 8, 4 * n);
  auto tp = mesh();  // mesh creation itself broadcasts a seed
  hp::CommDebugMode comm;
  hp::parallelize_module(*m, tp, {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}}, c10::nullopt);
  EXPECT_EQ(comm.get_total_counts(), 0);  // no scatter / broadcast
  EXPECT_TRUE(at::equal(dt(m->linear1->weight()).to_local(), piece(ref->linear1->weight(), 0)));
  EXPECT_TRUE(at::equal(dt(m->linear2->weight()).to_local(), piece(ref->linear2->weight(), 1)));
}

TEST(StyleGeometry, B9_MetaParametersNeverCommunicate) {
  const int64_t n = tp_size();
  auto m = seeded<Mlp>(7, 8, 4 * n);
  // Meta parameters (as a deferred-init model has); Module::to(kMeta) cannot set_data across
  // device types in libtorch 1.13.
  for (const auto& sub : m->named_modules())
    for (const auto& p : sub.value()->named_parameters(false))
      hnn::replace_parameter(*sub.value(), p.key(), at::empty(p.value().sizes(), at::TensorOptions().device(at::kMeta)));
  auto tp = mesh();  // mesh creation itself broadcasts a seed
  hp::CommDebugMode comm;
  hp::parallelize_module(*m, tp, {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}}, 0);
  EXPECT_EQ(comm.get_total_counts(), 0);
  EXPECT_TRUE(dt(m->linear1->weight()).to_local().is_meta());
  EXPECT_EQ(dt(m->linear1->weight()).to_local().sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(dt(m->linear2->weight()).to_local().sizes(), (std::vector<int64_t>{8, 4}));
}

}  // namespace t_dist_tensor_parallel_geometry_test
