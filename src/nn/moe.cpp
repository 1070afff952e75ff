#include <hyper_parallel/nn/moe.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/nn/functional_collectives.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/errors.h>

#include <cmath>
#include <numeric>

namespace hyper_parallel {
namespace nn {
namespace fn = hyper_parallel::nn::functional;

namespace {

void check_options(const MoEOptions& o, const char* what) {
  HP_CHECK_T(c10::ValueError, o.num_experts() > 0 && o.top_k() > 0 && o.top_k() <= o.num_experts(), "hyper_parallel::nn::", what,
             ": top_k (num_experts_per_tok, ", o.top_k(), ") must be between 1 and num_experts (", o.num_experts(), ")");
  HP_CHECK_T(c10::ValueError, o.hidden_size() > 0 && o.intermediate_size() > 0, "hyper_parallel::nn::", what,
             ": hidden_size (", o.hidden_size(), ") and intermediate_size (", o.intermediate_size(), ") must be positive");
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The sum of v[from, to).
int64_t sum(const std::vector<int64_t>& v, int64_t from, int64_t to) {
  return std::accumulate(v.begin() + from, v.begin() + to, int64_t{0});
}

at::Tensor long_tensor(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::kLong).to(device);
}

}  // namespace

TopKRouterImpl::TopKRouterImpl(const MoEOptions& o) : options(o) {
  check_options(o, "TopKRouterImpl");
  register_parameter("weight", at::empty({o.num_experts(), o.hidden_size()}, ParameterScope::current()));
  reset_parameters();
}

void TopKRouterImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.hidden_size()));
  at::Tensor w = parameter("weight");
  hyper_parallel::uniform_(w, -bound, bound);
}

RouterOutput TopKRouterImpl::route(const at::Tensor& x) {
  RouterOutput r;
  r.logits = at::linear(x, weight());
  // The softmax over every expert in float32, then the top k; renormalised only on request.
  const at::Tensor probs = at::softmax(r.logits, -1, at::kFloat);
  auto [top, idx] = at::topk(probs, options.top_k(), -1);
  if (options.norm_topk_prob()) top = top / top.sum(-1, /*keepdim=*/true);
  r.weights = top.to(r.logits.scalar_type());
  r.indices = idx;
  return r;
}

GroupedExpertsImpl::GroupedExpertsImpl(const MoEOptions& o) : options(o) {
  check_options(o, "GroupedExpertsImpl");
  const auto& scope = ParameterScope::current();
  const int64_t e = o.num_experts(), i = o.intermediate_size(), h = o.hidden_size();
  register_parameter("gate_proj", at::empty({e, i, h}, scope));
  register_parameter("up_proj", at::empty({e, i, h}, scope));
  register_parameter("down_proj", at::empty({e, h, i}, scope));
  reset_parameters();
}

// Each expert as torch::nn::Linear would initialise its projections: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void GroupedExpertsImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  const double in_bound = 1.0 / std::sqrt(static_cast<double>(options.hidden_size()));
  const double mid_bound = 1.0 / std::sqrt(static_cast<double>(options.intermediate_size()));
  for (const char* name : {"gate_proj", "up_proj"}) {
    at::Tensor w = parameter(name);
    hyper_parallel::uniform_(w, -in_bound, in_bound);
  }
  at::Tensor w = parameter("down_proj");
  hyper_parallel::uniform_(w, -mid_bound, mid_bound);
}

at::Tensor GroupedExpertsImpl::run_local(const at::Tensor& x, const std::vector<int64_t>& counts) {
  at::Tensor x_in = placement.tp.defined() ? fn::copy_to_group(x, placement.tp) : x;
  const at::Tensor gate = hyper_parallel::local_tensor(parameter("gate_proj")), up = hyper_parallel::local_tensor(parameter("up_proj")),
                   down = hyper_parallel::local_tensor(parameter("down_proj"));
  TORCH_INTERNAL_ASSERT(gate.size(0) == static_cast<int64_t>(counts.size()), "one count per local expert");
  std::vector<at::Tensor> outs;
  int64_t offset = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    const at::Tensor xe = x_in.narrow(0, offset, n);
    const int64_t ei = static_cast<int64_t>(e);
    outs.push_back(at::linear(at::silu(at::linear(xe, gate[ei])) * at::linear(xe, up[ei]), down[ei]));
    offset += n;
  }
  // No token for any local expert: an empty result that stays in the graph, with the weights in
  // it (zero gradients), so that this rank runs every backward collective its peers run (the
  // all-to-alls', and a data-parallel reduction of the experts' gradients).
  at::Tensor y = outs.empty() ? x_in.narrow(0, 0, 0) + (gate.sum() + up.sum() + down.sum()) * 0
                              : outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  return placement.tp.defined() ? fn::reduce_from_group(y, placement.tp) : y;
}

