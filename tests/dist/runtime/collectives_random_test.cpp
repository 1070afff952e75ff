// Randomised collectives: thousands of calls from a fixed seed (ops x dtypes x sizes x layouts x
// groups), each rank deriving every rank's input from (seed, step, rank), so it checks each result
// without trusting any collective. Run for every transport (CTest runs it with the default shared
// memory, with a tiny shared-memory buffer that forces chunking, and with HP_TRANSPORT=gloo).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <random>
#include <thread>

#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/process_group.h>

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_runtime_collectives_random_test {
namespace {

const at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kBool};

// Rank r's input of step `step`: small integers (exact in every dtype and in every sum).
at::Tensor input_of(uint64_t seed, int64_t step, int64_t rank, at::IntArrayRef shape, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(seed * 1000003 + static_cast<uint64_t>(step) * 131 + static_cast<uint64_t>(rank));
  at::Tensor t = at::randint(-8, 9, shape, gen, at::kLong);
  if (dtype == at::kBool) return t > 0;
  return t.to(dtype);
}

// `t`'s values in a layout chosen by `layout`: contiguous, transposed storage, or a slice of a
// larger tensor (so writes outside the view would show).
at::Tensor laid_out(const at::Tensor& t, int layout) {
  if (layout == 1 && t.dim() == 2) return t.t().contiguous().t();
  if (layout == 2) {
    std::vector<int64_t> big = t.sizes().vec();
    big.back() += 3;
    at::Tensor base = at::full(big, 7, t.options());
    at::Tensor v = base.narrow(t.dim() - 1, 1, t.size(-1));
    v.copy_(t);
    return v;
  }
  return t.clone();
}

struct Checker {
  uint64_t seed;
  int64_t checked = 0;
  std::string failure;

  void expect(bool ok, const std::string& what) {
    ++checked;
    if (!ok && failure.empty()) failure = what;
  }
};

void one_step(Checker& c, int64_t step, const hp::Group& g, std::mt19937_64& rng) {
  const auto dtype = kDtypes[rng() % 7];
  const int layout = static_cast<int>(rng() % 3);
  const int64_t gs = g.size(), me = g.rank();
  // Sizes from empty to past the shared-memory buffer (when CTest makes it tiny).
  const int64_t rows = static_cast<int64_t>(rng() % 3 == 0 ? rng() % 3 : 1 + rng() % (3 * gs + 2));
  const int64_t cols = static_cast<int64_t>(1 + rng() % (rng() % 5 == 0 ? 700 : 6));
  std::vector<at::Tensor> in;
  for (int64_t r = 0; r < gs; ++r) in.push_back(input_of(c.seed, step, g.ranks()[static_cast<size_t>(r)], {rows, cols}, dtype));
  const std::string what = "step " + std::to_string(step) + " dtype " + c10::toString(dtype) + " shape [" +
                           std::to_string(rows) + "," + std::to_string(cols) + "] layout " + std::to_string(layout) +
                           " group of " + std::to_string(gs);
  const bool is_bool = dtype == at::kBool;
  const bool is_float = at::isFloatingType(dtype);
  switch (rng() % 8) {
    case 0: {  // all_reduce, in place or not
      const hp::ReduceOp ops[] = {hp::ReduceOp::SUM, hp::ReduceOp::MAX, hp::ReduceOp::MIN, hp::ReduceOp::AVG};
      const auto op = ops[rng() % (is_float ? 4 : 3)];
      at::Tensor expect = in[0].clone();
      for (int64_t r = 1; r < gs; ++r) {
        if (is_bool) expect = op == hp::ReduceOp::MIN ? expect.logical_and(in[r]) : expect.logical_or(in[r]);
        else if (op == hp::ReduceOp::MAX) expect = at::maximum(expect, in[r]);
        else if (op == hp::ReduceOp::MIN) expect = at::minimum(expect, in[r]);
        else expect = expect + in[r];
      }
      if (op == hp::ReduceOp::AVG) expect = (expect.to(at::kDouble) / gs).to(dtype);
      // In place into a view of a larger tensor: nothing outside the view may change.
      at::Tensor base = at::full({rows, cols + 3}, 7, in[me].options());
      at::Tensor x = layout == 2 ? base.narrow(1, 1, cols).copy_(in[me]) : laid_out(in[me], layout);
      at::Tensor got = rng() % 2 ? hp::all_reduce(x, op, g) : hp::all_reduce_(x, op, g);
      const bool ok = op == hp::ReduceOp::AVG ? at::allclose(got.to(at::kDouble), expect.to(at::kDouble), 1e-2, 1e-2)
                                              : at::equal(got, expect);
      const bool untouched = layout != 2 || (at::equal(base.narrow(1, 0, 1), at::full({rows, 1}, 7, base.options())) &&
                                             at::equal(base.narrow(1, cols + 1, 2), at::full({rows, 2}, 7, base.options())));
      c.expect(ok && untouched && got.scalar_type() == dtype, "all_reduce " + std::string(hp::reduce_op_name(op)) + " " + what);
      break;
    }
    case 1: {  // all_gather along a random dim, uneven pieces (torch.chunk of the whole)
      const int64_t dim = static_cast<int64_t>(rng() % 2);
      at::Tensor whole = at::cat(in, dim);
      const int64_t n = whole.size(dim);
      at::Tensor mine = whole.narrow(dim, hp::chunk_offset(n, gs, me), hp::chunk_size(n, gs, me));
      at::Tensor got = hp::all_gather(laid_out(mine, layout), dim, g, n);
      c.expect(at::equal(got, whole), "all_gather " + what);
      break;
    }
    case 2: {  // reduce_scatter (sum) along a random dim
      if (is_bool) break;
      const int64_t dim = static_cast<int64_t>(rng() % 2);
      at::Tensor sum = in[0].clone();
      for (int64_t r = 1; r < gs; ++r) sum = sum + in[r];
      const int64_t n = sum.size(dim);
      at::Tensor got = hp::reduce_scatter(laid_out(in[me], layout), hp::ReduceOp::SUM, dim, g);
      c.expect(at::equal(got, sum.narrow(dim, hp::chunk_offset(n, gs, me), hp::chunk_size(n, gs, me))) &&
                   got.scalar_type() == dtype,
               "reduce_scatter " + what);
      break;
    }
    case 3: {  // all_to_all: split dim 0, concat dim 1
      at::Tensor got = hp::all_to_all(laid_out(in[me], layout), 0, 1, g);
      std::vector<at::Tensor> parts;
      for (int64_t r = 0; r < gs; ++r) parts.push_back(in[r].narrow(0, hp::chunk_offset(rows, gs, me), hp::chunk_size(rows, gs, me)));
      c.expect(at::equal(got, at::cat(parts, 1)), "all_to_all " + what);
      break;
    }
    case 4: {  // broadcast from a random root
      const int64_t src = static_cast<int64_t>(rng() % static_cast<uint64_t>(gs));
      at::Tensor x = laid_out(in[me], layout);
      hp::broadcast_(x, src, g);
      c.expect(at::equal(x, in[src]), "broadcast from " + std::to_string(src) + " " + what);
      break;
    }
    case 5: {  // scatter from a random root along a random dim
      const int64_t src = static_cast<int64_t>(rng() % static_cast<uint64_t>(gs));
      const int64_t dim = static_cast<int64_t>(rng() % 2);
      const int64_t n = in[src].size(dim);
      at::Tensor got = hp::scatter(laid_out(in[me], layout), dim, src, g);
      c.expect(at::equal(got, in[src].narrow(dim, hp::chunk_offset(n, gs, me), hp::chunk_size(n, gs, me))),
               "scatter from " + std::to_string(src) + " " + what);
      break;
    }
    case 6: {  // all_to_all_single with random splits: zeros, ranks that send nothing, uneven blocks
      std::vector<std::vector<int64_t>> sends(static_cast<size_t>(gs));  // sends[p][q]: rows p sends q
      for (int64_t p = 0; p < gs; ++p) {
        const bool silent = rng() % 4 == 0;
        for (int64_t q = 0; q < gs; ++q) sends[p].push_back(silent ? 0 : static_cast<int64_t>(rng() % (rng() % 6 == 0 ? 40 : 4)));
      }
      std::vector<at::Tensor> inputs;
      std::vector<int64_t> recv;
      for (int64_t p = 0; p < gs; ++p) {
        int64_t total = 0;
        for (int64_t q : sends[p]) total += q;
        inputs.push_back(input_of(c.seed + 1, step, g.ranks()[static_cast<size_t>(p)], {total, cols}, dtype));
        recv.push_back(sends[p][me]);
      }
      std::vector<at::Tensor> parts;
      for (int64_t p = 0; p < gs; ++p) {
        int64_t offset = 0;
        for (int64_t q = 0; q < me; ++q) offset += sends[p][q];
        parts.push_back(inputs[p].narrow(0, offset, sends[p][me]));
      }
      const at::Tensor x = laid_out(inputs[me], layout);
      at::Tensor got = rng() % 2 ? hp::all_to_all_single(x, recv, sends[me], g) : hp::all_to_all_single_async(x, recv, sends[me], g).wait();
      c.expect(got.scalar_type() == dtype && at::equal(got, at::cat(parts, 0)), "all_to_all_single " + what);
      break;
    }
    default:
      hp::barrier(g);
      c.expect(true, "barrier");
  }
}

}  // namespace

