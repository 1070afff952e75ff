// The rank-independent parts of context parallelism: PyTorch's test_is_causal_behavior table for
// ring attention's blocks, and the head-tail permutation (and its inverse).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <hyper_parallel/context_parallel/context_parallel.h>

namespace hp = hyper_parallel;
using B = hp::CausalBehavior;

TEST(ContextParallelRing, IsCausalBehaviorTableMatchesPyTorchs) {
  EXPECT_EQ(hp::is_causal_behavior(0, 4, 0, false, false), B::not_is_causal);
  // Without load balancing: block 0 is the diagonal, a block from an earlier rank is whole, one
  // from a later rank is skipped.
  const std::vector<std::vector<B>> plain{{B::is_causal, B::skip}, {B::is_causal, B::not_is_causal}};
  for (int64_t rank = 0; rank < 2; ++rank)
    for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(hp::is_causal_behavior(rank, 2, i, true, false), plain[rank][i]) << rank << " " << i;
  // With load balancing no block is skipped.
  const std::vector<std::vector<B>> balanced{{B::is_causal, B::not_is_causal}, {B::is_causal, B::not_is_causal}};
  for (int64_t rank = 0; rank < 2; ++rank)
    for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(hp::is_causal_behavior(rank, 2, i, true, true), balanced[rank][i]) << rank << " " << i;
  // At 4 ranks, rank 2: blocks from ranks 2 (diagonal), 1, 0 (earlier: whole), 3 (later: skipped).
  const std::vector<B> rank2{B::is_causal, B::not_is_causal, B::not_is_causal, B::skip};
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(hp::is_causal_behavior(2, 4, i, true, false), rank2[i]) << i;
}

TEST(ContextParallelLoadBalance, HeadTailIndicesPairChunkRWithTwoCpMinusOneMinusR) {
  EXPECT_TRUE(at::equal(hp::head_tail_indices(8, 2), at::tensor(std::vector<int64_t>{0, 1, 6, 7, 2, 3, 4, 5})));
  EXPECT_TRUE(at::equal(hp::head_tail_indices(8, 4), at::tensor(std::vector<int64_t>{0, 7, 1, 6, 2, 5, 3, 4})));
  for (int64_t cp : {1, 2, 3, 4, 8})
    for (int64_t chunk : {1, 3}) {
      const int64_t seq = 2 * cp * chunk;
      const at::Tensor idx = hp::head_tail_indices(seq, cp), restore = hp::head_tail_indices(seq, cp, true);
      for (int64_t r = 0; r < cp; ++r) {
        const at::Tensor mine = idx.narrow(0, 2 * r * chunk, 2 * chunk);
        EXPECT_TRUE(at::equal(mine.narrow(0, 0, chunk), at::arange(r * chunk, (r + 1) * chunk, at::kLong)));
        EXPECT_TRUE(at::equal(mine.narrow(0, chunk, chunk), at::arange((2 * cp - 1 - r) * chunk, (2 * cp - r) * chunk, at::kLong)));
      }
      EXPECT_TRUE(at::equal(idx.index_select(0, restore), at::arange(seq, at::kLong)));
    }
  EXPECT_THROW(hp::head_tail_indices(6, 2), c10::ValueError);
}