at::Tensor GroupedExpertsImpl::forward(const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights) {
  const int64_t n_experts = options.num_experts(), k = indices.size(-1), t = x.size(0);
  HP_CHECK_T(c10::ValueError, x.dim() == 2 && indices.sizes() == weights.sizes() && indices.dim() == 2 && indices.size(0) == t,
             "hyper_parallel::nn::GroupedExpertsImpl::forward: expected tokens [T, H] with indices and weights [T, k], got ",
             x.sizes(), ", ", indices.sizes(), " and ", weights.sizes());
  const bool meta = x.is_meta();
  // Group the T·k (token, choice) slots by expert, stably (each expert's tokens in token order).
  const at::Tensor flat = indices.reshape({-1});
  const at::Tensor order = std::get<1>(at::sort(flat, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false));
  const at::Tensor token_of = at::div(order, k, "floor");
  std::vector<int64_t> counts(static_cast<size_t>(n_experts));
  if (meta) {
    // Shapes only (a plan): routing has no values, so every expert is taken to get as many slots.
    for (int64_t e = 0; e < n_experts; ++e) counts[static_cast<size_t>(e)] = (t * k) / n_experts + (e < (t * k) % n_experts ? 1 : 0);
  } else {
    counts = to_vector(at::bincount(flat, {}, n_experts));
  }
  // Combine: the outputs `y` of the grouped slots [start, start + n), each weighted by its router
  // weight, summed into its token (per token in expert order, as transformers' loop over experts
  // adds them).
  auto combine = [&](const at::Tensor& routing, int64_t start, int64_t n, const at::Tensor& y) {
    const at::Tensor w = routing.reshape({-1}).index_select(0, order.narrow(0, start, n)).unsqueeze(-1);
    return at::zeros_like(x).index_add(0, token_of.narrow(0, start, n), y * w);
  };
  const int64_t slots = t * k;
  const ExpertPlacement& pl = placement;
  if (!pl.ep.defined()) return combine(weights, 0, slots, run_local(x.index_select(0, token_of), counts));
  const int64_t ep = pl.ep.size(), r = pl.ep.rank();
  HP_CHECK_T(c10::ValueError, n_experts % ep == 0, "hyper_parallel::nn::GroupedExpertsImpl::forward: num_experts (", n_experts,
             ") must be divisible by the expert-parallel size ", ep);
  const int64_t local = n_experts / ep, lo = r * local, hi = (r + 1) * local;
  if (pl.dispatch == ExpertPlacement::Dispatch::all_reduce) {
    // Every ep rank holds these tokens and their routing: run the slots of this rank's experts,
    // sum over ep. Each rank's backward reaches the tokens and the router weights of its own
    // slots only, so both gradients are summed over ep (copy_to_group), in one all-reduce: the
    // router weights are inputs of the sum exactly as the tokens are. Without the weights in it,
    // the replicated router, and through it the whole residual stream, would get a different,
    // partial gradient on each rank.
    const int64_t h = x.size(1);
    const at::Tensor xw = fn::copy_to_group(at::cat({x, weights.to(x.scalar_type())}, 1), pl.ep);
    const at::Tensor xs = xw.narrow(1, 0, h), ws = xw.narrow(1, h, k).to(weights.scalar_type());
    const int64_t start = sum(counts, 0, lo), n = sum(counts, lo, hi);
    const at::Tensor y = run_local(xs.index_select(0, token_of.narrow(0, start, n)),
                                   std::vector<int64_t>(counts.begin() + lo, counts.begin() + hi));
    return fn::reduce_from_group(combine(ws, start, n, y), pl.ep);
  }
  // all_to_all: how many slots this rank sends each peer's experts, and receives for its own.
  const at::Tensor counts_t = meta ? at::empty({n_experts, 1}, x.options().dtype(at::kLong))
                                   : long_tensor(counts, at::kCPU).view({n_experts, 1});
  const at::Tensor got = all_to_all(counts_t, 0, 1, pl.ep);  // [local, ep]: from each source rank
  std::vector<int64_t> recv_matrix;                           // [local][ep], row-major
  if (meta) {
    for (int64_t e = 0; e < local; ++e)
      for (int64_t s = 0; s < ep; ++s) recv_matrix.push_back(counts[static_cast<size_t>(lo + e)]);
  } else {
    recv_matrix = to_vector(got);
  }
  std::vector<int64_t> send_splits, recv_splits(static_cast<size_t>(ep), 0), local_counts(static_cast<size_t>(local), 0);
  for (int64_t j = 0; j < ep; ++j) send_splits.push_back(sum(counts, j * local, (j + 1) * local));
  for (int64_t e = 0; e < local; ++e)
    for (int64_t s = 0; s < ep; ++s) {
      const int64_t c = recv_matrix[static_cast<size_t>(e * ep + s)];
      recv_splits[static_cast<size_t>(s)] += c;
      local_counts[static_cast<size_t>(e)] += c;
    }
  const at::Tensor received =
      fn::all_to_all_single_autograd(x.index_select(0, token_of), recv_splits, send_splits, pl.ep);  // by (source, expert)
  at::Tensor y;
  if (meta) {
    y = run_local(received, local_counts);
  } else {
    // Regroup by (expert, source) for the experts: row perm[i] of `received` is row i of the
    // grouped order; index_copy puts the outputs back in `received`'s order.
    std::vector<int64_t> block_start(static_cast<size_t>(local * ep));
    int64_t at_row = 0;
    for (int64_t s = 0; s < ep; ++s)
      for (int64_t e = 0; e < local; ++e) {
        block_start[static_cast<size_t>(e * ep + s)] = at_row;
        at_row += recv_matrix[static_cast<size_t>(e * ep + s)];
      }
    std::vector<int64_t> perm;
    perm.reserve(static_cast<size_t>(at_row));
    for (int64_t e = 0; e < local; ++e)
      for (int64_t s = 0; s < ep; ++s) {
        const int64_t b = block_start[static_cast<size_t>(e * ep + s)];
        for (int64_t i = 0; i < recv_matrix[static_cast<size_t>(e * ep + s)]; ++i) perm.push_back(b + i);
      }
    const at::Tensor p = long_tensor(perm, x.device());
    const at::Tensor grouped = run_local(received.index_select(0, p), local_counts);
    y = at::empty_like(grouped).index_copy(0, p, grouped);
  }
  return combine(weights, 0, slots, fn::all_to_all_single_autograd(y, send_splits, recv_splits, pl.ep));
}

