// Every collective against a reference computed locally from the same deterministic inputs,
// on even and uneven (torch.chunk) shapes, float32 and bfloat16.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "../../common/error_message.h"

#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collective_label.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_runtime_collectives_test {
namespace {
// Small integers: exact in bfloat16 and after summing over 4 ranks.
at::Tensor global_input(at::IntArrayRef shape, at::ScalarType dtype, int64_t salt = 0) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kLong).add(salt).remainder(13).sub(6)).reshape(shape).to(dtype);
}

at::Tensor chunk_of(const at::Tensor& t, int64_t dim, int64_t parts, int64_t idx) {
  return t.narrow(dim, hp::chunk_offset(t.size(dim), parts, idx), hp::chunk_size(t.size(dim), parts, idx));
}

std::vector<std::vector<int64_t>> shapes_for(int64_t ws) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t extra : {0, 1, 2}) {
    out.push_back({ws * 3 + extra, 3});
    out.push_back({3, ws * 3 + extra});
  }
  out.push_back({1, 5});  // fewer rows than ranks: trailing ranks hold nothing
  return out;
}

const std::vector<at::ScalarType> kDtypes{at::kFloat, at::kBFloat16};
}  // namespace

TEST(CollectivesDist, AllGatherEvenAndUneven) {
  auto g = hp::world_group();
  for (auto dtype : kDtypes)
    for (const auto& shape : shapes_for(g.size()))
      for (int64_t dim : {0, 1}) {
        at::Tensor full = global_input(shape, dtype);
        at::Tensor local = chunk_of(full, dim, g.size(), g.rank()).contiguous();
        at::Tensor out = hp::all_gather(local, dim, g, full.size(dim));
        ASSERT_TRUE(at::equal(out, full)) << "shape " << at::IntArrayRef(shape) << " dim " << dim << " dtype " << dtype;
      }
}

TEST(CollectivesDist, AllReduceAllOps) {
  auto g = hp::world_group();
  for (auto dtype : kDtypes) {
    std::vector<at::Tensor> per_rank;
    for (int64_t r = 0; r < g.size(); ++r) per_rank.push_back(global_input({5, 3}, dtype, 7 * r));
    at::Tensor stacked = at::stack(per_rank).to(at::kFloat);
    const std::pair<hp::ReduceOp, at::Tensor> cases[] = {
        {hp::ReduceOp::SUM, stacked.sum(0)},
        {hp::ReduceOp::AVG, stacked.mean(0)},
        {hp::ReduceOp::MAX, std::get<0>(stacked.max(0))},
        {hp::ReduceOp::MIN, std::get<0>(stacked.min(0))}};
    for (const auto& c : cases) {
      at::Tensor t = per_rank[static_cast<size_t>(g.rank())].clone();
      at::Tensor out = hp::all_reduce(t, c.first, g);
      EXPECT_TRUE(at::equal(t, per_rank[static_cast<size_t>(g.rank())])) << "out-of-place all_reduce changed its input";
      EXPECT_TRUE(at::allclose(out.to(at::kFloat), c.second.to(dtype).to(at::kFloat), 1e-2, 1e-2))
          << hp::reduce_op_name(c.first) << " " << dtype;
      hp::all_reduce_(t, c.first, g);
      EXPECT_TRUE(at::equal(t, out));
    }
  }
}

TEST(CollectivesDist, ReduceScatterEvenAndUneven) {
  auto g = hp::world_group();
  for (auto dtype : kDtypes)
    for (const auto& shape : shapes_for(g.size()))
      for (int64_t dim : {0, 1}) {
        at::Tensor mine = global_input(shape, dtype, g.rank());
        at::Tensor sum = at::zeros(shape, at::kFloat), mx = at::full(shape, -1e9, at::kFloat);
        for (int64_t r = 0; r < g.size(); ++r) {
          sum += global_input(shape, dtype, r).to(at::kFloat);
          mx = at::maximum(mx, global_input(shape, dtype, r).to(at::kFloat));
        }
        at::Tensor out = hp::reduce_scatter(mine, hp::ReduceOp::SUM, dim, g);
        ASSERT_TRUE(at::equal(out, chunk_of(sum, dim, g.size(), g.rank()).to(dtype)))
            << "shape " << at::IntArrayRef(shape) << " dim " << dim << " dtype " << dtype;
        at::Tensor out_max = hp::reduce_scatter(mine, hp::ReduceOp::MAX, dim, g);
        ASSERT_TRUE(at::equal(out_max, chunk_of(mx, dim, g.size(), g.rank()).to(dtype)));
      }
}