TEST(CollectivesRandomDist, ThousandsOfCollectivesOverInterleavedGroups) {
  const int64_t ws = hp::get_world_size(), rank = hp::get_rank();
  // Groups: the world, a permutation of it (another group of the same ranks), and for 4 ranks
  // the halves; every rank takes part in each step's group.
  std::vector<hp::Group> groups{hp::world_group()};
  std::vector<int64_t> reversed;
  for (int64_t r = ws - 1; r >= 0; --r) reversed.push_back(r);
  groups.push_back(hp::new_group(reversed));
  if (ws == 4) groups.push_back(rank < 2 ? hp::new_group({0, 1}) : hp::new_group({2, 3}));
  groups.push_back(hp::new_group({rank}));  // a group of one
  Checker c{20261130};
  std::mt19937_64 rng(c.seed);  // the same stream on every rank
  const int64_t steps = ws == 2 ? 2500 : 1500;
  hp::CommDebugMode comm;
  for (int64_t step = 0; step < steps; ++step) {
    const auto& g = groups[rng() % groups.size()];
    one_step(c, step, g, rng);
  }
  EXPECT_EQ(c.failure, "") << "first wrong result of " << c.checked;
  EXPECT_GT(comm.get_total_counts(), steps / 2);
  if (rank == 0)
    std::printf("randomised collectives: %lld checked over %zu groups, %lld recorded by CommDebugMode\n",
                static_cast<long long>(c.checked), groups.size(), static_cast<long long>(comm.get_total_counts()));
}