SparseMoeBlockImpl::SparseMoeBlockImpl(const MoEOptions& o) : options(o) {
  gate = register_module("gate", TopKRouter(o));
  experts = register_module("experts", GroupedExperts(o));
  if (o.shared_expert_intermediate_size() > 0) {
    shared_expert = register_module("shared_expert", SwiGLUMlp(o.hidden_size(), o.shared_expert_intermediate_size()));
    shared_expert_gate = register_module("shared_expert_gate", Linear(LinearOptions(o.hidden_size(), 1).bias(false)));
  }
}

at::Tensor SparseMoeBlockImpl::forward(const at::Tensor& x) { return forward(x, Kwargs{}); }

at::Tensor SparseMoeBlockImpl::forward(const at::Tensor& x, const Kwargs& kwargs) {
  at::Tensor keep;
  for (const auto& [name, value] : kwargs) {
    HP_CHECK_T(c10::ValueError, name == "keep" && value.isTensor(), "hyper_parallel::nn::SparseMoeBlockImpl::forward: takes the ",
               "keyword keep (a tensor, 0 at padding) only, got '", name, "'");
    keep = value.toTensor();
  }
  const at::Tensor flat = x.reshape({-1, options.hidden_size()});
  if (keep.defined()) {
    keep = keep.reshape({-1});
    HP_CHECK_T(c10::ValueError, keep.numel() == flat.size(0), "hyper_parallel::nn::SparseMoeBlockImpl::forward: keep has ", keep.numel(),
               " entries for ", flat.size(0), " tokens");
  }
  RouterOutput r = gate->route(flat);
  // Read after the forward by the load-balancing loss: under activation checkpointing it must
  // stay in the graph of the checkpointed layer, or the router gets no gradient from that loss.
  // Delivered by the forward only (a recompute's side outputs feed its backward), so each
  // token's routing is added once. A forward that records no gradients (generation, evaluation)
  // adds nothing; asked where the logits arrive, since a checkpointed forward itself runs without.
  checkpoint_side_output(r.logits, [this, keep](const at::Tensor& logits) {
    router_logits = logits;
    if (at::GradMode::is_enabled()) statistics.add(router_statistics(logits, options.top_k(), keep));
  });
  at::Tensor out = experts(flat, r.indices, r.weights);
  if (shared_expert) out = out + at::sigmoid(shared_expert_gate(flat)) * shared_expert(flat);
  return out.view(x.sizes());
}

