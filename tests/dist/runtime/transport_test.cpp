// The collectives on whichever transport the group got (shared memory, Gloo, NCCL) and on the
// test device (HP_TEST_DEVICE): every value against a reference built from every rank's inputs in
// this process, the asynchronous handles, CommDebugMode's counts, staging and refusal.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/process_group.h>

#include <limits>

#include "../../common/test_device.h"

namespace hp = hyper_parallel;
using hp_test::test_device;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_runtime_transport_test {
namespace {

// Rank r's input: small integers (exact in every dtype, and their sums and averages over 2 or 4
// ranks too), different per rank.
at::Tensor input_of(int64_t r, at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor v = at::arange(n, at::kLong).mul(3).add(5 * r).remainder(17).sub(8).reshape(shape);
  if (dtype == at::kBool) return v.gt(0);
  if (!at::isFloatingType(dtype)) v = v.abs();  // also unsigned-safe
  return v.to(dtype);
}

// Every rank's inputs reduced in double (exact for these values), in the dtype asked for.
at::Tensor reference(int64_t g, at::IntArrayRef shape, at::ScalarType dtype, hp::ReduceOp op) {
  at::Tensor acc;
  for (int64_t r = 0; r < g; ++r) {
    at::Tensor x = input_of(r, shape, dtype).to(at::kDouble);
    if (!acc.defined()) acc = x;
    else if (op == hp::ReduceOp::MAX) acc = at::maximum(acc, x);
    else if (op == hp::ReduceOp::MIN) acc = at::minimum(acc, x);
    else acc = acc + x;
  }
  if (op == hp::ReduceOp::AVG) acc = acc / static_cast<double>(g);
  if (dtype == at::kBool) return acc.ne(0);
  return acc.to(dtype);
}

::testing::AssertionResult same(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.cpu();
  if (a.sizes() != expected.sizes()) return ::testing::AssertionFailure() << "shape " << a.sizes() << " != " << expected.sizes();
  if (a.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << a.scalar_type() << " != " << expected.scalar_type();
  if (at::equal(a.to(at::kDouble).nan_to_num(1e300), expected.to(at::kDouble).nan_to_num(1e300))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got\n" << a << "\nexpected\n" << expected;
}

// Group rank r's torch.chunk piece of `full` along dim 0 (possibly empty).
at::Tensor piece_of(const at::Tensor& full, int64_t g, int64_t r) {
  const int64_t n = full.size(0);
  return full.narrow(0, hp::chunk_offset(n, g, r), hp::chunk_size(n, g, r)).contiguous();
}

const std::vector<at::ScalarType> kDtypes{at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kLong, at::kInt, at::kByte, at::kBool};

}  // namespace

TEST(TransportDist, ReductionsMatchTheReference) {
  const hp::Group g = hp::world_group();
  for (at::ScalarType dtype : kDtypes) {
    for (hp::ReduceOp op : {hp::ReduceOp::SUM, hp::ReduceOp::AVG, hp::ReduceOp::MAX, hp::ReduceOp::MIN}) {
      if (op == hp::ReduceOp::AVG && !at::isFloatingType(dtype)) continue;
      const std::string what = c10::str(hp::reduce_op_name(op), " ", dtype, " on ", g.transport());
      at::Tensor x = input_of(g.rank(), {5, 3}, dtype).to(test_device());
      hp::all_reduce_(x, op, g);
      EXPECT_TRUE(same(x, reference(g.size(), {5, 3}, dtype, op))) << "all_reduce " << what;
      for (int64_t rows : {2 * g.size(), 2 * g.size() + 1}) {  // even and uneven pieces
        const at::Tensor piece = hp::reduce_scatter(input_of(g.rank(), {rows, 3}, dtype).to(test_device()), op, 0, g);
        const at::Tensor full = reference(g.size(), {rows, 3}, dtype, op);
        EXPECT_TRUE(same(piece, piece_of(full, g.size(), g.rank())))
            << "reduce_scatter rows " << rows << " " << what;
        EXPECT_EQ(piece.device(), test_device());
      }
    }
  }
}

TEST(TransportDist, MaxAndMinKeepANaN) {
  const hp::Group g = hp::world_group();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (hp::ReduceOp op : {hp::ReduceOp::MAX, hp::ReduceOp::MIN}) {
      at::Tensor x = input_of(g.rank(), {2 * g.size(), 2}, dtype);
      if (g.rank() == g.size() - 1) x[1][0] = std::numeric_limits<double>::quiet_NaN();
      at::Tensor expect = reference(g.size(), {2 * g.size(), 2}, dtype, op);
      expect[1][0] = std::numeric_limits<double>::quiet_NaN();
      at::Tensor y = x.to(test_device());
      hp::all_reduce_(y, op, g);
      EXPECT_TRUE(same(y, expect)) << hp::reduce_op_name(op) << " " << dtype << " on " << g.transport();
      EXPECT_TRUE(same(hp::reduce_scatter(x.to(test_device()), op, 0, g),
                       piece_of(expect, g.size(), g.rank())));
    }
  }
}

TEST(TransportDist, DataMovementMatchesTheReference) {
  const hp::Group g = hp::world_group();
  const int64_t n = g.size();
  for (at::ScalarType dtype : kDtypes) {
    // all_gather along dim 0 and 1, with uneven pieces (torch.chunk of 2n + 1 rows).
    for (int64_t dim : {0, 1}) {
      const int64_t full = 2 * n + 1;
      std::vector<int64_t> shape{3, 3};
      shape[static_cast<size_t>(dim)] = full;
      const at::Tensor whole = input_of(0, shape, dtype);
      const at::Tensor mine = piece_of(whole.transpose(0, dim), n, g.rank()).transpose(0, dim).contiguous().to(test_device());
      const at::Tensor got = hp::all_gather(mine, dim, g, full);
      EXPECT_TRUE(same(got, whole)) << "all_gather dim " << dim << " " << dtype;
      EXPECT_EQ(got.device(), test_device());
    }
    // all_to_all: rank r sends piece j of its rows to rank j; rank j concatenates along dim 1.
    {
      const at::Tensor local = input_of(g.rank(), {2 * n, 2}, dtype).to(test_device());
      std::vector<at::Tensor> pieces;
      for (int64_t r = 0; r < n; ++r) pieces.push_back(input_of(r, {2 * n, 2}, dtype).narrow(0, 2 * g.rank(), 2));
      EXPECT_TRUE(same(hp::all_to_all(local, 0, 1, g), at::cat(pieces, 1))) << "all_to_all " << dtype;
    }
    // broadcast and scatter from the last rank.
    const int64_t src = n - 1;
    at::Tensor b = (g.rank() == src ? input_of(src, {3, 2}, dtype) : at::zeros({3, 2}, dtype)).to(test_device());
    hp::broadcast_(b, src, g);
    EXPECT_TRUE(same(b, input_of(src, {3, 2}, dtype))) << "broadcast " << dtype;
    const at::Tensor full = input_of(src, {n + 1, 2}, dtype);
    const at::Tensor s = hp::scatter((g.rank() == src ? full : at::zeros({n + 1, 2}, dtype)).to(test_device()), 0, src, g);
    EXPECT_TRUE(same(s, piece_of(full, n, g.rank()))) << "scatter " << dtype;
  }
}

TEST(TransportDist, AsyncHandlesCompleteInAnyOrder) {
  const hp::Group g = hp::world_group();
  const int64_t n = g.size();
  at::Tensor summed = input_of(g.rank(), {4, 3}, at::kFloat).to(test_device());
  hp::Work ag = hp::all_gather_async(input_of(g.rank(), {2, 3}, at::kFloat).to(test_device()), 0, g);
  hp::Work rs = hp::reduce_scatter_async(input_of(g.rank(), {2 * n, 3}, at::kFloat).to(test_device()), hp::ReduceOp::SUM, 0, g);
  hp::Work ar = hp::all_reduce_async(summed, hp::ReduceOp::SUM, g);
  // Waited in the reverse order of issue.
  EXPECT_TRUE(same(ar.wait(), reference(n, {4, 3}, at::kFloat, hp::ReduceOp::SUM)));
  EXPECT_TRUE(same(summed, reference(n, {4, 3}, at::kFloat, hp::ReduceOp::SUM)));
  EXPECT_TRUE(same(rs.wait(), reference(n, {2 * n, 3}, at::kFloat, hp::ReduceOp::SUM).narrow(0, 2 * g.rank(), 2).contiguous()));
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < n; ++r) rows.push_back(input_of(r, {2, 3}, at::kFloat));
  EXPECT_TRUE(same(ag.wait(), at::cat(rows, 0)));
  EXPECT_TRUE(ag.is_completed());
  EXPECT_TRUE(same(ag.wait(), at::cat(rows, 0)));  // a second wait returns the same result
  // A handle dropped unwaited still completes its collective (the in-place result is there).
  at::Tensor dropped = input_of(g.rank(), {3}, at::kFloat).to(test_device());
  { hp::Work w = hp::all_reduce_async(dropped, hp::ReduceOp::MAX, g); }
  EXPECT_TRUE(same(dropped, reference(n, {3}, at::kFloat, hp::ReduceOp::MAX)));
}

// The same counts and bytes on every transport (emulations count as the collective asked for).
TEST(TransportDist, CommDebugModeCountsTheSameOnEveryTransport) {
  const hp::Group g = hp::world_group();
  const int64_t n = g.size();
  hp::CommDebugMode comm;
  at::Tensor bf = input_of(g.rank(), {4 * n}, at::kBFloat16).to(test_device());
  hp::all_reduce_(bf, hp::ReduceOp::AVG, g);                                                           // 8n bytes
  hp::reduce_scatter(input_of(g.rank(), {2 * n, 2}, at::kFloat).to(test_device()), hp::ReduceOp::MAX, 0, g);  // 16n
  hp::all_gather_async(input_of(g.rank(), {3}, at::kLong).to(test_device()), 0, g).wait();            // 24
  hp::control_all_gather(g, {1, 2, 3});  // not counted
  EXPECT_EQ(comm.get_total_counts(), 3) << comm.summary();
  EXPECT_EQ(comm.get_comm_bytes("all_reduce"), 8 * n);
  EXPECT_EQ(comm.get_comm_bytes("reduce_scatter"), 16 * n);
  EXPECT_EQ(comm.get_comm_bytes("all_gather"), 24);
}

TEST(TransportDist, ControlExchanges) {
  const hp::Group g = hp::world_group();
  const auto all = hp::control_all_gather(g, {g.rank(), 10 * g.rank()});
  ASSERT_EQ(static_cast<int64_t>(all.size()), g.size());
  for (int64_t r = 0; r < g.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], (std::vector<int64_t>{r, 10 * r}));
  const int64_t src = g.size() - 1;
  EXPECT_EQ(hp::control_broadcast(g, {g.rank() + 5}, src), (std::vector<int64_t>{src + 5}));
  EXPECT_EQ(hp::control_broadcast_string(g, g.rank() == src ? std::string("from the last rank") : std::string(3, 'x'), src),
            "from the last rank");
}

// A tensor the group's transport cannot move, whatever its device: an error naming the op and
// the device, on every rank (none of them enters the collective).
TEST(TransportDist, UnmovableTensorsAreRefused) {
  const hp::Group g = hp::world_group();
  at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  for (const char* op : {"all_reduce", "all_gather", "broadcast"}) {
    try {
      if (std::string(op) == "all_reduce") hp::all_reduce_(meta, hp::ReduceOp::SUM, g);
      else if (std::string(op) == "all_gather") hp::all_gather(meta, 0, g);
      else hp::broadcast_(meta, 0, g);
      ADD_FAILURE() << op << " of a meta tensor did not raise";
    } catch (const c10::ValueError& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find(op), std::string::npos) << msg;
      EXPECT_NE(msg.find("meta"), std::string::npos) << msg;
      EXPECT_NE(msg.find(g.transport()), std::string::npos) << msg;
    }
  }
  hp::barrier(g);  // every rank is still in step
}

}  // namespace t_dist_runtime_transport_test
