// Views whose local data is a copy (making them needed communication) are never read stale: after
// an in-place write into their base, reading them raises on every rank, naming the op that read
// and the op that made the view. Plain views follow their base; such a copy cannot, and PyTorch's
// DTensor returns the old values silently.
#include <c10/core/InferenceMode.h>

#include "../../common/test_util.h"

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_stale_view_test {
namespace {

int64_t ws() { return hp::get_world_size(); }

// x [4 * ws, 3] sharded on rows: rows 1 and 2 all lie on rank 0, so the narrow gathers.
hp::DTensor sharded_rows() { return hp::distribute_tensor(values({4 * ws(), 3}), world_mesh(), {hp::Shard(0)}); }

// Runs `read` and expects the stale-view error, naming `reader` and the slice that made the view (narrow is one).
void expect_stale(const std::function<void()>& read, const std::string& reader) {
  try {
    read();
    ADD_FAILURE() << reader << " read a stale copy-view without an error";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_EQ(m.rfind(reader, 0), 0u) << m;
    EXPECT_NE(m.find("aten::slice"), std::string::npos) << m;  // narrow is a slice
    EXPECT_NE(m.find("written in place"), std::string::npos) << m;
  }
}

}  // namespace

// The probe: v = x.narrow(0, 1, 2) of a Shard(0) x, then x.mul_(2).
TEST(StaleViewDist, ReadingACopyViewAfterItsBaseWasWrittenRaises) {
  if (ws() < 2) GTEST_SKIP() << "one rank holds every row: no view needs communication";
  hp::DTensor x = sharded_rows();
  const at::Tensor plain = values({4 * ws(), 3});
  hp::DTensor v(x.narrow(0, 1, 2));
  ASSERT_TRUE(v.is_copy_view());
  EXPECT_TRUE(close(v + 1, plain.narrow(0, 1, 2) + 1)) << "a fresh copy-view reads its values";
  hp::DTensor w(v.view({-1}));  // a view of the copy follows the same source
  x.mul_(2);
  expect_stale([&] { (void)(v + 1); }, "hyper_parallel::dispatch: aten::add.Scalar reads argument 'self' (f32[2,3] R)");
  expect_stale([&] { (void)v.sum(); }, "hyper_parallel::dispatch: aten::sum");
  expect_stale([&] { (void)v.full_tensor(); }, "hyper_parallel::DTensor::redistribute");
  expect_stale([&] { (void)v.to_local(); }, "hyper_parallel::DTensor::to_local");
  expect_stale([&] { (void)(w * 2); }, "hyper_parallel::dispatch: aten::mul");
  // Made again after the write, the view has the new values.
  EXPECT_TRUE(close(x.narrow(0, 1, 2), plain.narrow(0, 1, 2) * 2));
}

TEST(StaleViewDist, WritesThroughOtherViewsOfTheBaseCount) {
  if (ws() < 2) GTEST_SKIP() << "one rank holds every row";
  hp::DTensor x = sharded_rows();
  hp::DTensor v(x.narrow(0, 1, 2));
  x.select(1, 0).fill_(7);  // a view of x that needs no communication, written in place
  expect_stale([&] { (void)v.clone(); }, "hyper_parallel::dispatch: aten::clone");
  hp::DTensor u(x.narrow(0, 1, 2));
  x.view({-1}).add_(1);
  expect_stale([&] { (void)u.clone(); }, "hyper_parallel::dispatch: aten::clone");
}

TEST(StaleViewDist, CopyViewsStayReadableWhileTheirBaseIsOnlyRead) {
  if (ws() < 2) GTEST_SKIP() << "one rank holds every row";
  hp::DTensor x = sharded_rows();
  const at::Tensor plain = values({4 * ws(), 3});
  hp::DTensor v(x.narrow(0, 1, 2));
  at::Tensor y = x * 3;  // reads x; writes into another tensor do not touch x
  y.add_(1);
  hp::DTensor other = sharded_rows();
  other.mul_(5);
  EXPECT_TRUE(close(v * 1, plain.narrow(0, 1, 2)));
  // A copy-view outlives its base: nothing can write the base any more.
  x = hp::DTensor();
  EXPECT_TRUE(close(v * 1, plain.narrow(0, 1, 2)));
}

TEST(StaleViewDist, AutogradAndInferenceModeAreWatchedToo) {
  if (ws() < 2) GTEST_SKIP() << "one rank holds every row";
  hp::DTensor leaf = sharded_rows();
  leaf.set_requires_grad(true);
  at::Tensor a = leaf * 1;
  hp::DTensor v(a.narrow(0, 1, 2));
  a.mul_(2);
  expect_stale([&] { (void)v.sum(); }, "hyper_parallel::dispatch: aten::sum");
  // Inference tensors have no version counter; the watch does not need one.
  c10::InferenceMode guard;
  hp::DTensor x = sharded_rows();
  hp::DTensor u(x.narrow(0, 1, 2));
  x.add_(1);
  expect_stale([&] { (void)(u + 1); }, "hyper_parallel::dispatch: aten::add");
}

}  // namespace t_dist_dtensor_stale_view_test