TEST(CollectivesDist, AllToAllEvenAndUneven) {
  auto g = hp::world_group();
  for (auto dtype : kDtypes)
    for (const auto& shape : shapes_for(g.size()))
      for (auto dims : {std::pair<int64_t, int64_t>{0, 1}, {1, 0}}) {
        const int64_t split = dims.first, concat = dims.second;
        at::Tensor full = global_input(shape, dtype);
        at::Tensor local = chunk_of(full, concat, g.size(), g.rank()).contiguous();
        at::Tensor out = hp::all_to_all(local, split, concat, g, full.size(concat));
        ASSERT_TRUE(at::equal(out, chunk_of(full, split, g.size(), g.rank())))
            << "shape " << at::IntArrayRef(shape) << " split " << split << " dtype " << dtype;
      }
}

TEST(CollectivesDist, BroadcastAndScatter) {
  auto g = hp::world_group();
  for (auto dtype : kDtypes)
    for (int64_t src = 0; src < g.size(); ++src) {
      at::Tensor expected = global_input({4, 3}, dtype, 100 + src);
      at::Tensor t = g.rank() == src ? expected.clone() : at::zeros({4, 3}, dtype);
      hp::broadcast_(t, src, g);
      EXPECT_TRUE(at::equal(t, expected));
      for (const auto& shape : shapes_for(g.size())) {
        at::Tensor full = global_input(shape, dtype, src);
        at::Tensor in = g.rank() == src ? full : at::zeros(shape, dtype);
        at::Tensor piece = hp::scatter(in, 0, src, g);
        ASSERT_TRUE(at::equal(piece, chunk_of(full, 0, g.size(), g.rank())));
      }
    }
}

TEST(CollectivesDist, CommDebugModeCountsAndBytes) {
  auto g = hp::world_group();
  at::Tensor x = at::ones({4 * g.size(), 2});
  hp::CommDebugMode outer;
  {
    hp::CommDebugMode comm;
    hp::all_reduce(x, hp::ReduceOp::SUM, g);
    hp::all_reduce(x, hp::ReduceOp::AVG, g);
    hp::reduce_scatter(x, hp::ReduceOp::SUM, 0, g);  // emulated by all-to-all: counted once as itself
    hp::all_gather(x, 1, g);
    EXPECT_EQ(comm.get_comm_count("all_reduce"), 2);
    EXPECT_EQ(comm.get_comm_count("reduce_scatter"), 1);
    EXPECT_EQ(comm.get_comm_count("all_to_all"), 0);
    EXPECT_EQ(comm.get_comm_count("all_gather"), 1);
    EXPECT_EQ(comm.get_total_counts(), 4);
    const int64_t b = x.numel() * 4;
    EXPECT_EQ(comm.get_comm_bytes("all_reduce"), 2 * b);
    EXPECT_EQ(comm.get_comm_bytes("reduce_scatter"), b);
    EXPECT_EQ(comm.get_total_bytes(), 4 * b);
    comm.reset();
    EXPECT_EQ(comm.get_total_counts(), 0);
  }
  hp::barrier(g);
  EXPECT_EQ(outer.get_total_counts(), 5);  // nested scopes both count
  EXPECT_EQ(outer.get_comm_count("barrier"), 1);
}

