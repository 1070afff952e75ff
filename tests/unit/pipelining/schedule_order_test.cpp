// The schedules' per-rank orders, simulated with unit costs in one process: each rank's idle
// fraction equals the published bubble, (p - 1) / (m + p - 1) for GPipe and 1F1B at every m and
// (p - 1) / (v m + p - 1) for interleaved 1F1B at m = p and 2p (each virtual stage costing 1/v);
// 1F1B holds at most p microbatches on rank 0, GPipe m; every order is complete and runs without
// deadlock, and interleaved at m = 1 runs and reports its (larger) bubble.
#include <gtest/gtest.h>

#include <hyper_parallel/pipelining/schedule_order.h>

#include <c10/util/Exception.h>

#include <set>
#include <tuple>

namespace hp = hyper_parallel;
using hp::ScheduleKind;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_pipelining_schedule_order_test {
namespace {

// Every (stage, kind, microbatch) of the rank's stages exactly once, each backward after its forward.
void expect_complete(const std::vector<std::vector<hp::PipelineAction>>& order, int64_t p, int64_t m, int64_t v) {
  for (int64_t r = 0; r < p; ++r) {
    std::set<std::tuple<int64_t, int, int64_t>> seen;
    for (const auto& a : order[static_cast<size_t>(r)]) {
      EXPECT_EQ(a.stage_index % p, r);
      if (a.kind == hp::PipelineAction::Kind::backward)
        EXPECT_TRUE(seen.count({a.stage_index, 0, a.microbatch})) << "backward before forward on rank " << r;
      EXPECT_TRUE(seen.insert({a.stage_index, static_cast<int>(a.kind), a.microbatch}).second);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), 2 * m * v);
  }
}

}  // namespace

TEST(PipelineScheduleOrder, GPipeAndOneFOneBIdleFractionIsTheBubbleAtEveryMicrobatchCount) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (int64_t p : {2, 3, 4, 8})
      for (int64_t m = 1; m <= 3 * p; ++m) {
        SCOPED_TRACE(hp::schedule_name(k) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const auto order = hp::pipeline_order(k, p, m);
        expect_complete(order, p, m, 1);
        const hp::ScheduleTimeline t = hp::simulate_schedule(order, m);
        for (int64_t r = 0; r < p; ++r)
          EXPECT_NEAR(t.idle_fraction[static_cast<size_t>(r)], static_cast<double>(p - 1) / static_cast<double>(m + p - 1), 1e-12);
        EXPECT_DOUBLE_EQ(hp::bubble_fraction(k, p, m), static_cast<double>(p - 1) / static_cast<double>(m + p - 1));
        // Activations held at the peak on rank 0: every microbatch for GPipe, at most p for 1F1B.
        EXPECT_EQ(t.max_in_flight[0], k == ScheduleKind::GPipe ? m : std::min(m, p));
      }
}

TEST(PipelineScheduleOrder, InterleavedIdleFractionIsTheBubbleAtPAndTwoPMicrobatches) {
  for (int64_t p : {2, 3, 4, 8})
    for (int64_t v : {2, 3, 4})
      for (int64_t m : {p, 2 * p}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        const auto order = hp::pipeline_order(ScheduleKind::Interleaved1F1B, p, m, v);
        expect_complete(order, p, m, v);
        const double cost = 1.0 / static_cast<double>(v);  // a virtual stage holds 1/v of a rank's layers
        const hp::ScheduleTimeline t = hp::simulate_schedule(order, m, v, cost, cost);
        const double bubble = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
        EXPECT_DOUBLE_EQ(hp::bubble_fraction(ScheduleKind::Interleaved1F1B, p, m, v), bubble);
        for (int64_t r = 0; r < p; ++r) EXPECT_NEAR(t.idle_fraction[static_cast<size_t>(r)], bubble, 1e-12) << "rank " << r;
        // Smaller than 1F1B's at the same m: the point of virtual stages.
        EXPECT_LT(t.idle_fraction[0], hp::bubble_fraction(ScheduleKind::OneFOneB, p, m));
      }
}

TEST(PipelineScheduleOrder, InterleavedRunsOneMicrobatchAndReportsItsIdleFraction) {
  for (int64_t p : {2, 4})
    for (int64_t m : {1, 3}) {
      const auto order = hp::pipeline_order(ScheduleKind::Interleaved1F1B, p, m, 2);
      expect_complete(order, p, m, 2);
      const hp::ScheduleTimeline t = hp::simulate_schedule(order, m, 2, 0.5, 0.5);
      // With fewer microbatches than ranks the pipeline never fills: every rank idles at least the
      // formula's share, and a single microbatch leaves p - 1 of every p units idle.
      EXPECT_GE(t.idle_fraction[0] + 1e-12, hp::bubble_fraction(ScheduleKind::Interleaved1F1B, p, m, 2));
      if (m == 1) EXPECT_NEAR(t.idle_fraction[0], static_cast<double>(p - 1) / static_cast<double>(p), 1e-12);
    }
}

TEST(PipelineScheduleOrder, OneFOneBStartsWithItsWarmUpAndBadArgumentsAreRefused) {
  const auto order = hp::pipeline_order(ScheduleKind::OneFOneB, 4, 8);
  using K = hp::PipelineAction::Kind;
  const std::vector<hp::PipelineAction> head{{0, K::forward, 0}, {0, K::forward, 1}, {0, K::forward, 2}, {0, K::forward, 3}, {0, K::backward, 0}};
  EXPECT_TRUE(std::equal(head.begin(), head.end(), order[0].begin()));
  EXPECT_EQ(order[3][0], (hp::PipelineAction{3, K::forward, 0}));
  EXPECT_EQ(order[3][1], (hp::PipelineAction{3, K::backward, 0}));
  EXPECT_THROW(hp::pipeline_order(ScheduleKind::OneFOneB, 4, 8, 2), c10::ValueError);
  EXPECT_THROW(hp::pipeline_order(ScheduleKind::Interleaved1F1B, 2, 5, 2), c10::ValueError);  // 2 rounds of 2.5
  EXPECT_THROW(hp::pipeline_order(ScheduleKind::GPipe, 0, 8), c10::ValueError);
  EXPECT_THROW(hp::schedule_kind("zero_bubble"), c10::ValueError);
  EXPECT_EQ(hp::schedule_kind("Interleaved1F1B"), ScheduleKind::Interleaved1F1B);
  // An order whose backward comes before the next stage's: a deadlock, named.
  std::vector<std::vector<hp::PipelineAction>> bad{{{0, K::forward, 0}, {0, K::backward, 0}}, {{1, K::backward, 0}, {1, K::forward, 0}}};
  try {
    hp::simulate_schedule(bad, 1);
    FAIL() << "a deadlocking order was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("deadlocks: rank 0 at B of stage 0, microbatch 0; rank 1 at B of stage 1"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace t_unit_pipelining_schedule_order_test
