// The Gated DeltaNet's kernels against each other (transformers' own values are in
// tests/dist/nn/hf_gated_delta_rule_test.cpp): the chunked rule equals the per-token recurrence
// at every chunk size and sequence length (one chunk, several, padded, a single token, none), a
// prefill continued from its state equals one pass, gradients of the chunked form equal the
// recurrence's, and bad shapes are refused by name.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <hyper_parallel/nn/gated_delta_rule.h>

namespace fn = hyper_parallel::nn::functional;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_nn_gated_delta_rule_test {
namespace {

struct Inputs {
  at::Tensor q, k, v, g, beta, state;
};

// Random inputs of `s` tokens: 2 key heads for 4 value heads, dk = 8 != dv = 6, decays in (-1, 0].
Inputs inputs(int64_t s, uint64_t seed, int64_t b = 2) {
  auto gen = at::detail::createCPUGenerator(seed);
  Inputs in;
  in.q = at::randn({b, s, 2, 8}, gen);
  in.k = at::randn({b, s, 2, 8}, gen);
  in.v = at::randn({b, s, 4, 6}, gen);
  in.g = -at::softplus(at::randn({b, s, 4}, gen)) * 0.5;
  in.beta = at::sigmoid(at::randn({b, s, 4}, gen));
  in.state = at::randn({b, 4, 8, 6}, gen) * 0.3;
  return in;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

TEST(GatedDeltaRule, ChunkedEqualsTheRecurrenceAtEveryLengthAndChunkSize) {
  for (int64_t s : {1, 5, 16, 17, 64, 70, 130})
    for (int64_t chunk : {4, 16, 64}) {
      SCOPED_TRACE("S = " + std::to_string(s) + ", chunk " + std::to_string(chunk));
      const Inputs in = inputs(s, 10 + static_cast<uint64_t>(s));
      const auto rec = fn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.state);
      const auto chk = fn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.state, true, chunk);
      EXPECT_EQ(chk.output.sizes(), in.v.sizes());
      EXPECT_LE(max_diff(chk.output, rec.output), 1e-6);
      EXPECT_LE(max_diff(chk.final_state, rec.final_state), 1e-6);
      EXPECT_EQ(chk.final_state.scalar_type(), at::kFloat);
    }
}

TEST(GatedDeltaRule, PrefillContinuedFromItsStateEqualsOnePass) {
  const Inputs in = inputs(70, 3);
  const auto whole = fn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.state);
  auto part = [&](const at::Tensor& t, int64_t from, int64_t n) { return t.narrow(1, from, n); };
  const auto first = fn::chunk_gated_delta_rule(part(in.q, 0, 40), part(in.k, 0, 40), part(in.v, 0, 40), part(in.g, 0, 40),
                                                part(in.beta, 0, 40), in.state);
  const auto rest = fn::chunk_gated_delta_rule(part(in.q, 40, 29), part(in.k, 40, 29), part(in.v, 40, 29), part(in.g, 40, 29),
                                               part(in.beta, 40, 29), first.final_state);
  // The last token decoded one at a time from there.
  const auto last = fn::recurrent_gated_delta_rule(part(in.q, 69, 1), part(in.k, 69, 1), part(in.v, 69, 1), part(in.g, 69, 1),
                                                   part(in.beta, 69, 1), rest.final_state);
  EXPECT_LE(max_diff(at::cat({first.output, rest.output, last.output}, 1), whole.output), 1e-6);
  EXPECT_LE(max_diff(last.final_state, whole.final_state), 1e-6);
}

TEST(GatedDeltaRule, GradientsOfTheChunkedFormEqualTheRecurrences) {
  const Inputs in = inputs(37, 8);
  const at::Tensor wo = at::randn(in.v.sizes(), at::detail::createCPUGenerator(1));
  const at::Tensor ws = at::randn(in.state.sizes(), at::detail::createCPUGenerator(2));
  auto grads = [&](bool chunked) {
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& t : {in.q, in.k, in.v, in.g, in.beta, in.state}) leaves.push_back(t.clone().requires_grad_());
    const auto r = chunked ? fn::chunk_gated_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5], true, 16)
                           : fn::recurrent_gated_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5]);
    ((r.output * wo).sum() + (r.final_state * ws).sum()).backward();
    std::vector<at::Tensor> out;
    for (const auto& l : leaves) out.push_back(l.grad());
    return out;
  };
  const auto a = grads(true), b = grads(false);
  const char* names[] = {"query", "key", "value", "g", "beta", "initial_state"};
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined()) << names[i];
    EXPECT_LE(max_diff(a[i], b[i]), 1e-5 * std::max(1.0, b[i].abs().max().item<double>())) << names[i];
  }
}

