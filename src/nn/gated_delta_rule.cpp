// The Gated DeltaNet's sequence mixing on plain tensors (nn/gated_delta_rule.h).
#include <hyper_parallel/nn/gated_delta_rule.h>

#include <ATen/ATen.h>

#include <hyper_parallel/runtime/errors.h>

#include <cmath>
#include <limits>

namespace hyper_parallel {
namespace nn {
namespace functional {
namespace {

// The inputs in the rule's working layout: float32, heads before tokens, q and k repeated to the
// value heads and normalised, q scaled.
struct Prepared {
  at::Tensor q, k, v, g, beta, state;  // [B, nv, S, dk|dv], [B, nv, S], [B, nv, dk, dv]
};

Prepared prepare(const char* what, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                 const at::Tensor& beta, const at::Tensor& initial_state, bool use_qk_l2norm) {
  HP_CHECK_T(c10::ValueError, query.dim() == 4 && key.sizes() == query.sizes() && value.dim() == 4 && value.size(0) == key.size(0) &&
                                  value.size(1) == key.size(1),
             "hyper_parallel::nn::functional::", what, ": expected query and key [B, S, nk, dk] and value [B, S, nv, dv], got ",
             query.sizes(), ", ", key.sizes(), " and ", value.sizes());
  const int64_t b = key.size(0), s = key.size(1), nk = key.size(2), dk = key.size(3), nv = value.size(2), dv = value.size(3);
  HP_CHECK_T(c10::ValueError, nk > 0 && nv % nk == 0, "hyper_parallel::nn::functional::", what, ": the value heads (", nv,
             ") must be a multiple of the key heads (", nk, ")");
  const std::vector<int64_t> gate_shape{b, s, nv};
  HP_CHECK_T(c10::ValueError, g.sizes() == at::IntArrayRef(gate_shape) && beta.sizes() == at::IntArrayRef(gate_shape),
             "hyper_parallel::nn::functional::", what, ": expected g and beta [B, S, nv] = ", at::IntArrayRef(gate_shape), ", got ",
             g.sizes(), " and ", beta.sizes());
  const std::vector<int64_t> state_shape{b, nv, dk, dv};
  HP_CHECK_T(c10::ValueError, !initial_state.defined() || initial_state.sizes() == at::IntArrayRef(state_shape),
             "hyper_parallel::nn::functional::", what, ": expected initial_state [B, nv, dk, dv] = ", at::IntArrayRef(state_shape),
             ", got ", initial_state.sizes());
  auto heads_first = [](const at::Tensor& t) { return t.transpose(1, 2).to(at::kFloat).contiguous(); };
  Prepared p;
  at::Tensor q = query, k = key;
  if (nv != nk) {
    q = q.repeat_interleave(nv / nk, 2);
    k = k.repeat_interleave(nv / nk, 2);
  }
  p.q = heads_first(q);
  p.k = heads_first(k);
  p.v = heads_first(value);
  p.g = heads_first(g);
  p.beta = heads_first(beta);
  if (use_qk_l2norm) {
    // eps added to the sum of squares, not to the norm, as the FLA kernels do.
    p.q = p.q * at::rsqrt(p.q.pow(2).sum(-1, /*keepdim=*/true) + 1e-6);
    p.k = p.k * at::rsqrt(p.k.pow(2).sum(-1, /*keepdim=*/true) + 1e-6);
  }
  p.q = p.q * (1.0 / std::sqrt(static_cast<double>(dk)));
  p.state = initial_state.defined() ? initial_state.to(at::kFloat) : at::zeros({b, nv, dk, dv}, p.v.options());
  return p;
}

}  // namespace

GatedDeltaRuleOutput chunk_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                                            const at::Tensor& beta, const at::Tensor& initial_state, bool use_qk_l2norm, int64_t chunk_size) {
  HP_CHECK_T(c10::ValueError, chunk_size > 0, "hyper_parallel::nn::functional::chunk_gated_delta_rule: chunk_size must be positive, got ",
             chunk_size);
  Prepared p = prepare("chunk_gated_delta_rule", query, key, value, g, beta, initial_state, use_qk_l2norm);
  const int64_t b = p.v.size(0), h = p.v.size(1), s = p.v.size(2), dk = p.q.size(3), dv = p.v.size(3), c = chunk_size;
  if (s == 0) return {at::empty_like(value), p.state};
  const int64_t pad = (c - s % c) % c, n = (s + pad) / c;
  if (pad > 0) {
    // g = 0 (no decay) and beta = 0 (no write): padded tokens leave the state as it is.
    for (at::Tensor* t : {&p.q, &p.k, &p.v}) *t = at::constant_pad_nd(*t, {0, 0, 0, pad});
    for (at::Tensor* t : {&p.g, &p.beta}) *t = at::constant_pad_nd(*t, {0, pad});
  }
  const at::Tensor v_beta = (p.v * p.beta.unsqueeze(-1)).view({b, h, n, c, dv});
  const at::Tensor k_beta = (p.k * p.beta.unsqueeze(-1)).view({b, h, n, c, dk});
  const at::Tensor q = p.q.view({b, h, n, c, dk}), k = p.k.view({b, h, n, c, dk});
  const at::Tensor cum = p.g.view({b, h, n, c}).cumsum(-1);  // the log decay from the chunk's start
  // exp(cum_i - cum_j) for j <= i; above the diagonal the difference can be large and positive,
  // so it is masked to -inf before exp, never after.
  const at::Tensor upper = at::ones({c, c}, p.q.options().dtype(at::kBool)).triu(1);
  const at::Tensor decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, -std::numeric_limits<double>::infinity()).exp();
  const at::Tensor k_t = k.transpose(-1, -2);
  // The UT transform: (I + strictly-lower(A))^-1 with A = (beta k) k^T (.) decay turns the chunk's
  // sequential writes into two products (unitriangular: A's diagonal is not used).
  const at::Tensor system = at::matmul(k_beta, k_t) * decay;
  // One solve for both right-hand sides: [v·beta | k·beta·exp(cum)].
  const at::Tensor uw = at::linalg_solve_triangular(system, at::cat({v_beta, k_beta * cum.exp().unsqueeze(-1)}, -1), /*upper=*/false,
                                                    /*left=*/true, /*unitriangular=*/true);
  const at::Tensor u = uw.narrow(-1, 0, dv), w = uw.narrow(-1, dv, dk);
  const at::Tensor intra = at::matmul(q, k_t) * decay;  // the diagonal included: a token reads its own write
  const at::Tensor q_decayed = q * cum.exp().unsqueeze(-1);
  const at::Tensor last = cum.narrow(-1, c - 1, 1);
  const at::Tensor k_decayed = k * (last - cum).exp().unsqueeze(-1);
  const at::Tensor chunk_decay = last.exp().unsqueeze(-1);  // [B, h, n, 1, 1]
  at::Tensor state = p.state;
  std::vector<at::Tensor> outs;
  outs.reserve(static_cast<size_t>(n));
  // The chunks as separate tensors: unbind's backward stacks the chunks' gradients once, where a
  // select per chunk would add each into a zero tensor of the whole (quadratic in the chunks).
  const std::vector<at::Tensor> us = u.unbind(2), ws = w.unbind(2), qs = q_decayed.unbind(2), intras = intra.unbind(2),
                                decays = chunk_decay.unbind(2), ks = k_decayed.transpose(-1, -2).unbind(2);
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    const at::Tensor v_new = us[i] - at::matmul(ws[i], state);
    outs.push_back(at::matmul(qs[i], state) + at::matmul(intras[i], v_new));
    state = state * decays[i] + at::matmul(ks[i], v_new);
  }
  const at::Tensor o = at::stack(outs, 2).view({b, h, n * c, dv}).narrow(2, 0, s);
  return {o.transpose(1, 2).contiguous().to(query.scalar_type()), state};
}