// Repro: in-place all_reduce_ of bf16/fp16 where the ranks' tensors have different memory
// layouts must add matching elements, not matching memory positions.
TEST(CollectivesDist, InPlaceAllReduceWithDifferentLayoutsPerRank) {
  auto g = hp::world_group();
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat, at::kLong})
    for (auto op : {hp::ReduceOp::SUM, hp::ReduceOp::MAX, hp::ReduceOp::MIN}) {
      at::Tensor t = g.rank() % 2 == 1 ? at::empty({3, 2}, dtype).t() : at::empty({2, 3}, dtype);
      auto value = [&](int64_t r) { return (at::arange(6).view({2, 3}) + 10 * r).to(dtype); };
      t.copy_(value(g.rank()));
      at::Tensor expect = value(0);
      for (int64_t r = 1; r < g.size(); ++r) {
        if (op == hp::ReduceOp::SUM) expect = expect + value(r);
        else if (op == hp::ReduceOp::MAX) expect = at::maximum(expect, value(r));
        else expect = at::minimum(expect, value(r));
      }
      hp::all_reduce_(t, op, g);
      ASSERT_TRUE(at::equal(t, expect)) << dtype << " " << hp::reduce_op_name(op) << "\n" << t;
    }
  // A view into a larger tensor: nothing outside the view is written.
  at::Tensor base = at::full({4, 4}, -7.0);
  at::Tensor view = base.narrow(1, 1, 2);
  view.fill_(1.0);
  hp::all_reduce_(view, hp::ReduceOp::SUM, g);
  EXPECT_TRUE(at::equal(base.narrow(1, 1, 2), at::full({4, 2}, static_cast<double>(g.size()))));
  EXPECT_TRUE(at::equal(base.narrow(1, 0, 1), at::full({4, 1}, -7.0)));
  EXPECT_TRUE(at::equal(base.narrow(1, 3, 1), at::full({4, 1}, -7.0)));
}

