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

void check_inputs(const char* what, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                  const at::Tensor& beta, const at::Tensor& initial_state) {
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
}

// Checked by check_inputs first.
Prepared prepare(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g, const at::Tensor& beta,
                 const at::Tensor& initial_state, bool use_qk_l2norm) {
  const int64_t b = key.size(0), nk = key.size(2), dk = key.size(3), nv = value.size(2), dv = value.size(3);
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

// Everything of the chunked rule that depends on this call's tokens only, per chunk: the UT
// transform's u and w, the decayed queries, the intra-chunk scores, the decayed keys and the
// chunk's total decay. The state enters only through ChunkedGatedDelta::scan.
struct ChunkedGatedDelta::Chunks {
  int64_t batch = 0, heads = 0, seq = 0, dk = 0, dv = 0, chunk = 0;
  at::ScalarType out_dtype = at::kFloat;
  at::TensorOptions options;  // float32 on the inputs' device
  std::vector<at::Tensor> u, w, q, intra, decay, k_t;  // one per chunk
};

ChunkedGatedDelta::ChunkedGatedDelta(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                                     const at::Tensor& beta, bool use_qk_l2norm, int64_t chunk_size) {
  HP_CHECK_T(c10::ValueError, chunk_size > 0, "hyper_parallel::nn::functional::ChunkedGatedDelta: chunk_size must be positive, got ",
             chunk_size);
  check_inputs("ChunkedGatedDelta", query, key, value, g, beta, at::Tensor());
  Prepared p = prepare(query, key, value, g, beta, at::Tensor(), use_qk_l2norm);
  auto built = std::make_shared<Chunks>();
  chunks_ = built;
  Chunks& ch = *built;
  const int64_t b = p.v.size(0), h = p.v.size(1), s = p.v.size(2), dk = p.q.size(3), dv = p.v.size(3), c = chunk_size;
  ch.batch = b;
  ch.heads = h;
  ch.seq = s;
  ch.dk = dk;
  ch.dv = dv;
  ch.chunk = c;
  ch.out_dtype = query.scalar_type();
  ch.options = p.v.options();
  if (s == 0) return;
  const int64_t pad = (c - s % c) % c, n = (s + pad) / c;
  if (pad > 0) {
    // g = 0 (no decay) and beta = 0 (no write): padded tokens leave the state as it is.
    for (at::Tensor* t : {&p.q, &p.k, &p.v}) *t = at::constant_pad_nd(*t, {0, 0, 0, pad});
    for (at::Tensor* t : {&p.g, &p.beta}) *t = at::constant_pad_nd(*t, {0, pad});
  }
  const at::Tensor v_beta = (p.v * p.beta.unsqueeze(-1)).view({b, h, n, c, dv});
  const at::Tensor k_beta = (p.k * p.beta.unsqueeze(-1)).view({b, h, n, c, dk});
  const at::Tensor q = p.q.view({b, h, n, c, dk}), k = p.k.view({b, h, n, c, dk});
  // The log decay from the chunk's start, and the decays from it, in float64: the gates' gradient
  // comes back through these sums and differences of logs, where float32 loses digits.
  const at::Tensor cum = p.g.view({b, h, n, c}).to(at::kDouble).cumsum(-1);
  // exp(cum_i - cum_j) for j <= i; above the diagonal the difference can be large and positive,
  // so it is masked to -inf before exp, never after.
  const at::Tensor upper = at::ones({c, c}, p.q.options().dtype(at::kBool)).triu(1);
  const at::Tensor decay =
      (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, -std::numeric_limits<double>::infinity()).exp().to(at::kFloat);
  const at::Tensor cum_decay = cum.exp().to(at::kFloat);
  const at::Tensor k_t = k.transpose(-1, -2);
  // The UT transform: (I + strictly-lower(A))^-1 with A = (beta k) k^T (.) decay turns the chunk's
  // sequential writes into two products (unitriangular: A's diagonal is not used).
  const at::Tensor system = at::matmul(k_beta, k_t) * decay;
  // One solve for both right-hand sides: [v·beta | k·beta·exp(cum)].
  const at::Tensor uw = at::linalg_solve_triangular(system, at::cat({v_beta, k_beta * cum_decay.unsqueeze(-1)}, -1), /*upper=*/false,
                                                    /*left=*/true, /*unitriangular=*/true);
  const at::Tensor last = cum.narrow(-1, c - 1, 1);
  // The chunks as separate tensors: unbind's backward stacks the chunks' gradients once, where a
  // select per chunk would add each into a zero tensor of the whole (quadratic in the chunks).
  ch.u = uw.narrow(-1, 0, dv).unbind(2);
  ch.w = uw.narrow(-1, dv, dk).unbind(2);
  ch.intra = (at::matmul(q, k_t) * decay).unbind(2);  // the diagonal included: a token reads its own write
  ch.q = (q * cum_decay.unsqueeze(-1)).unbind(2);
  ch.decay = last.exp().to(at::kFloat).unsqueeze(-1).unbind(2);  // [B, h, 1, 1] each
  ch.k_t = (k * (last - cum).exp().to(at::kFloat).unsqueeze(-1)).transpose(-1, -2).unbind(2);
}

at::Tensor ChunkedGatedDelta::scan(at::Tensor state, bool outputs, std::vector<at::Tensor>* out) const {
  const Chunks& ch = *chunks_;
  // Per chunk: state_out = decay·state + k_t·(u - w·state), the output read from the state on entry.
  for (size_t i = 0; i < ch.u.size(); ++i) {
    at::Tensor u = ch.u[i];
    if (!outputs && state.size(-1) != u.size(-1)) {
      // The summary's extended state [S | M]: M's columns take no write of their own.
      u = at::constant_pad_nd(u, {0, state.size(-1) - u.size(-1)});
    }
    const at::Tensor v_new = u - at::matmul(ch.w[i], state);
    if (outputs) out->push_back(at::matmul(ch.q[i], state) + at::matmul(ch.intra[i], v_new));
    state = state * ch.decay[i] + at::matmul(ch.k_t[i], v_new);
  }
  return state;
}

GatedDeltaRuleOutput ChunkedGatedDelta::run(const at::Tensor& initial_state) const {
  const Chunks& ch = *chunks_;
  const std::vector<int64_t> state_shape{ch.batch, ch.heads, ch.dk, ch.dv};
  HP_CHECK_T(c10::ValueError, !initial_state.defined() || initial_state.sizes() == at::IntArrayRef(state_shape),
             "hyper_parallel::nn::functional::ChunkedGatedDelta::run: expected initial_state [B, nv, dk, dv] = ", at::IntArrayRef(state_shape),
             ", got ", initial_state.sizes());
  const at::Tensor state = initial_state.defined() ? initial_state.to(at::kFloat) : at::zeros(state_shape, ch.options);
  if (ch.seq == 0) return {at::empty({ch.batch, 0, ch.heads, ch.dv}, ch.options.dtype(ch.out_dtype)), state};
  std::vector<at::Tensor> outs;
  outs.reserve(ch.u.size());
  at::Tensor final_state = scan(state, /*outputs=*/true, &outs);
  const int64_t n = static_cast<int64_t>(ch.u.size());
  const at::Tensor o = at::stack(outs, 2).view({ch.batch, ch.heads, n * ch.chunk, ch.dv}).narrow(2, 0, ch.seq);
  return {o.transpose(1, 2).contiguous().to(ch.out_dtype), final_state};
}

GatedDeltaStateSummary ChunkedGatedDelta::summary() const {
  const Chunks& ch = *chunks_;
  // One scan of the extended state [S | M] from [0 | I]: the state part takes the chunks' writes,
  // the identity part only their linear action, which is M.
  const at::Tensor eye = at::eye(ch.dk, ch.options).expand({ch.batch, ch.heads, ch.dk, ch.dk});
  const at::Tensor start = at::cat({at::zeros({ch.batch, ch.heads, ch.dk, ch.dv}, ch.options), eye}, -1);
  const at::Tensor end = scan(start, /*outputs=*/false, nullptr);
  return {end.narrow(-1, 0, ch.dv), end.narrow(-1, ch.dv, ch.dk)};
}

GatedDeltaRuleOutput chunk_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                                            const at::Tensor& beta, const at::Tensor& initial_state, bool use_qk_l2norm, int64_t chunk_size) {
  HP_CHECK_T(c10::ValueError, chunk_size > 0, "hyper_parallel::nn::functional::chunk_gated_delta_rule: chunk_size must be positive, got ",
             chunk_size);
  // The state's shape is checked before any work, under this function's name.
  check_inputs("chunk_gated_delta_rule", query, key, value, g, beta, initial_state);
  return ChunkedGatedDelta(query, key, value, g, beta, use_qk_l2norm, chunk_size).run(initial_state);
}

