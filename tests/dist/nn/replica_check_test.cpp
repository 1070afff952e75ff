// find_replica_mismatches / check_replicas_equal against replicas made to differ on purpose: a
// plain parameter on one rank, one Replicate coordinate of a [dp, tp] DTensor, and Shard pieces
// (which differ by design and must not be reported). Every rank gets the same verdict.
#include <gtest/gtest.h>

#include <hyper_parallel/hyper_parallel.h>

#include "../../common/error_message.h"
#include "../../common/test_util.h"

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_nn_replica_check_test {
namespace {

struct TwoLinearsImpl : hnn::ModuleBase<TwoLinearsImpl> {
  TwoLinearsImpl() {
    a = register_module("a", hnn::Linear(8, 4));
    b = register_module("b", hnn::Linear(4, 8));
  }
  hnn::Linear a{nullptr}, b{nullptr};
};
HP_MODULE(TwoLinears);

}  // namespace

TEST(ReplicaCheckDist, PlainReplicaThatDiffersOnOneRankIsNamedOnEveryRank) {
  const int64_t ws = hp::get_world_size();
  if (ws < 2) GTEST_SKIP() << "needs ranks";
  hp_test::manual_seed(5);
  TwoLinears m;
  EXPECT_TRUE(hp::find_replica_mismatches(*m, hp::world_group()).empty()) << "identical seeds give identical replicas";
  if (hp::get_rank() == ws - 1) {
    at::NoGradGuard g;
    // One ulp of one element: bitwise, not approximately.
    at::Tensor w = m->b->named_parameters()["bias"];
    w[3] = std::nextafter(w[3].item<float>(), 1e9f);
  }
  const auto found = hp::find_replica_mismatches(*m, hp::world_group());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "b.bias");
  EXPECT_EQ(found[0].rank, 0);
  EXPECT_EQ(found[0].other_rank, ws - 1);
  EXPECT_EQ(found[0].sizes, std::vector<int64_t>{8});
  const std::string message = hp_test::error_message([&] { hp::check_replicas_equal(*m, hp::world_group()); });
  EXPECT_NE(message.find("hyper_parallel::check_replicas_equal: 1 parameter replica(s) are not bitwise equal"), std::string::npos) << message;
  EXPECT_NE(message.find("'b.bias' at offset [0] sizes [8] differs between ranks 0 and " + std::to_string(ws - 1)), std::string::npos) << message;
}

TEST(ReplicaCheckDist, DTensorReplicasAreComparedOverTheirReplicateDimOnlyAndShardsNever) {
  if (hp::get_world_size() != 4) GTEST_SKIP() << "a 2 x 2 mesh";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  hp_test::manual_seed(7);
  TwoLinears m;
  // a: Shard(0) over tp, replicated over dp; b: replicated over both.
  hp::parallelize_module(*m, mesh["tp"], {{"a", hp::ColwiseParallel()}});
  EXPECT_TRUE(hp::find_replica_mismatches(*m, hp::world_group()).empty());
  {
    at::NoGradGuard g;
    // Each tp rank's shard of a.weight is its own (different values by design); change dp
    // coordinate 1's copy of tp coordinate 0's shard.
    if (mesh.get_local_rank(0) == 1 && mesh.get_local_rank(1) == 0) hp::DTensor(m->a->named_parameters()["weight"]).to_local().add_(1.0);
  }
  const auto found = hp::find_replica_mismatches(*m, hp::world_group());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "a.weight");
  EXPECT_EQ(found[0].offset, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(found[0].sizes, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(found[0].rank, 0);        // dp 0, tp 0
  EXPECT_EQ(found[0].other_rank, 2);  // dp 1, tp 0
}

}  // namespace t_dist_nn_replica_check_test