// Repro: zero-element tensors (a crash inside Gloo before).
TEST(CollectivesDist, EmptyTensorsEverywhere) {
  auto g = hp::world_group();
  EXPECT_EQ(hp::all_gather(at::zeros({0, 3}), 0, g, 0).sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(hp::all_gather(at::zeros({2, 0}), 0, g).sizes(), (std::vector<int64_t>{2 * g.size(), 0}));
  at::Tensor e = at::zeros({0, 4});
  EXPECT_EQ(hp::all_reduce(e, hp::ReduceOp::SUM, g).sizes(), e.sizes());
  EXPECT_EQ(hp::reduce_scatter(at::zeros({g.size(), 0}), hp::ReduceOp::SUM, 0, g).sizes(),
            (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(hp::all_to_all(at::zeros({0, 2}), 0, 1, g).sizes(), (std::vector<int64_t>{0, 2 * g.size()}));
  EXPECT_EQ(hp::scatter(at::zeros({g.size(), 0}), 0, 0, g).sizes(), (std::vector<int64_t>{1, 0}));
  at::Tensor b = at::zeros({0});
  EXPECT_EQ(hp::broadcast_(b, 0, g).numel(), 0);
  // Still in step: a real collective after the empty ones.
  at::Tensor one = at::ones({1});
  EXPECT_EQ(hp::all_reduce(one, hp::ReduceOp::SUM, g).item<float>(), g.size());
}

// Integer dtypes: sums stay in the input dtype; avg is refused (no silent rounding convention).
TEST(CollectivesDist, IntegerAndBoolDtypes) {
  auto g = hp::world_group();
  for (auto dtype : {at::kInt, at::kLong}) {
    at::Tensor x = at::arange(2 * g.size(), at::kLong).to(dtype) + g.rank();
    at::Tensor rs = hp::reduce_scatter(x, hp::ReduceOp::SUM, 0, g);
    EXPECT_EQ(rs.scalar_type(), dtype);
    at::Tensor expect = (at::arange(2 * g.size(), at::kLong) * g.size() + g.size() * (g.size() - 1) / 2).to(dtype);
    EXPECT_TRUE(at::equal(rs, expect.narrow(0, 2 * g.rank(), 2)));
    EXPECT_THROW(hp::all_reduce(x, hp::ReduceOp::AVG, g), c10::TypeError);
    EXPECT_THROW(hp::all_reduce_(x, hp::ReduceOp::AVG, g), c10::TypeError);
    EXPECT_THROW(hp::reduce_scatter(x, hp::ReduceOp::AVG, 0, g), c10::TypeError);
  }
  // bool: sum/max are logical or, min logical and.
  auto bools = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong).to(at::kBool); };
  at::Tensor b = bools({g.rank() == 0, 0, 1});
  EXPECT_TRUE(at::equal(hp::all_reduce(b, hp::ReduceOp::SUM, g), bools({1, 0, 1})));
  EXPECT_TRUE(at::equal(hp::all_reduce(b, hp::ReduceOp::MIN, g), bools({g.size() == 1, 0, 1})));
}

// Non-integer values (every addition rounds), NaNs, and sizes around the vector width and the
// shared-memory transport's one-pass/two-pass threshold: each result must be the rank-order fold
// (((x0 op x1) op x2) ...) bit for bit, bf16/fp16 folded in fp32 and rounded once; a NaN on any
// rank wins max and min on every transport (Gloo alone would drop some). Sums bit for bit on
// shared memory, and on Gloo at two ranks (addition commutes); Gloo's ring adds more ranks in
// another order, and fp16 in fp16.
TEST(CollectivesDist, AllReduceIsTheRankOrderFoldBitForBit) {
  auto g = hp::world_group();
  const bool shm = g.transport() == "shm";
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    const bool narrow = dtype == at::kBFloat16 || dtype == at::kHalf;
    const bool exact_sum = shm || (g.size() == 2 && dtype != at::kHalf);
    for (int64_t n : {1, 7, 33, 1000, 4097, 40000}) {
      std::vector<at::Tensor> in;
      for (int64_t r = 0; r < g.size(); ++r) {
        auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 * n + 17 * r + (dtype == at::kDouble)));
        at::Tensor x = at::randn({n}, gen, narrow ? at::kFloat : dtype).mul_(std::pow(10.0, static_cast<double>(r % 3))).to(dtype);
        if (n > 2) x.index_put_({(r * 5 + 1) % n}, std::numeric_limits<double>::quiet_NaN());
        in.push_back(x);
      }
      const std::pair<hp::ReduceOp, std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>> ops[] = {
          {hp::ReduceOp::SUM, [](const at::Tensor& a, const at::Tensor& b) { return a + b; }},
          {hp::ReduceOp::MAX, [](const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); }},
          {hp::ReduceOp::MIN, [](const at::Tensor& a, const at::Tensor& b) { return at::minimum(a, b); }}};
      for (const auto& [op, fold] : ops) {
        if (op == hp::ReduceOp::SUM && !exact_sum) continue;
        const auto wide = narrow ? at::kFloat : dtype;
        at::Tensor expect = in[0].to(wide);
        for (int64_t r = 1; r < g.size(); ++r) expect = fold(expect, in[static_cast<size_t>(r)].to(wide));
        expect = expect.to(dtype);
        at::Tensor got = in[static_cast<size_t>(g.rank())].clone();
        hp::all_reduce_(got, op, g);
        // Bits (so -0 != +0), NaN where the fold has NaN (its payload is torch's kernel's choice).
        const at::ScalarType bits = narrow ? at::kShort : dtype == at::kFloat ? at::kInt : at::kLong;
        const at::Tensor number = expect.isnan().logical_not();
        EXPECT_TRUE(at::equal(got.isnan(), expect.isnan()) &&
                    at::equal(got.view(bits).masked_select(number), expect.view(bits).masked_select(number)))
            << hp::reduce_op_name(op) << " " << dtype << " n=" << n << " on " << g.transport();
      }
    }
  }
}

