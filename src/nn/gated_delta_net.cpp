// The Gated DeltaNet's sequence-mixing module and its gated output norm (nn/gated_delta_net.h).
#include <hyper_parallel/nn/gated_delta_net.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/runtime/errors.h>

#include <cmath>

namespace hyper_parallel {
namespace nn {

GatedDeltaNetImpl::GatedDeltaNetImpl(const GatedDeltaNetOptions& o) : options(o) {
  HP_CHECK_T(c10::ValueError,
             o.num_key_heads() > 0 && o.num_value_heads() % o.num_key_heads() == 0 && o.key_head_dim() > 0 && o.value_head_dim() > 0 &&
                 o.conv_kernel_size() > 0 && o.chunk_size() > 0,
             "hyper_parallel::nn::GatedDeltaNetImpl: expected positive sizes with num_value_heads (", o.num_value_heads(),
             ") a multiple of num_key_heads (", o.num_key_heads(), "), got key_head_dim ", o.key_head_dim(), ", value_head_dim ",
             o.value_head_dim(), ", conv_kernel_size ", o.conv_kernel_size(), ", chunk_size ", o.chunk_size());
  const auto& scope = ParameterScope::current();
  const int64_t key_dim = o.num_key_heads() * o.key_head_dim(), value_dim = o.num_value_heads() * o.value_head_dim();
  register_parameter("conv_q", at::empty({key_dim, 1, o.conv_kernel_size()}, scope));
  register_parameter("conv_k", at::empty({key_dim, 1, o.conv_kernel_size()}, scope));
  register_parameter("conv_v", at::empty({value_dim, 1, o.conv_kernel_size()}, scope));
  register_parameter("A_log", at::empty({o.num_value_heads()}, scope));
  register_parameter("dt_bias", at::empty({o.num_value_heads()}, scope));
  reset_parameters();
}

// transformers' initialisation: the conv as torch's Conv1d (U(-1/sqrt(K), 1/sqrt(K)) for a
// depthwise kernel), dt_bias ones, A = U(0.01, 16) (kept away from 0 so log A is finite).
void GatedDeltaNetImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.conv_kernel_size()));
  for (const char* name : {"conv_q", "conv_k", "conv_v"}) {
    at::Tensor w = parameter(name);
    hyper_parallel::uniform_(w, -bound, bound);
  }
  at::Tensor a_log = parameter("A_log");
  hyper_parallel::uniform_(a_log, 0.01, 16.0);
  a_log.log_();
  parameter("dt_bias").fill_(1);
}

int64_t GatedDeltaNetImpl::local_key_heads() const {
  return local_tensor(named_parameters(false)["conv_q"]).size(0) / options.key_head_dim();
}

int64_t GatedDeltaNetImpl::local_value_heads() const {
  return local_tensor(named_parameters(false)["conv_v"]).size(0) / options.value_head_dim();
}

void GatedDeltaNetImpl::check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                     const at::Tensor& b, const GatedDeltaNetHeads& heads) const {
  const int64_t dk = options.key_head_dim(), dv = options.value_head_dim();
  const int64_t hk = heads.key_count < 0 ? local_key_heads() : heads.key_count;
  const int64_t hv = heads.value_count < 0 ? local_value_heads() : heads.value_count;
  HP_CHECK_T(c10::ValueError,
             q.dim() == 3 && q.size(2) == hk * dk && k.sizes() == q.sizes() && v.dim() == 3 && v.size(2) == hv * dv &&
                 v.size(0) == q.size(0) && v.size(1) == q.size(1) && a.dim() == 3 && a.size(0) == q.size(0) && a.size(1) == q.size(1) &&
                 a.size(2) == hv && b.sizes() == a.sizes(),
             "hyper_parallel::nn::GatedDeltaNet::forward: expected q and k [B, S, ", hk * dk, "], v [B, S, ", hv * dv, "] and a, b [B, S, ", hv, "], got ", q.sizes(), ", ",
             k.sizes(), ", ", v.sizes(), ", ", a.sizes(), " and ", b.sizes());
}

