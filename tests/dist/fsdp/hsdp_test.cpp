// HSDP: fully_shard on a 2-D (replicate, shard) data-parallel mesh, and on dp_replicate x
// dp_shard x tp, trained with gradient accumulation against one process (PyTorch's
// test_train_parity_hsdp: MLP widths 3, 16 and 17, uneven pieces included).
#include <gtest/gtest.h>

#include <torch/optim.h>

#include "../nn/training_util.h"
#include "../tensor_parallel/tp_models.h"

using namespace training_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_fsdp_hsdp_test {
namespace {

constexpr int kSteps = 5, kMicro = 3;

// Microbatch m of step s: 8 rows of width `dim`, the same on every rank.
at::Tensor micro(int64_t dim, int s, int m, int salt) { return hp_test::random({8, dim}, static_cast<uint64_t>(1000 * salt + 10 * s + m)); }

// Trains `model` (sharded: each data-parallel rank takes its rows of every microbatch) and `ref`
// (one process, every row) for kSteps steps of kMicro microbatches, comparing the parameters
// after every step. With `sync_last_only`, only the last microbatch reduces gradients.
void train_and_compare(tp_test::Mlp& model, tp_test::Mlp& ref, int64_t dim, int64_t dp_rank, int64_t dp, bool sync_last_only) {
  torch::optim::AdamW opt(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW ref_opt(hp::unique_parameters(*ref), torch::optim::AdamWOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    ref_opt.zero_grad();
    for (int m = 0; m < kMicro; ++m) {
      if (sync_last_only) hp::set_requires_gradient_sync(*model, m + 1 == kMicro);
      const at::Tensor x = micro(dim, s, m, 1), t = micro(dim, s, m, 2);
      ((model(dp_rows(x, dp_rank, dp)) - dp_rows(t, dp_rank, dp)).pow(2).mean() / kMicro).backward();
      ((ref(x) - t).pow(2).mean() / kMicro).backward();
    }
    opt.step();
    ref_opt.step();
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << "step " << s;
    auto ref_params = ref->named_parameters();
    for (const auto& p : model->named_parameters())
      EXPECT_TRUE(hp_test::close(whole(p.value()), ref_params[p.key()], 1e-4, 1e-5)) << p.key() << " after step " << s;
  }
}

}  // namespace

TEST(HsdpDist, ReplicateTimesShardMeshMatchesOneProcess) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp_replicate", "dp_shard"});
  for (const int64_t dim : {3, 16, 17}) {
    for (const bool sync_last_only : {false, true}) {
      SCOPED_TRACE("mlp width " + std::to_string(dim) + (sync_last_only ? ", sync on the last microbatch only" : ""));
      auto model = tp_test::seeded<tp_test::Mlp>(5, dim, 2 * dim + 1);
      auto ref = tp_test::seeded<tp_test::Mlp>(5, dim, 2 * dim + 1);
      hp::fully_shard(*model->linear1, mesh);
      hp::fully_shard(*model->linear2, mesh);
      hp::fully_shard(*model, mesh);
      // Sharded over dp_shard, replicated over dp_replicate.
      EXPECT_EQ(hp::DTensor(model->linear1->weight()).placements(), (hp::Placements{hp::Replicate(), hp::Shard(0)}));
      const int64_t dp_rank = mesh.get_local_rank(0) * 2 + mesh.get_local_rank(1);
      hp::CommDebugMode comm;
      train_and_compare(model, ref, dim, dp_rank, 4, sync_last_only);
      // Per step and group: one reduce-scatter over dp_shard and one all-reduce over
      // dp_replicate per synchronised microbatch.
      const auto stats = comm.get_comm_group_stats();
      const int64_t reductions = 2 * kSteps * (sync_last_only ? 1 : kMicro);
      EXPECT_EQ(stats.at(mesh.get_group(1).ranks()).at("backward").at("reduce_scatter").count, reductions);
      EXPECT_EQ(stats.at(mesh.get_group(0).ranks()).at("backward").at("all_reduce").count, reductions);
    }
  }
}

// The 3-D mesh of the demo: dp_replicate x dp_shard x tp = 2 x 2 x 2, TP inside, HSDP outside.
TEST(HsdpDist, ReplicateShardTensorParallelMeshMatchesOneProcess) {
  ASSERT_EQ(hp::get_world_size(), 8);
  auto mesh = hp::init_device_mesh("cpu", {2, 2, 2}, {"dp_replicate", "dp_shard", "tp"});
  const hp::DeviceMesh dp = mesh[{"dp_replicate", "dp_shard"}];
  EXPECT_EQ(dp.ndim(), 2);
  EXPECT_EQ(dp.dims_in_root(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(dp.size(), 4);
  const int64_t dim = 16;
  for (const bool sync_last_only : {false, true}) {
    SCOPED_TRACE(sync_last_only ? "sync on the last microbatch only" : "sync every microbatch");
    auto model = tp_test::seeded<tp_test::Mlp>(6, dim, 2 * dim);
    auto ref = tp_test::seeded<tp_test::Mlp>(6, dim, 2 * dim);
    hp::parallelize_module(*model, mesh["tp"], {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
    hp::fully_shard(*model->linear1, dp);
    hp::fully_shard(*model->linear2, dp);
    hp::fully_shard(*model, dp);
    EXPECT_EQ(hp::DTensor(model->linear1->weight()).placements(), (hp::Placements{hp::Replicate(), hp::Shard(1), hp::Shard(0)}));
    train_and_compare(model, ref, dim, dp.get_local_rank(0) * 2 + dp.get_local_rank(1), 4, sync_last_only);
  }
}

TEST(HsdpDist, RefusesAThreeDimensionalDataParallelMesh) {
  ASSERT_EQ(hp::get_world_size(), 8);
  auto mesh = hp::init_device_mesh("cpu", {2, 2, 2}, {"a", "b", "c"});
  auto model = tp_test::seeded<tp_test::Mlp>(6, 4, 4);
  EXPECT_THROW(hp::fully_shard(*model, mesh), c10::ValueError);
  EXPECT_FALSE(hp::is_dtensor(model->linear1->weight()));
  EXPECT_THROW(hp::set_requires_gradient_sync(*model, false), c10::ValueError);
  EXPECT_THROW((mesh[{"c", "a"}]), c10::ValueError);
}

}  // namespace t_dist_fsdp_hsdp_test