// Splits that are malformed on one rank fail on that rank before anything moves; splits that
// disagree between peers fail on every rank (the shared-memory transport exchanges the sizes).
TEST(CollectivesDist, AllToAllSingleRefusesBadSplits) {
  auto g = hp::world_group();
  const int64_t gs = g.size();
  at::Tensor x = at::ones({gs, 3});
  std::vector<int64_t> ones(static_cast<size_t>(gs), 1);
  EXPECT_THROW(hp::all_to_all_single(x, ones, {1}, g), c10::ValueError);
  std::vector<int64_t> negative = ones;
  negative[0] = -1;
  negative[1] = 2;
  EXPECT_THROW(hp::all_to_all_single(x, ones, negative, g), c10::ValueError);
  std::vector<int64_t> too_many = ones;
  too_many[0] = 2;
  EXPECT_THROW(hp::all_to_all_single(x, ones, too_many, g), c10::ValueError);
  EXPECT_THROW(hp::all_to_all_single(at::ones({gs + 1, 3}), {}, {}, g), c10::ValueError);
  // Empty lists: equal splits.
  EXPECT_TRUE(at::equal(hp::all_to_all_single(x, {}, {}, g), x));
  if (g.transport() != "shm") return;
  // Rank 0 expects 2 rows from rank 1, which sends it 1.
  std::vector<int64_t> expect = ones;
  if (g.rank() == 0) expect[1] = 2;
  try {
    hp::all_to_all_single(x, expect, ones, g);
    ADD_FAILURE() << "a disagreement on the sizes went unnoticed";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 sends 1 rows to rank 0, which expects 2"), std::string::npos) << e.what();
  }
  // The group still works afterwards.
  EXPECT_TRUE(at::equal(hp::all_to_all_single(x, ones, ones, g), x));
}


// One rank's collective carries a label (an owner, as FSDP's gathers and reductions do) and the
// other ranks' same collective, of the same size, carries none: each way round, for every kind
// FSDP and TP issue, every rank stops naming both, at once (no timeout), and no rank takes the
// other's data. The group pairs its collectives as before afterwards.
TEST(CollectivesDist, LabelledAgainstUnlabelledStopsEveryRankNamingBoth) {
  auto g = hp::world_group();
  const int64_t gs = g.size();
  const std::string owner = "fully_shard of 'b': all_gather of its parameters";
  const std::vector<std::pair<std::string, std::function<void()>>> kinds{
      {"all_gather", [&] { hp::all_gather(at::ones({2, 3}), 0, g); }},
      {"all_reduce", [&] { hp::all_reduce(at::ones({5}), hp::ReduceOp::SUM, g); }},
      {"all_reduce", [&] { hp::all_reduce(at::ones({5}, at::kBFloat16), hp::ReduceOp::MAX, g); }},
      {"all_reduce", [&] { hp::all_reduce(at::ones({5}, at::kInt), hp::ReduceOp::MIN, g); }},
      {"reduce_scatter", [&] { hp::reduce_scatter(at::ones({gs * 2, 3}), hp::ReduceOp::SUM, 0, g); }},
      {"all_to_all", [&] { hp::all_to_all(at::ones({gs * 2, gs}), 0, 1, g); }},
      {"all_to_all_single", [&] { hp::all_to_all_single(at::ones({gs, 3}), {}, {}, g); }},
      {"broadcast", [&] { at::Tensor t = at::ones({3}); hp::broadcast_(t, 0, g); }},
      {"barrier", [&] { hp::barrier(g); }},
  };
  for (const auto& [kind, call] : kinds) {
    for (const int64_t labelled : {int64_t{0}, gs - 1}) {
      SCOPED_TRACE(kind + ", labelled on rank " + std::to_string(labelled) + ", " + g.transport());
      const std::string m = hp_test::error_message([&, call = call] {
        std::optional<hp::CollectiveLabel> label;
        if (g.rank() == labelled) label.emplace(owner);
        call();
      });
      EXPECT_NE(m.find("for " + owner), std::string::npos) << m;
      EXPECT_NE(m.find("unlabelled"), std::string::npos) << m;
      EXPECT_NE(m.find("every rank must issue the same collectives in the same order"), std::string::npos) << m;
      // Still paired: a sum of every rank's number.
      const at::Tensor r = hp::all_reduce(at::full({3}, static_cast<double>(g.rank() + 1)), hp::ReduceOp::SUM, g);
      EXPECT_TRUE(at::equal(r, at::full({3}, static_cast<double>(gs * (gs + 1) / 2)))) << r;
    }
  }
  // Two labels of the same kind and size, and a size that differs under one label.
  const std::string m = hp_test::error_message([&] {
    const hp::CollectiveLabel label(g.rank() == 0 ? "owner A" : "owner B");
    hp::all_gather(at::ones({2, 3}), 0, g);
  });
  EXPECT_NE(m.find("owner A"), std::string::npos) << m;
  EXPECT_NE(m.find("owner B"), std::string::npos) << m;
}

}  // namespace t_dist_runtime_collectives_test