GatedDeltaNetPrepared GatedDeltaNetImpl::prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                                 const at::Tensor& b, const at::Tensor& conv_state, const GatedDeltaNetHeads& heads) const {
  const auto params = named_parameters(false);
  const int64_t dk = options.key_head_dim(), dv = options.value_head_dim();
  const int64_t hk = heads.key_count < 0 ? local_key_heads() : heads.key_count;
  const int64_t hv = heads.value_count < 0 ? local_value_heads() : heads.value_count;
  const auto rows = [](const at::Tensor& t, int64_t begin, int64_t count, int64_t per) { return t.narrow(0, begin * per, count * per); };
  const at::Tensor cq = rows(local_tensor(params["conv_q"]), heads.key_begin, hk, dk);
  const at::Tensor ck = rows(local_tensor(params["conv_k"]), heads.key_begin, hk, dk);
  const at::Tensor cv = rows(local_tensor(params["conv_v"]), heads.value_begin, hv, dv);
  const at::Tensor a_log = local_tensor(params["A_log"]).narrow(0, heads.value_begin, hv);
  const at::Tensor dt_bias = local_tensor(params["dt_bias"]).narrow(0, heads.value_begin, hv);
  check_inputs(q, k, v, a, b, heads);
  const int64_t bsz = q.size(0), s = q.size(1);
  // One convolution over the q, k and v channels together, as HF's conv1d over [Q ‖ K ‖ V].
  const auto conv = functional::causal_conv1d(at::cat({q, k, v}, -1), at::cat({cq, ck, cv}, 0).squeeze(1), conv_state);
  GatedDeltaNetPrepared p;
  p.query = conv.output.narrow(2, 0, hk * dk).reshape({bsz, s, hk, dk});
  p.key = conv.output.narrow(2, hk * dk, hk * dk).reshape({bsz, s, hk, dk});
  p.value = conv.output.narrow(2, 2 * hk * dk, hv * dv).reshape({bsz, s, hv, dv});
  p.conv_state = conv.final_state;
  auto gates = functional::gated_delta_gates(a, b, a_log, dt_bias);
  p.g = std::move(gates.g);
  p.beta = std::move(gates.beta);
  return p;
}

functional::ChunkedGatedDelta GatedDeltaNetImpl::chunked(const GatedDeltaNetPrepared& p) const {
  return functional::ChunkedGatedDelta(p.query, p.key, p.value, p.g, p.beta, /*use_qk_l2norm=*/true, options.chunk_size());
}

functional::GatedDeltaRuleOutput GatedDeltaNetImpl::mix(const GatedDeltaNetPrepared& p, const at::Tensor& initial_state) const {
  if (initial_state.defined() && p.query.size(1) == 1)
    return functional::recurrent_gated_delta_rule(p.query, p.key, p.value, p.g, p.beta, initial_state);
  return functional::chunk_gated_delta_rule(p.query, p.key, p.value, p.g, p.beta, initial_state, /*use_qk_l2norm=*/true,
                                            options.chunk_size());
}

at::Tensor GatedDeltaNetImpl::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                      const at::Tensor& b, GatedDeltaNetState* state) {
  const GatedDeltaNetPrepared p = prepare(q, k, v, a, b, state != nullptr ? state->conv : at::Tensor());
  auto rule = mix(p, state != nullptr ? state->recurrent : at::Tensor());
  if (state != nullptr) {
    state->conv = p.conv_state;
    state->recurrent = rule.final_state;
  }
  return rule.output;
}

RMSNormGatedImpl::RMSNormGatedImpl(int64_t dim_, double eps_) : dim(dim_), eps(eps_) {
  HP_CHECK_T(c10::ValueError, dim > 0, "hyper_parallel::nn::RMSNormGatedImpl: dim must be positive, got ", dim);
  register_parameter("weight", at::empty({dim}, ParameterScope::current()));
  reset_parameters();
}

void RMSNormGatedImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  parameter("weight").fill_(1);
}

at::Tensor RMSNormGatedImpl::forward(const at::Tensor& x, const at::Tensor& gate) {
  HP_CHECK_T(c10::ValueError, x.sizes() == gate.sizes() && x.dim() >= 1 && x.size(-1) == dim,
             "hyper_parallel::nn::RMSNormGated::forward: expected x and gate of one shape ending in ", dim, ", got ", x.sizes(), " and ",
             gate.sizes());
  const auto dtype = x.scalar_type();
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = (xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(dtype);
  return (parameter("weight") * normed * at::silu(gate.to(at::kFloat))).to(dtype);
}

}  // namespace nn
}  // namespace hyper_parallel
