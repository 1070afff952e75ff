// ContextParallel on a ScaledDotProductAttention module against one process: every mode
// (ulysses, allgather_kv, ring), causal and not, with and without head-tail load balancing, at
// the job's cp (2 or 4), forward and backward, with grouped-query heads (4 query heads over 2 key
// heads: ulysses at cp = 4 replicates the key heads). float32 within rtol 1e-5, atol 2e-6;
// bfloat16 within rtol = atol = 8e-3·cp (PyTorch's ring-attention tolerance) against one process
// computing in bfloat16. Also: the collectives each mode issues, counted against the formulas
// (ulysses: 4 all-to-alls forward; allgather_kv: K and V gathered, (cp-1)/cp of them received;
// ring: cp-1 block transfers forward), the sharding helpers, and the refusals.
#include <gtest/gtest.h>

#include <hyper_parallel/hyper_parallel.h>

#include "../../common/test_util.h"

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_context_parallel_context_parallel_attention_test {
namespace {

struct Case {
  std::string mode;
  bool causal = true, load_balance = false;
  at::ScalarType dtype = at::kFloat;
};

constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kDim = 8;

std::string name(const Case& c) {
  return c.mode + (c.causal ? " causal" : " full") + (c.load_balance ? " load-balanced " : " ") + c10::toString(c.dtype);
}

// The module's output and the gradients of (out * grad_out).sum() for q, k, v.
struct Result {
  at::Tensor out, dq, dk, dv;
};

Result one_process(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out, bool causal) {
  hnn::ScaledDotProductAttention sdpa(hnn::ScaledDotProductAttentionOptions().is_causal(causal));
  const at::Tensor qq = q.detach().requires_grad_(), kk = k.detach().requires_grad_(), vv = v.detach().requires_grad_();
  const at::Tensor out = sdpa(qq, kk, vv);
  (out * grad_out).sum().backward();
  return {out.detach(), qq.grad(), kk.grad(), vv.grad()};
}

Result context_parallel(const Case& c, const hp::DeviceMesh& cp, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& grad_out) {
  hnn::ScaledDotProductAttention sdpa(hnn::ScaledDotProductAttentionOptions().is_causal(c.causal));
  hp::ContextParallel(c.mode, c.load_balance).apply(*sdpa, cp);
  const auto shard = [&](const at::Tensor& t) { return hp::context_parallel_shard(t.detach(), cp, 2, c.load_balance); };
  const at::Tensor qs = shard(q).requires_grad_(), ks = shard(k).requires_grad_(), vs = shard(v).requires_grad_();
  const at::Tensor out = sdpa(qs, ks, vs);
  (out * shard(grad_out)).sum().backward();
  const auto unshard = [&](const at::Tensor& t) { return hp::context_parallel_unshard(t, cp, 2, c.load_balance); };
  return {unshard(out.detach()), unshard(qs.grad()), unshard(ks.grad()), unshard(vs.grad())};
}

void matches_one_process(const Case& c, int64_t seq) {
  SCOPED_TRACE(name(c) + " seq " + std::to_string(seq));
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  const at::Tensor q = hp_test::random({kBatch, kHeads, seq, kDim}, 1).to(c.dtype);
  const at::Tensor k = hp_test::random({kBatch, kKvHeads, seq, kDim}, 2).to(c.dtype);
  const at::Tensor v = hp_test::random({kBatch, kKvHeads, seq, kDim}, 3).to(c.dtype);
  const at::Tensor grad_out = hp_test::random({kBatch, kHeads, seq, kDim}, 4).to(c.dtype);
  const Result ref = one_process(q, k, v, grad_out, c.causal);
  const Result got = context_parallel(c, cp, q, k, v, grad_out);
  const double tol = c.dtype == at::kFloat ? 0 : 8e-3 * static_cast<double>(cp.size());
  const double rtol = c.dtype == at::kFloat ? 1e-5 : tol, atol = c.dtype == at::kFloat ? 2e-6 : tol;
  EXPECT_TRUE(hp_test::close(got.out, ref.out, rtol, atol)) << "output";
  EXPECT_TRUE(hp_test::close(got.dq, ref.dq, rtol, atol)) << "query gradient";
  EXPECT_TRUE(hp_test::close(got.dk, ref.dk, rtol, atol)) << "key gradient";
  EXPECT_TRUE(hp_test::close(got.dv, ref.dv, rtol, atol)) << "value gradient";
  EXPECT_EQ(got.out.scalar_type(), c.dtype);
  EXPECT_EQ(got.dq.scalar_type(), c.dtype);
}

void every_case_matches_one_process(const std::string& mode) {
  const int64_t cp = hp::get_world_size();
  for (bool causal : {true, false})
    for (bool lb : {false, true}) {
      if (lb && !causal) continue;  // load balancing evens out causal work only (refused otherwise)
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) matches_one_process({mode, causal, lb, dtype}, 4 * cp);
    }
  // A longer sequence: several positions per chunk.
  matches_one_process({mode, true, true, at::kFloat}, 12 * cp);
}

}  // namespace