at::Tensor apply_state_summary(const GatedDeltaStateSummary& summary, const at::Tensor& state) {
  HP_CHECK_T(c10::ValueError, summary.state.dim() == 4 && summary.transition.dim() == 4 && summary.transition.size(-1) == summary.transition.size(-2) &&
                                  summary.transition.size(-1) == summary.state.size(-2),
             "hyper_parallel::nn::functional::apply_state_summary: expected state [B, nv, dk, dv] and transition [B, nv, dk, dk], got ",
             summary.state.sizes(), " and ", summary.transition.sizes());
  if (!state.defined()) return summary.state;
  HP_CHECK_T(c10::ValueError, state.sizes() == summary.state.sizes(), "hyper_parallel::nn::functional::apply_state_summary: expected an ",
             "incoming state of shape ", summary.state.sizes(), ", got ", state.sizes());
  return at::matmul(summary.transition, state.to(at::kFloat)) + summary.state;
}

GatedDeltaRuleOutput recurrent_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                                                const at::Tensor& beta, const at::Tensor& initial_state, bool use_qk_l2norm) {
  check_inputs("recurrent_gated_delta_rule", query, key, value, g, beta, initial_state);
  Prepared p = prepare(query, key, value, g, beta, initial_state, use_qk_l2norm);
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

GatedDeltaGates gated_delta_gates(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias) {
  return {-a_log.to(at::kFloat).exp() * at::softplus(a.to(at::kFloat) + dt_bias), at::sigmoid(b)};
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