TEST(GatedDeltaRule, NoTokensLeaveTheStateAndAZeroStateIsTheDefault) {
  const Inputs in = inputs(0, 4);
  const auto r = fn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.state);
  EXPECT_EQ(r.output.sizes(), in.v.sizes());
  EXPECT_TRUE(at::equal(r.final_state, in.state));
  const Inputs one = inputs(9, 5);
  const auto zero = fn::chunk_gated_delta_rule(one.q, one.k, one.v, one.g, one.beta, at::zeros_like(one.state));
  const auto none = fn::chunk_gated_delta_rule(one.q, one.k, one.v, one.g, one.beta);
  EXPECT_TRUE(at::equal(zero.output, none.output));
}

TEST(GatedDeltaRule, CausalConvContinuesFromItsState) {
  auto gen = at::detail::createCPUGenerator(6);
  const at::Tensor x = at::randn({2, 9, 5}, gen), w = at::randn({5, 4}, gen);
  const auto whole = fn::causal_conv1d(x, w);
  const auto first = fn::causal_conv1d(x.narrow(1, 0, 2), w);  // fewer tokens than the kernel
  const auto rest = fn::causal_conv1d(x.narrow(1, 2, 7), w, first.final_state);
  EXPECT_LE(max_diff(at::cat({first.output, rest.output}, 1), whole.output), 1e-6);
  EXPECT_TRUE(at::equal(rest.final_state, x.narrow(1, 5, 4).transpose(1, 2)));
  // Token t reads tokens t-3..t only: the first output is silu(w[:, 3] * x_0).
  EXPECT_LE(max_diff(whole.output.select(1, 0), at::silu(x.select(1, 0) * w.select(1, 3))), 1e-6);
}

TEST(GatedDeltaRule, StateSummariesOfPartsFoldedEqualTheSequentialStateAndGradients) {
  // Three parts, as three context-parallel ranks hold them: one of several chunks with padding,
  // one shorter than a chunk, one of a single token.
  const Inputs in = inputs(70, 21);
  const std::vector<std::pair<int64_t, int64_t>> parts{{0, 45}, {45, 24}, {69, 1}};
  auto leaf = [](const at::Tensor& t) { return t.detach().clone().requires_grad_(true); };
  const at::Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v), g = leaf(in.g), beta = leaf(in.beta), s0 = leaf(in.state);
  const auto whole = fn::chunk_gated_delta_rule(q, k, v, g, beta, s0, true, 16);
  // Folding the parts' summaries from s0 gives each part's incoming state; running each part from
  // it gives the whole sequence's outputs.
  at::Tensor state = s0;
  std::vector<at::Tensor> outs;
  for (const auto& [from, n] : parts) {
    auto part = [&, from = from, n = n](const at::Tensor& t) { return t.narrow(1, from, n); };
    const fn::ChunkedGatedDelta chunked(part(q), part(k), part(v), part(g), part(beta), true, 16);
    const fn::GatedDeltaStateSummary summary = chunked.summary();
    EXPECT_EQ(summary.transition.sizes(), (at::IntArrayRef{2, 4, 8, 8}));
    outs.push_back(chunked.run(state).output);
    state = fn::apply_state_summary(summary, state);
  }
  const at::Tensor folded_out = at::cat(outs, 1);
  EXPECT_LE(max_diff(state, whole.final_state), 1e-5 * whole.final_state.abs().max().item<double>());
  EXPECT_LE(max_diff(folded_out, whole.output), 1e-5 * whole.output.abs().max().item<double>());
  // A summary that ignored the incoming state (transition 0) or its decay must show.
  const fn::ChunkedGatedDelta second(in.q.narrow(1, 45, 24), in.k.narrow(1, 45, 24), in.v.narrow(1, 45, 24), in.g.narrow(1, 45, 24),
                                     in.beta.narrow(1, 45, 24), true, 16);
  EXPECT_GT((second.summary().transition - at::eye(8)).abs().max().item<double>(), 1e-2);
  // The same gradients through the summaries as through the sequential rule, for every input.
  const at::Tensor wo = at::randn_like(whole.output), ws = at::randn_like(whole.final_state);
  const std::vector<at::Tensor> leaves{q, k, v, g, beta, s0};
  const auto ref = torch::autograd::grad({(whole.output * wo).sum() + (whole.final_state * ws).sum()}, leaves);
  const auto got = torch::autograd::grad({(folded_out * wo).sum() + (state * ws).sum()}, leaves);
  for (size_t i = 0; i < leaves.size(); ++i)
    EXPECT_LE(max_diff(got[i], ref[i]), 1e-5 * ref[i].abs().max().item<double>()) << "input " << i;
  // The empty summary is the identity.
  EXPECT_LE(max_diff(fn::apply_state_summary({at::zeros({1, 1, 2, 3}), at::eye(2).expand({1, 1, 2, 2})}, at::ones({1, 1, 2, 3})),
                     at::ones({1, 1, 2, 3})),
            0.0);
}