TEST(ContextParallelAttentionDist, UlyssesMatchesOneProcessForwardAndBackward) { every_case_matches_one_process("ulysses"); }
TEST(ContextParallelAttentionDist, AllGatherKvMatchesOneProcessForwardAndBackward) { every_case_matches_one_process("allgather_kv"); }
TEST(ContextParallelAttentionDist, RingMatchesOneProcessForwardAndBackward) { every_case_matches_one_process("ring"); }

// What each mode moves per call, against the formulas, on a [2, 4, s, 8] float32 shard with 2 key
// heads (at cp = 4 ulysses moves the key heads repeated to 4).
TEST(ContextParallelAttentionDist, CommunicationIsWhatTheFormulasSay) {
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  const int64_t n = cp.size(), s = 4, seq = s * n;
  const std::vector<int64_t> group = cp.get_group(0).ranks();
  const int64_t q_bytes = kBatch * kHeads * s * kDim * 4, kv_bytes = kBatch * kKvHeads * s * kDim * 4;
  for (const std::string mode : {"ulysses", "allgather_kv", "ring"}) {
    SCOPED_TRACE(mode);
    hnn::ScaledDotProductAttention sdpa(hnn::ScaledDotProductAttentionOptions().is_causal(true));
    hp::ContextParallel(mode, true).apply(*sdpa, cp);
    const auto shard = [&](uint64_t seed, int64_t heads) {
      return hp::context_parallel_shard(hp_test::random({kBatch, heads, seq, kDim}, seed), cp, 2, true).requires_grad_();
    };
    const at::Tensor q = shard(1, kHeads), k = shard(2, kKvHeads), v = shard(3, kKvHeads);
    hp::CommDebugMode comm;
    const at::Tensor out = sdpa(q, k, v);
    out.sum().backward();
    auto stats = comm.get_comm_group_stats()[group];
    if (mode == "ulysses") {
      // q, k, v to head shards and the output back: 4 all-to-alls of the local tensors forward,
      // 4 backward. Key heads are repeated up to cp when fewer.
      const int64_t kv_sent = kv_bytes * std::max<int64_t>(1, n / kKvHeads);
      EXPECT_EQ(stats["forward"]["all_to_all"].count, 4) << comm.summary();
      EXPECT_EQ(stats["forward"]["all_to_all"].bytes, 2 * q_bytes + 2 * kv_sent) << comm.summary();
      EXPECT_EQ(stats["backward"]["all_to_all"].count, 4) << comm.summary();
      EXPECT_EQ(comm.get_total_counts(), 8) << comm.summary();
    } else if (mode == "allgather_kv") {
      // K and V gathered: each rank receives the other cp-1 shards, (cp-1)/cp of the whole; their
      // gradients reduce-scattered.
      EXPECT_EQ(stats["forward"]["all_gather"].count, 2) << comm.summary();
      EXPECT_EQ(stats["forward"]["all_gather"].full_bytes - stats["forward"]["all_gather"].bytes, 2 * (n - 1) * kv_bytes);
      EXPECT_EQ(stats["backward"]["reduce_scatter"].count, 2) << comm.summary();
      EXPECT_EQ(comm.get_total_counts(), 4) << comm.summary();
    } else {
      // cp-1 moves of the K/V block forward; backward the block again (cp-1 moves) and its float32
      // gradient (cp moves, the last one home).
      EXPECT_EQ(stats["forward"]["send"].count, 2 * (n - 1)) << comm.summary();
      EXPECT_EQ(stats["forward"]["send"].bytes, 2 * (n - 1) * kv_bytes) << comm.summary();
      EXPECT_EQ(stats["backward"]["send"].count, 2 * (n - 1) + 2 * n) << comm.summary();
      EXPECT_EQ(stats["backward"]["send"].bytes, 2 * (n - 1) * kv_bytes + 2 * n * kv_bytes) << comm.summary();
      EXPECT_EQ(comm.get_comm_count("all_to_all") + comm.get_comm_count("all_gather"), 0) << comm.summary();
    }
  }
}