GatedDeltaRuleOutput recurrent_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                                                const at::Tensor& beta, const at::Tensor& initial_state, bool use_qk_l2norm) {
  Prepared p = prepare("recurrent_gated_delta_rule", query, key, value, g, beta, initial_state, use_qk_l2norm);
  const int64_t s = p.v.size(2);
  const at::Tensor decay = p.g.exp();
  at::Tensor state = p.state;
  std::vector<at::Tensor> outs;
  outs.reserve(static_cast<size_t>(s));
  for (int64_t t = 0; t < s; ++t) {
    const at::Tensor q_t = p.q.select(2, t).unsqueeze(-2), k_t = p.k.select(2, t);  // [B, h, 1, dk], [B, h, dk]
    state = state * decay.select(2, t).unsqueeze(-1).unsqueeze(-1);
    const at::Tensor predicted = at::matmul(k_t.unsqueeze(-2), state).squeeze(-2);  // S^T k, [B, h, dv]
    const at::Tensor delta = (p.v.select(2, t) - predicted) * p.beta.select(2, t).unsqueeze(-1);
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    outs.push_back(at::matmul(q_t, state).squeeze(-2));
  }
  if (s == 0) return {at::empty_like(value), state};
  return {at::stack(outs, 2).transpose(1, 2).contiguous().to(query.scalar_type()), state};
}

CausalConv1dOutput causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& state) {
  HP_CHECK_T(c10::ValueError, x.dim() == 3 && weight.dim() == 2 && weight.size(0) == x.size(2) && weight.size(1) > 0,
             "hyper_parallel::nn::functional::causal_conv1d: expected x [B, S, C] and weight [C, K], got ", x.sizes(), " and ",
             weight.sizes());
  const int64_t b = x.size(0), s = x.size(1), ch = x.size(2), kc = weight.size(1);
  const std::vector<int64_t> state_shape{b, ch, kc};
  HP_CHECK_T(c10::ValueError, !state.defined() || state.sizes() == at::IntArrayRef(state_shape),
             "hyper_parallel::nn::functional::causal_conv1d: expected state [B, C, K] = ", at::IntArrayRef(state_shape), ", got ",
             state.sizes());
  const at::Tensor xt = x.transpose(1, 2).to(weight.scalar_type());
  const at::Tensor before = state.defined() ? state.to(weight.scalar_type()) : at::zeros(state_shape, xt.options());
  const at::Tensor full = at::cat({before, xt}, 2);  // [B, C, K + S]
  // K + S inputs give S + 1 outputs; the first reads only the state.
  const std::vector<int64_t> one{1}, none{0};
  const at::Tensor y = at::conv1d(full, weight.unsqueeze(1), at::Tensor(), one, none, one, ch).narrow(2, 1, s);
  return {at::silu(y).transpose(1, 2).to(x.scalar_type()), full.narrow(2, s, kc).to(x.scalar_type())};
}

}  // namespace functional
}  // namespace nn
}  // namespace hyper_parallel
