// Point-to-point transfers against what the sender holds: every dtype, sizes from empty to larger
// than the shared-memory buffers, tags matched out of order, both directions in one batch,
// non-contiguous receive buffers, bad arguments refused before anything moves, CommDebugMode's
// counts, and (PointToPointFault, its own job) a peer that exits named on the waiting rank.
#include <gtest/gtest.h>

#include <hyper_parallel/hyper_parallel.h>

#include "../../common/test_util.h"

#include <cstdlib>

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_runtime_point_to_point_test {
namespace {

// What rank `from` sends: values that depend on the sender, the dtype and the size.
at::Tensor payload(int64_t from, at::ScalarType dtype, int64_t n) {
  at::Tensor t = at::arange(n, at::kDouble).mul(0.5).add(static_cast<double>(100 * from)).remainder(251.0);
  if (dtype == at::kBool) return t.to(at::kLong).remainder(2).to(at::kBool);
  return t.to(dtype);
}

}  // namespace

TEST(PointToPointDist, EveryDtypeAndSizeArrivesIntactAroundARing) {
  const hp::Group world = hp::world_group();
  const int64_t g = world.size(), r = world.rank();
  const int64_t next = (r + 1) % g, prev = (r + g - 1) % g;
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt, at::kByte, at::kBool}) {
    for (int64_t n : {0, 1, 7, 1000, 300000}) {
      SCOPED_TRACE(c10::str(dtype, " n=", n));
      at::Tensor got = at::empty({n}, at::TensorOptions().dtype(dtype));
      auto works = hp::batch_isend_irecv({hp::P2POp::isend(payload(r, dtype, n), next, world, 5),
                                          hp::P2POp::irecv(got, prev, world, 5)});
      works[1].wait();
      works[0].wait();
      EXPECT_TRUE(at::equal(got, payload(prev, dtype, n)));
    }
  }
}

TEST(PointToPointDist, TagsMatchWhateverTheOrderOfPostsAndWaits) {
  const hp::Group world = hp::world_group();
  const int64_t r = world.rank();
  if (r > 1) return;  // ranks 0 and 1 only; the others have nothing to do
  if (r == 0) {
    std::vector<hp::Work> sends;
    for (int64_t tag : {3, 1, 2}) sends.push_back(hp::isend(at::full({4, 3}, static_cast<double>(tag), at::kDouble), 1, world, tag));
    for (auto it = sends.rbegin(); it != sends.rend(); ++it) it->wait();
  } else {
    std::vector<at::Tensor> bufs;
    std::vector<hp::Work> recvs;
    for (int64_t tag : {1, 2, 3}) {
      bufs.push_back(at::zeros({4, 3}, at::kDouble));
      recvs.push_back(hp::irecv(bufs.back(), 0, world, tag));
    }
    for (size_t i : {size_t{2}, size_t{0}, size_t{1}}) {
      const at::Tensor t = recvs[i].wait();
      EXPECT_TRUE(at::equal(t, at::full({4, 3}, static_cast<double>(i + 1), at::kDouble))) << "tag " << i + 1;
    }
  }
}

TEST(PointToPointDist, PairsExchangeBothWaysInOneBatchIntoNonContiguousBuffers) {
  const hp::Group world = hp::world_group();
  const int64_t g = world.size(), r = world.rank();
  if (g % 2 != 0) GTEST_SKIP() << "pairs";
  const int64_t peer = r ^ 1;
  const at::Tensor mine = hp_test::values({6, 5}, 10 + r);
  at::Tensor backing = at::zeros({5, 6});
  at::Tensor into = backing.t();  // [6, 5], not contiguous
  hp::CommDebugMode comm;
  auto works = hp::batch_isend_irecv({hp::P2POp::irecv(into, peer, world), hp::P2POp::isend(mine.t().contiguous().t(), peer, world)});
  for (auto& w : works) w.wait();
  EXPECT_TRUE(at::equal(into, hp_test::values({6, 5}, 10 + peer)));
  EXPECT_TRUE(at::equal(backing.t(), into));
  EXPECT_EQ(comm.get_comm_count("send"), 1);
  EXPECT_EQ(comm.get_comm_count("recv"), 1);
  EXPECT_EQ(comm.get_comm_bytes("send"), 6 * 5 * 4);
  // Blocking calls, in an order that cannot deadlock: the lower rank sends first.
  at::Tensor back = at::empty({3}, at::kLong);
  if (r < peer) {
    hp::send(at::arange(3, at::kLong).add(r), peer, world, 9);
    hp::recv(back, peer, world, 9);
  } else {
    hp::recv(back, peer, world, 9);
    hp::send(at::arange(3, at::kLong).add(r), peer, world, 9);
  }
  EXPECT_TRUE(at::equal(back, at::arange(3, at::kLong).add(peer)));
}

TEST(PointToPointDist, BadArgumentsAreRefusedBeforeAnythingMoves) {
  const hp::Group world = hp::world_group();
  const int64_t g = world.size(), r = world.rank();
  const at::Tensor t = at::zeros({2});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { hp::isend(t, g, world); }).find("hyper_parallel::send: peer " + std::to_string(g) + " is not a rank"),
            std::string::npos);
  EXPECT_NE(message([&] { hp::irecv(t, r, world); }).find("is this rank itself"), std::string::npos);
  EXPECT_NE(message([&] { hp::isend(t, (r + 1) % g, world, -1); }).find("tag must be in [0, 2^31)"), std::string::npos);
  EXPECT_NE(message([&] { hp::batch_isend_irecv({}); }).find("the list of operations is empty"), std::string::npos);
  // The world is usable afterwards: nothing was left half-issued.
  at::Tensor sum = at::ones({1});
  hp::all_reduce_(sum, hp::ReduceOp::SUM, world);
  EXPECT_EQ(sum.item<double>(), static_cast<double>(g));
}

// Its own job (HP_TEST_P2P_FAULT=1, 2 ranks): rank 1 exits without sending; rank 0's recv raises
// within the timeout, naming rank 1, and rank 0 stays usable for local work.
TEST(PointToPointFault, PeerThatExitsIsNamedOnTheWaitingRank) {
  const char* on = std::getenv("HP_TEST_P2P_FAULT");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "runs in its own job (HP_TEST_P2P_FAULT=1)";
  const hp::Group world = hp::world_group();
  ASSERT_EQ(world.size(), 2);
  if (world.rank() == 1) {
    std::fflush(stdout);
    std::_Exit(0);
  }
  at::Tensor buf = at::zeros({16});
  try {
    hp::recv(buf, 1, world, 4);
    FAIL() << "recv from a rank that exited returned";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_NE(m.find("hyper_parallel::recv: receiving from rank 1 (tag 4)"), std::string::npos) << m;
    std::printf("rank 0 named the peer: %s\n", m.substr(0, 200).c_str());
  }
}

}  // namespace t_dist_runtime_point_to_point_test
