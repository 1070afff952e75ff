// LinearAttentionContextParallel on a GatedDeltaNet module against one process, in each mode
// (ulysses, all_gather, p2p) at the job's cp (2 or 4): the output, the gradients of q, k, v, a, b
// and of every parameter (summed over the cp ranks) per tensor within 1e-5·max|ref| in float32,
// and 1e-2·max|ref| in bfloat16 against one process computing in bfloat16. 4 key heads serve 8
// value heads, dk = 8 != dv = 6, chunks of 16 tokens, so each rank's shard spans several chunks
// and ends in a padded one; ulysses also runs with one token per rank. The collectives of each
// mode are counted, forward and backward, against the formulas: ulysses 2 all-to-alls each way;
// all_gather one all-gather of B·nv·dk·(dv+dk) float32 and a halo of B·(K-1)·conv_dim to the
// next rank; p2p a state of B·nv·dk·dv float32 and the halo to the next rank. And the refusals.
#include <gtest/gtest.h>

#include <cmath>

#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/nn/gated_delta_net.h>

#include "../../common/test_util.h"

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_context_parallel_linear_attention_context_parallel_test {
namespace {

constexpr int64_t kBatch = 2, kKeyHeads = 4, kValueHeads = 8, kDk = 8, kDv = 6, kKernel = 4, kChunk = 16;

hnn::GatedDeltaNetOptions options() {
  return hnn::GatedDeltaNetOptions(kKeyHeads, kValueHeads, kDk, kDv).conv_kernel_size(kKernel).chunk_size(kChunk);
}

// q, k, v, a, b of the whole sequence, and the output's upstream gradient.
struct Inputs {
  std::vector<at::Tensor> x;
  at::Tensor grad_out;
};

Inputs inputs(int64_t seq, at::ScalarType dtype) {
  Inputs in;
  const int64_t key_dim = kKeyHeads * kDk, value_dim = kValueHeads * kDv;
  in.x = {hp_test::random({kBatch, seq, key_dim}, 1), hp_test::random({kBatch, seq, key_dim}, 2), hp_test::random({kBatch, seq, value_dim}, 3),
          hp_test::random({kBatch, seq, kValueHeads}, 4), hp_test::random({kBatch, seq, kValueHeads}, 5)};
  for (auto& t : in.x) t = t.to(dtype);
  in.grad_out = hp_test::random({kBatch, seq, kValueHeads, kDv}, 6).to(dtype);
  return in;
}

// The module's output, the inputs' gradients and the parameters' gradients (by name).
struct Result {
  at::Tensor out;
  std::vector<at::Tensor> input_grads;
  std::map<std::string, at::Tensor> param_grads;
};

// The decays the module starts with, or ones that keep the state: slow (A_log = log 0.01,
// dt_bias = -4: g a few 1e-4 per token) and none (exp(A_log) underflows to 0: g = 0). With these
// the incoming state reaches every token of a shard, not only its first few.
enum class Decay { Init, Slow, Zero };

hnn::GatedDeltaNet module(at::ScalarType dtype, Decay decay = Decay::Init) {
  hp_test::manual_seed(7);
  hnn::GatedDeltaNet gdn(options());
  if (decay != Decay::Init) {
    at::NoGradGuard no_grad;
    gdn->parameter("A_log").fill_(decay == Decay::Slow ? std::log(0.01) : -1e4);
    gdn->parameter("dt_bias").fill_(decay == Decay::Slow ? -4.0 : 0.0);
  }
  gdn->to(dtype);
  return gdn;
}

Result one_process(const Inputs& in, at::ScalarType dtype, Decay decay = Decay::Init) {
  hnn::GatedDeltaNet gdn = module(dtype, decay);
  std::vector<at::Tensor> x;
  for (const auto& t : in.x) x.push_back(t.detach().clone().requires_grad_());
  const at::Tensor out = gdn(x[0], x[1], x[2], x[3], x[4]);
  (out.to(at::kFloat) * in.grad_out.to(at::kFloat)).sum().backward();
  Result r{out.detach(), {}, {}};
  for (const auto& t : x) r.input_grads.push_back(t.grad());
  for (const auto& p : gdn->named_parameters()) r.param_grads[p.key()] = p.value().grad();
  return r;
}

Result context_parallel(const std::string& mode, const hp::DeviceMesh& cp, const Inputs& in, at::ScalarType dtype,
                        Decay decay = Decay::Init) {
  hnn::GatedDeltaNet gdn = module(dtype, decay);
  hp::LinearAttentionContextParallel(mode).apply(*gdn, cp);
  const auto shard = [&](const at::Tensor& t) { return hp::context_parallel_shard(t.detach(), cp, 1, false); };
  std::vector<at::Tensor> x;
  for (const auto& t : in.x) x.push_back(shard(t).requires_grad_());
  const at::Tensor out = gdn(x[0], x[1], x[2], x[3], x[4]);
  (out.to(at::kFloat) * shard(in.grad_out).to(at::kFloat)).sum().backward();
  const auto unshard = [&](const at::Tensor& t) { return hp::context_parallel_unshard(t, cp, 1, false); };
  Result r{unshard(out.detach()), {}, {}};
  for (const auto& t : x) r.input_grads.push_back(unshard(t.grad()));
  for (const auto& p : gdn->named_parameters()) {
    at::Tensor g = p.value().grad().to(at::kFloat);  // summed in float32, as a gradient all-reduce does
    hp::all_reduce_(g, hp::ReduceOp::SUM, cp.get_group(0));
    r.param_grads[p.key()] = g;
  }
  return r;
}

// max|got - ref| <= rel · max|ref|, with the measured ratio in the message.
::testing::AssertionResult within(const at::Tensor& got, const at::Tensor& ref, double rel) {
  if (got.sizes() != ref.sizes()) return ::testing::AssertionFailure() << "shape " << got.sizes() << " != " << ref.sizes();
  const double scale = ref.to(at::kFloat).abs().max().item<double>();
  const double diff = (got.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>();
  // A reference of zeros (A_log's gradient when exp(A_log) underflows) is met only exactly.
  if ((scale > 0 && diff <= rel * scale) || (scale == 0 && diff == 0)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << diff << " = " << diff / scale << " · max|ref| (" << scale << "), allowed " << rel;
}

void matches_one_process(const std::string& mode, int64_t seq, at::ScalarType dtype, Decay decay = Decay::Init) {
  SCOPED_TRACE(mode + " seq " + std::to_string(seq) + " " + c10::toString(dtype) +
               (decay == Decay::Slow ? " slow decay" : decay == Decay::Zero ? " zero decay" : ""));
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  const Inputs in = inputs(seq, dtype);
  const Result ref = one_process(in, dtype, decay), got = context_parallel(mode, cp, in, dtype, decay);
  const double rel = dtype == at::kFloat ? 1e-5 : 1e-2;
  EXPECT_TRUE(within(got.out, ref.out, rel)) << "output";
  // Each shard's first token, on its own scale: what the incoming state decides most.
  const int64_t shard = seq / cp.size(0);
  for (int64_t r = 1; r < cp.size(0) && seq % cp.size(0) == 0; ++r)
    EXPECT_TRUE(within(got.out.select(1, r * shard), ref.out.select(1, r * shard), rel)) << "the first token of shard " << r;
  const char* names[] = {"q", "k", "v", "a", "b"};
  for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(within(got.input_grads[i], ref.input_grads[i], rel)) << "grad of " << names[i];
  for (const auto& [name, g] : ref.param_grads) EXPECT_TRUE(within(got.param_grads.at(name), g, rel)) << "grad of " << name;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

}  // namespace

TEST(LinearAttentionContextParallelDist, EveryModeMatchesOneProcessInFloat32) {
  const int64_t cp = hp::get_world_size();
  if (cp != 2 && cp != 4) GTEST_SKIP() << "2 or 4 ranks";
  // 76 tokens: 38 per rank at cp = 2 (three chunks, the last padded), 19 at cp = 4.
  for (const char* mode : {"ulysses", "all_gather", "p2p"}) matches_one_process(mode, 76, at::kFloat);
  // One token per rank: the whole sequence is cp tokens long.
  matches_one_process("ulysses", cp, at::kFloat);
}

// Slow and zero decays: the incoming state reaches every token of a shard, so the fold over the
// ranks before (all_gather), the state passed rank to rank (p2p) and the whole-sequence run
// (ulysses) are each exercised across every hop, not only at a shard's first tokens.
TEST(LinearAttentionContextParallelDist, EveryModeMatchesOneProcessWithSlowAndZeroDecays) {
  const int64_t cp = hp::get_world_size();
  if (cp != 2 && cp != 4) GTEST_SKIP() << "2 or 4 ranks";
  for (Decay decay : {Decay::Slow, Decay::Zero})
    for (const char* mode : {"ulysses", "all_gather", "p2p"}) matches_one_process(mode, 76, at::kFloat, decay);
}

TEST(LinearAttentionContextParallelDist, EveryModeMatchesOneProcessInBfloat16) {
  const int64_t cp = hp::get_world_size();
  if (cp != 2 && cp != 4) GTEST_SKIP() << "2 or 4 ranks";
  for (const char* mode : {"ulysses", "all_gather", "p2p"}) matches_one_process(mode, 76, at::kBFloat16);
}

TEST(LinearAttentionContextParallelDist, CollectivesMatchTheFormulas) {
  const int64_t cp = hp::get_world_size();
  if (cp != 2 && cp != 4) GTEST_SKIP() << "2 or 4 ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {cp}, {"cp"});
  const int64_t rank = mesh.get_local_rank(0), seq = 16 * cp;
  const Inputs in = inputs(seq, at::kFloat);
  const int64_t conv_dim = 2 * kKeyHeads * kDk + kValueHeads * kDv;
  const int64_t halo_bytes = kBatch * (kKernel - 1) * conv_dim * 4;
  const int64_t state_bytes = kBatch * kValueHeads * kDk * kDv * 4;
  const int64_t summary_bytes = kBatch * kValueHeads * kDk * (kDv + kDk) * 4;
  const bool sends = rank + 1 < cp, receives = rank > 0;
  for (const char* mode : {"ulysses", "all_gather", "p2p"}) {
    SCOPED_TRACE(mode);
    hnn::GatedDeltaNet gdn = module(at::kFloat);
    hp::LinearAttentionContextParallel(mode).apply(*gdn, mesh);
    std::vector<at::Tensor> x;
    for (const auto& t : in.x) x.push_back(hp::context_parallel_shard(t, mesh, 1, false).requires_grad_());
    const at::Tensor grad_out = hp::context_parallel_shard(in.grad_out, mesh, 1, false);
    hp::CommDebugMode comm;
    (gdn(x[0], x[1], x[2], x[3], x[4]) * grad_out).sum().backward();
    auto stats = comm.get_comm_group_stats()[mesh.get_group(0).ranks()];
    auto& fwd = stats["forward"];
    auto& bwd = stats["backward"];
    const std::string m = mode;
    if (m == "ulysses") {
      EXPECT_EQ(fwd["all_to_all"].count, 2);
      EXPECT_EQ(bwd["all_to_all"].count, 2);
      EXPECT_EQ(fwd.count("send") + fwd.count("all_gather") + bwd.count("send"), 0u);
      continue;
    }
    EXPECT_EQ(fwd["send"].count, sends ? (m == "p2p" ? 2 : 1) : 0);
    EXPECT_EQ(fwd["send"].bytes, sends ? halo_bytes + (m == "p2p" ? state_bytes : 0) : 0);
    EXPECT_EQ(fwd["recv"].count, receives ? (m == "p2p" ? 2 : 1) : 0);
    // Backward sends the same bytes the other way.
    EXPECT_EQ(bwd["send"].bytes, receives ? halo_bytes + (m == "p2p" ? state_bytes : 0) : 0);
    EXPECT_EQ(bwd["send"].count, receives ? (m == "p2p" ? 2 : 1) : 0);
    if (m == "all_gather") {
      EXPECT_EQ(fwd["all_gather"].count, 1);
      EXPECT_EQ(fwd["all_gather"].bytes, summary_bytes);
      EXPECT_EQ(bwd["reduce_scatter"].count, 1);
    } else {
      EXPECT_EQ(fwd.count("all_gather") + bwd.count("reduce_scatter"), 0u);
    }
    EXPECT_EQ(fwd.count("all_to_all") + bwd.count("all_to_all"), 0u);
  }
}

TEST(LinearAttentionContextParallelDist, RefusalsNameWhatIsWrongOnEveryRank) {
  const int64_t cp = hp::get_world_size();
  if (cp != 4) GTEST_SKIP() << "4 ranks";
  const hp::DeviceMesh mesh = hp::init_device_mesh("cpu", {cp}, {"cp"});
  EXPECT_NE(error_of([] { hp::LinearAttentionContextParallel("ring"); }).find("mode must be \"ulysses\", \"all_gather\" or \"p2p\""),
            std::string::npos);
  // 2 key heads do not split over 4 ranks in ulysses; the module is left as it was.
  hnn::GatedDeltaNet few_heads(hnn::GatedDeltaNetOptions(2, 4, kDk, kDv));
  EXPECT_NE(error_of([&] { hp::LinearAttentionContextParallel("ulysses").apply(*few_heads, mesh); })
                .find("ulysses splits the 2 key heads and 4 value heads this rank holds over cp = 4"),
            std::string::npos);
  EXPECT_EQ(few_heads->forward_wrapper(), nullptr);
  hp::LinearAttentionContextParallel("p2p").apply(*few_heads, mesh);  // any head count in p2p
  // 8 tokens over 4 ranks: 2 per rank, fewer than the conv's halo of 3.
  hnn::GatedDeltaNet gdn(options());
  hp::LinearAttentionContextParallel("all_gather").apply(*gdn, mesh);
  const Inputs in = inputs(8, at::kFloat);
  const auto shard = [&](const at::Tensor& t) { return hp::context_parallel_shard(t, mesh, 1, false); };
  EXPECT_NE(error_of([&] { gdn(shard(in.x[0]), shard(in.x[1]), shard(in.x[2]), shard(in.x[3]), shard(in.x[4])); })
                .find("mode \"all_gather\" needs at least 3 positions per rank (the convolution's halo, conv_kernel_size - 1) and this "
                      "rank holds 2 (cp = 4)"),
            std::string::npos);
  // Applied twice: refused, naming the wrapper.
  EXPECT_NE(error_of([&] { hp::LinearAttentionContextParallel("p2p").apply(*gdn, mesh); }).find("already runs through a forward wrapper"),
            std::string::npos);
  // Not a GatedDeltaNet.
  hnn::Linear lin(4, 4);
  EXPECT_NE(error_of([&] { hp::LinearAttentionContextParallel().apply(*lin, mesh); }).find("is not a GatedDeltaNet module"), std::string::npos);
}

}  // namespace t_dist_context_parallel_linear_attention_context_parallel_test