RouterStatistics SparseMoeBlockImpl::take_statistics() {
  RouterStatistics out = std::move(statistics);
  statistics = RouterStatistics();
  return out;
}

void RouterStatistics::add(const RouterStatistics& other) {
  if (other.empty()) return;
  if (empty()) {
    *this = other;
    return;
  }
  counts = counts + other.counts;
  prob_sum = prob_sum + other.prob_sum;
  tokens = tokens + other.tokens;
}

RouterStatistics router_statistics(const at::Tensor& logits, int64_t top_k, const at::Tensor& keep) {
  HP_CHECK_T(c10::ValueError, logits.defined() && logits.dim() == 2, "hyper_parallel::nn::router_statistics: router logits must be [T, E], got ",
             logits.defined() ? c10::str(logits.sizes()) : std::string("none (run the forward first)"));
  const int64_t e = logits.size(1);
  // In the logits' dtype, as transformers (only the router's own softmax is in float32).
  const at::Tensor probs = at::softmax(logits, -1);
  const at::Tensor chosen = std::get<1>(at::topk(probs, top_k, -1));
  const auto f32 = probs.options().dtype(at::kFloat);
  at::Tensor weight = keep.defined() ? keep.reshape({-1, 1}).to(f32) : at::ones({logits.size(0), 1}, f32);
  RouterStatistics s;
  s.counts = at::zeros({e}, f32).index_add(0, chosen.reshape({-1}), weight.expand({logits.size(0), top_k}).reshape({-1}));
  s.prob_sum = (probs.to(at::kFloat) * weight).sum(0);
  s.tokens = weight.sum().reshape({1});
  return s;
}

at::Tensor load_balancing_loss(RouterStatistics statistics, int64_t num_experts, const Group& data_group) {
  HP_CHECK_T(c10::ValueError, !statistics.empty(), "hyper_parallel::nn::load_balancing_loss: no router statistics (no forward ",
             "that records gradients ran since they were last taken)");
  HP_CHECK_T(c10::ValueError, statistics.counts.size(0) == num_experts, "hyper_parallel::nn::load_balancing_loss: statistics of ",
             statistics.counts.size(0), " experts for a model of ", num_experts);
  at::Tensor counts = statistics.counts.detach(), total = statistics.tokens.detach(), prob_sum = statistics.prob_sum;
  if (data_group.defined() && data_group.size() > 1) {
    counts = all_reduce(counts, ReduceOp::SUM, data_group);
    total = all_reduce(total, ReduceOp::SUM, data_group);
    prob_sum = fn::all_reduce_sum_autograd(prob_sum, data_group);
  }
  return (counts / total * (prob_sum / total)).sum() * static_cast<double>(num_experts);
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                               const Group& data_group) {
  HP_CHECK_T(c10::ValueError, !router_logits.empty(), "hyper_parallel::nn::load_balancing_loss: no router logits were given");
  RouterStatistics total;
  for (const at::Tensor& logits : router_logits) {
    HP_CHECK_T(c10::ValueError, logits.defined(), "hyper_parallel::nn::load_balancing_loss: a layer has no router logits (run the forward first)");
    HP_CHECK_T(c10::ValueError, logits.dim() == 2 && logits.size(1) == num_experts, "hyper_parallel::nn::load_balancing_loss: router logits must be [T, ",
               num_experts, "], got ", logits.sizes());
    total.add(router_statistics(logits, top_k));
  }
  return load_balancing_loss(std::move(total), num_experts, data_group);
}

}  // namespace nn
}  // namespace hyper_parallel