// The fold applies each part's transition as it is (M·S). With slow decays, where the incoming
// state reaches every token of the next part, the same fold with one part's transition
// transposed by hand (Mᵀ·S, a plausible slip: each token's factor is symmetric, their product is
// not) is off by at least 100 times the tolerance the right fold meets.
TEST(GatedDeltaRule, FoldWithATransposedTransitionIsOffByFarMoreThanTheTolerance) {
  Inputs in = inputs(70, 21);
  in.g = in.g * 0.01;  // decays near 1
  const std::vector<std::pair<int64_t, int64_t>> parts{{0, 45}, {45, 24}, {69, 1}};
  const auto whole = fn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.state, true, 16);
  auto fold = [&](bool transpose_second) {
    at::Tensor state = in.state;
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < parts.size(); ++i) {
      auto part = [&](const at::Tensor& t) { return t.narrow(1, parts[i].first, parts[i].second); };
      const fn::ChunkedGatedDelta chunked(part(in.q), part(in.k), part(in.v), part(in.g), part(in.beta), true, 16);
      fn::GatedDeltaStateSummary summary = chunked.summary();
      if (transpose_second && i == 1) summary.transition = summary.transition.transpose(-1, -2).contiguous();
      outs.push_back(chunked.run(state).output);
      state = fn::apply_state_summary(summary, state);
    }
    // The larger of the outputs' and the final state's error, each relative to its max.
    return std::max(max_diff(at::cat(outs, 1), whole.output) / whole.output.abs().max().item<double>(),
                    max_diff(state, whole.final_state) / whole.final_state.abs().max().item<double>());
  };
  const double tolerance = 1e-5, right = fold(false), transposed = fold(true);
  EXPECT_LE(right, tolerance);
  EXPECT_GE(transposed, 100 * tolerance) << "a transposed transition went unnoticed: relative error " << transposed;
}

TEST(GatedDeltaRule, BadShapesAreRefusedByName) {
  const Inputs in = inputs(4, 7);
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const c10::ValueError& e) {
      return e.what_without_backtrace();
    }
    return "no error";
  };
  EXPECT_NE(message([&] { fn::chunk_gated_delta_rule(in.q, in.k, in.v.narrow(2, 0, 3), in.g.narrow(2, 0, 3), in.beta.narrow(2, 0, 3)); })
                .find("chunk_gated_delta_rule: the value heads (3) must be a multiple of the key heads (2)"),
            std::string::npos);
  EXPECT_NE(message([&] { fn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g.narrow(1, 0, 3), in.beta); })
                .find("recurrent_gated_delta_rule: expected g and beta [B, S, nv] = [2, 4, 4]"),
            std::string::npos);
  EXPECT_NE(message([&] { fn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.state.narrow(2, 0, 4)); })
                .find("expected initial_state [B, nv, dk, dv] = [2, 4, 8, 6]"),
            std::string::npos);
  EXPECT_NE(message([&] { fn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, {}, true, 0); }).find("chunk_size must be positive"),
            std::string::npos);
  EXPECT_NE(message([&] { fn::causal_conv1d(at::zeros({1, 3, 5}), at::zeros({4, 4})); }).find("causal_conv1d: expected x [B, S, C] and weight [C, K]"),
            std::string::npos);
}

}  // namespace t_unit_nn_gated_delta_rule_test