// Collectives on one group from a second thread (as autograd's backward thread issues them) while
// the main thread uses another group: both stay right, neither blocks the other.
TEST(CollectivesRandomDist, TwoThreadsOnTwoGroups) {
  const int64_t ws = hp::get_world_size();
  std::vector<int64_t> reversed;
  for (int64_t r = ws - 1; r >= 0; --r) reversed.push_back(r);
  hp::Group a = hp::world_group(), b = hp::new_group(reversed);
  std::string other_failure;
  std::thread side([&] {
    for (int i = 0; i < 400 && other_failure.empty(); ++i) {
      at::Tensor t = at::full({64}, static_cast<double>(i));
      hp::all_reduce_(t, hp::ReduceOp::SUM, b);
      if (!at::equal(t, at::full({64}, static_cast<double>(i * ws)))) other_failure = "side thread, call " + std::to_string(i);
    }
  });
  for (int i = 0; i < 400; ++i) {
    at::Tensor t = at::full({3, 5}, static_cast<double>(hp::get_rank() + i));
    at::Tensor got = hp::all_gather(t, 0, a);
    for (int64_t r = 0; r < ws; ++r)
      ASSERT_TRUE(at::equal(got.narrow(0, 3 * r, 3), at::full({3, 5}, static_cast<double>(r + i)))) << "main thread, call " << i;
  }
  side.join();
  EXPECT_EQ(other_failure, "");
}

}  // namespace t_dist_runtime_collectives_random_test