// context_parallel_shard / unshard / positions: rank r holds chunks r and 2·cp-1-r of the
// sequence (PyTorch's head-tail test, on the values themselves), and unshard inverts shard.
TEST(ContextParallelAttentionDist, HeadTailShardsHoldChunksRAndTwoCpMinusOneMinusR) {
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  const int64_t n = cp.size(), r = cp.get_local_rank(0), seq = 6 * n, c = seq / (2 * n);
  const at::Tensor positions = at::arange(seq, at::kLong).view({1, seq}).expand({3, seq});
  const at::Tensor mine = hp::context_parallel_shard(positions, cp, 1, true);
  const at::Tensor expected = at::cat({at::arange(r * c, (r + 1) * c, at::kLong), at::arange((2 * n - 1 - r) * c, (2 * n - r) * c, at::kLong)});
  for (int64_t row = 0; row < 3; ++row) EXPECT_TRUE(at::equal(mine[row], expected)) << mine;
  EXPECT_TRUE(at::equal(hp::context_parallel_positions(seq, cp, true), expected));
  EXPECT_TRUE(at::equal(hp::context_parallel_shard(positions, cp, 1, false)[0], at::arange(r * seq / n, (r + 1) * seq / n, at::kLong)));
  for (bool lb : {false, true}) {
    const at::Tensor x = hp_test::random({2, seq, 3}, 9);
    EXPECT_TRUE(at::equal(hp::context_parallel_unshard(hp::context_parallel_shard(x, cp, 1, lb), cp, 1, lb), x)) << lb;
  }
}

// Every refusal names what was wrong, on every rank, and leaves the module usable.
TEST(ContextParallelAttentionDist, BadInputsAreRefusedByName) {
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  const int64_t n = cp.size();
  const auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "no error";
  };
  // Sequence lengths cp (2·cp with load balancing) does not divide.
  const at::Tensor odd = at::zeros({1, 2 * n + 1}, at::kLong), single = at::zeros({1, 2 * n + n}, at::kLong);
  EXPECT_NE(message([&] { hp::context_parallel_shard(odd, cp, 1, false); })
                .find("hyper_parallel::context_parallel_shard: a sequence of " + std::to_string(2 * n + 1) + " positions cannot be split over cp = " +
                      std::to_string(n)),
            std::string::npos);
  EXPECT_NE(message([&] { hp::context_parallel_shard(single, cp, 1, true); }).find("with load_balance (2·cp = " + std::to_string(2 * n)),
            std::string::npos);
  EXPECT_NE(message([&] { hp::context_parallel_positions(3 * n, cp, true); }).find("hyper_parallel::context_parallel_positions:"),
            std::string::npos);
  EXPECT_NE(message([&] { hp::ContextParallel("zigzag"); }).find("hyper_parallel::ContextParallel::ContextParallel: mode must be"),
            std::string::npos);
  // Not an attention module; load balancing of non-causal attention; attention dropout.
  hnn::Linear linear(4, 4);
  EXPECT_NE(message([&] { hp::ContextParallel().apply(*linear, cp); }).find("is not a ScaledDotProductAttention module"), std::string::npos);
  hnn::ScaledDotProductAttention full;
  EXPECT_NE(message([&] { hp::ContextParallel("ring", true).apply(*full, cp); }).find("is not causal; load_balance"), std::string::npos);
  hnn::ScaledDotProductAttention dropping(hnn::ScaledDotProductAttentionOptions().is_causal(true).dropout_p(0.1));
  EXPECT_NE(message([&] { hp::ContextParallel().apply(*dropping, cp); }).find("has attention dropout 0.1"), std::string::npos);
  // Ulysses with query heads cp does not divide; an explicit mask; an odd load-balanced shard.
  hnn::ScaledDotProductAttention sdpa(hnn::ScaledDotProductAttentionOptions().is_causal(true));
  hp::ContextParallel("ulysses", true).apply(*sdpa, cp);
  EXPECT_NE(message([&] { hp::ContextParallel().apply(*sdpa, cp); }).find("already runs through a forward wrapper"), std::string::npos);
  const at::Tensor q3 = at::zeros({1, 2 * n - 1, 4, 8}), kv3 = at::zeros({1, 1, 4, 8});
  EXPECT_NE(message([&] { sdpa(q3, kv3, kv3); }).find("ulysses splits the " + std::to_string(2 * n - 1) + " query heads"), std::string::npos);
  const at::Tensor q = at::zeros({1, 2 * n, 4, 8}), kv = at::zeros({1, 2, 4, 8});
  EXPECT_NE(message([&] { sdpa(q, kv, kv, at::zeros({4, 4}, at::kBool)); }).find("an explicit attention mask"), std::string::npos);
  const at::Tensor q_odd = at::zeros({1, 2 * n, 3, 8}), kv_odd = at::zeros({1, 2, 3, 8});
  EXPECT_NE(message([&] { sdpa(q_odd, kv_odd, kv_odd); }).find("load_balance needs an even number of positions per rank"), std::string::npos);
  // The module still works.
  EXPECT_EQ(sdpa(q, kv, kv).sizes(), q.sizes());
}

}  // namespace t_dist_context_parallel_context_parallel_attention_test
