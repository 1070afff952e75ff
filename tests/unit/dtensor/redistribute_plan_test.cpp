// Placements and redistribution planning: pure functions, no process group.
#include <gtest/gtest.h>

#include <hyper_parallel/dtensor/dtensor_spec.h>
#include <hyper_parallel/dtensor/redistribute_plan.h>
#include <hyper_parallel/runtime/errors.h>

namespace hp = hyper_parallel;
using Kind = hp::RedistributeStep::Kind;

TEST(Placement, PrintsEqualsHashesAndNormalises) {
  EXPECT_EQ(hp::Shard(0).to_string(), "Shard(dim=0)");
  EXPECT_EQ(hp::Replicate().to_string(), "Replicate()");
  EXPECT_EQ(hp::Partial().to_string(), "Partial(sum)");
  EXPECT_EQ(hp::Partial(hp::ReduceOp::MAX).to_string(), "Partial(max)");
  EXPECT_EQ(hp::to_string({hp::Shard(1)}), "(Shard(dim=1),)");
  EXPECT_EQ(hp::Shard(1), hp::Shard(1));
  EXPECT_NE(hp::Shard(1), hp::Shard(0));
  EXPECT_NE(hp::Partial(), hp::Partial(hp::ReduceOp::AVG));
  EXPECT_NE(hp::Partial(), hp::Replicate());
  EXPECT_EQ(std::hash<hp::Placement>()(hp::Shard(2)), std::hash<hp::Placement>()(hp::Shard(2)));
  EXPECT_NE(std::hash<hp::Placement>()(hp::Shard(2)), std::hash<hp::Placement>()(hp::Shard(1)));
  EXPECT_EQ(hp::Shard(-1).normalized(3), hp::Shard(2));
  EXPECT_THROW(hp::Shard(3).normalized(3), c10::IndexError);
}

TEST(LocalShape, FollowsTorchChunkAndNestsMeshDims) {
  auto [shape, offset] = hp::compute_local_shape_and_offset({7, 4}, {4}, {3}, {hp::Shard(0)});
  EXPECT_EQ(shape, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(offset, (std::vector<int64_t>{6, 0}));
  // Shard(0) on both mesh dims of 2x2: the second splits the first's piece.
  std::tie(shape, offset) = hp::compute_local_shape_and_offset({8, 2}, {2, 2}, {1, 1}, {hp::Shard(0), hp::Shard(0)});
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(offset, (std::vector<int64_t>{6, 0}));
}

TEST(RedistributePlan, OneCollectivePerSimpleTransition) {
  auto one = [](hp::Placements a, hp::Placements b) { return hp::plan_redistribute({2}, a, b, 2); };
  EXPECT_EQ(one({hp::Shard(0)}, {hp::Replicate()}).at(0).kind, Kind::AllGather);
  EXPECT_EQ(one({hp::Partial()}, {hp::Replicate()}).at(0).kind, Kind::AllReduce);
  EXPECT_EQ(one({hp::Partial()}, {hp::Shard(1)}).at(0).kind, Kind::ReduceScatter);
  EXPECT_EQ(one({hp::Shard(0)}, {hp::Shard(1)}).at(0).kind, Kind::AllToAll);
  EXPECT_EQ(one({hp::Replicate()}, {hp::Shard(0)}).at(0).kind, Kind::Chunk);
  EXPECT_EQ(one({hp::Replicate()}, {hp::Partial()}).at(0).kind, Kind::ToPartial);
  EXPECT_TRUE(one({hp::Shard(1)}, {hp::Shard(1)}).empty());
  for (const auto& plan : {one({hp::Shard(0)}, {hp::Replicate()}), one({hp::Partial()}, {hp::Shard(1)})})
    EXPECT_EQ(plan.size(), 1u);
  // Shard -> Partial goes through Replicate.
  auto sp = one({hp::Shard(0)}, {hp::Partial()});
  ASSERT_EQ(sp.size(), 2u);
  EXPECT_EQ(sp[0].kind, Kind::AllGather);
  EXPECT_EQ(sp[1].kind, Kind::ToPartial);
  EXPECT_THROW(one({hp::Partial()}, {hp::Partial(hp::ReduceOp::MAX)}), c10::ValueError);
}

TEST(RedistributePlan, NestedShardsUnshardInnerFirst) {
  // [Shard(0), Shard(0)] -> [Replicate(), Shard(0)]: mesh dim 0's change disturbs mesh dim 1's
  // nested piece, so dim 1 is gathered first and re-chunked after.
  auto plan = hp::plan_redistribute({2, 2}, {hp::Shard(0), hp::Shard(0)}, {hp::Replicate(), hp::Shard(0)}, 2);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].kind, Kind::AllGather);
  EXPECT_EQ(plan[0].mesh_dim, 1);
  EXPECT_EQ(plan[1].kind, Kind::AllGather);
  EXPECT_EQ(plan[1].mesh_dim, 0);
  EXPECT_EQ(plan[2].kind, Kind::Chunk);
  EXPECT_EQ(plan[2].mesh_dim, 1);
  EXPECT_EQ(plan.back().after, (hp::Placements{hp::Replicate(), hp::Shard(0)}));
  // Independent dims need one step each.
  auto indep = hp::plan_redistribute({2, 2}, {hp::Shard(0), hp::Partial()}, {hp::Shard(0), hp::Replicate()}, 2);
  ASSERT_EQ(indep.size(), 1u);
  EXPECT_EQ(indep[0].kind, Kind::AllReduce);
  EXPECT_EQ(indep[0].mesh_dim, 1);
}

TEST(RedistributePlan, RejectsBadInput) {
  EXPECT_THROW(hp::plan_redistribute({2}, {hp::Shard(0)}, {hp::Shard(0), hp::Shard(1)}, 2), c10::ValueError);
  EXPECT_THROW(hp::plan_redistribute({2}, {hp::Shard(2)}, {hp::Replicate()}, 2), c10::ValueError);
}
