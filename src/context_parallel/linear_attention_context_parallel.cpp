// Context parallelism of a Gated DeltaNet (context_parallel/linear_attention_context_parallel.h).
#include <hyper_parallel/context_parallel/linear_attention_context_parallel.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/gated_delta_net.h>
#include <hyper_parallel/nn/gated_delta_rule.h>
#include <hyper_parallel/runtime/errors.h>

#include "context_parallel_record.h"
#include <hyper_parallel/runtime/point_to_point.h>

#include "sequence_shard_input.h"

namespace hyper_parallel {
// A namespace of this file's own: the library compiles in unity batches, where the anonymous
// namespaces of context_parallel.cpp and this file would be one.
namespace linear_attention_cp {
namespace {

namespace F = hyper_parallel::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Tags of this file's transfers, apart from ring attention's (0-5): transfers between one pair
// with one tag match in the order they are issued, and every rank issues them in the same order.
constexpr int64_t kHaloTag = 16, kHaloGradTag = 17, kStateTag = 18, kStateGradTag = 19;

void check_mode(const std::string& mode, const char* where) {
  HP_CHECK_T(c10::ValueError, mode == "ulysses" || mode == "all_gather" || mode == "p2p", "hyper_parallel::LinearAttentionContextParallel::",
             where, ": mode must be \"ulysses\", \"all_gather\" or \"p2p\", got \"", mode, "\"");
}

// Waits for every transfer of one batch (none: nothing to wait for).
void exchange(const std::vector<P2POp>& ops) {
  if (ops.empty()) return;
  for (Work& w : batch_isend_irecv(ops)) w.wait();
}

// The halo: this rank's last tokens go to the next rank, the previous rank's arrive (zeros on
// rank 0, whose sequence starts there). Backward sends each halo's gradient back.
struct ShiftToNext : torch::autograd::Function<ShiftToNext> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Group& group) {
    const int64_t r = group.rank(), cp = group.size();
    at::Tensor got = at::zeros_like(x);
    std::vector<P2POp> ops;
    if (r + 1 < cp) ops.push_back(P2POp::isend(x.contiguous(), r + 1, group, kHaloTag));
    if (r > 0) ops.push_back(P2POp::irecv(got, r - 1, group, kHaloTag));
    exchange(ops);
    ctx->saved_data["ranks"] = group.ranks();
    return got;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Group group = new_group(ctx->saved_data["ranks"].toIntVector());
    const int64_t r = group.rank(), cp = group.size();
    at::Tensor grad_x = at::zeros_like(grads[0]);  // the last rank's tokens went nowhere
    std::vector<P2POp> ops;
    if (r > 0) ops.push_back(P2POp::isend(grads[0].contiguous(), r - 1, group, kHaloGradTag));
    if (r + 1 < cp) ops.push_back(P2POp::irecv(grad_x, r + 1, group, kHaloGradTag));
    exchange(ops);
    return {grad_x, at::Tensor()};
  }
};

// p2p: the incoming state from rank r-1. Its input only anchors it in the graph (autograd runs a
// function's backward only when one of its inputs needs a gradient), so that backward sends the
// state's gradient to r-1; the anchor's gradient is zero.
struct ReceiveState : torch::autograd::Function<ReceiveState> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& anchor, const Group& group) {
    at::Tensor state = at::empty(anchor.sizes(), anchor.options());
    recv(state, group.rank() - 1, group, kStateTag);
    ctx->saved_data["ranks"] = group.ranks();
    return state;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Group group = new_group(ctx->saved_data["ranks"].toIntVector());
    send(grads[0].contiguous(), group.rank() - 1, group, kStateGradTag);
    return {at::zeros_like(grads[0]), at::Tensor()};
  }
};

// p2p: the outgoing state to rank r+1. It returns a zero scalar that the caller adds to its output,
// so that backward comes here and receives the state's gradient from r+1.
struct SendState : torch::autograd::Function<SendState> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& state, const Group& group) {
    send(state.contiguous(), group.rank() + 1, group, kStateTag);
    ctx->saved_data["ranks"] = group.ranks();
    ctx->saved_data["shape"] = state.sizes().vec();
    return at::zeros({}, state.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Group group = new_group(ctx->saved_data["ranks"].toIntVector());
    at::Tensor grad = at::empty(ctx->saved_data["shape"].toIntVector(), grads[0].options());
    recv(grad, group.rank() + 1, group, kStateGradTag);
    return {grad, at::Tensor()};
  }
};

// An input as the wrapper gets it: a plain shard, or a DTensor Shard(1) on the cp mesh.
at::Tensor local_input(const c10::IValue& v, const DeviceMesh& mesh, const char* name) {
  return context_parallel::sequence_shard_input(v, mesh, 1, "LinearAttentionContextParallel", name);
}

void check_heads_split(int64_t nk, int64_t nv, int64_t cp, const std::string& label, const char* fn) {
  HP_CHECK_T(c10::ValueError, nk % cp == 0 && nv % cp == 0, "hyper_parallel::LinearAttentionContextParallel::", fn, ": ", label,
             "ulysses splits the ", nk, " key heads and ", nv, " value heads this rank holds over cp = ", cp,
             ", which does not divide them both; use mode \"all_gather\" or \"p2p\", which keep every head");
}

void check_halo(int64_t s, int64_t kernel, int64_t cp, const std::string& mode) {
  HP_CHECK_T(c10::ValueError, s >= kernel - 1, "hyper_parallel::LinearAttentionContextParallel::forward: mode \"", mode, "\" needs at least ",
             kernel - 1, " positions per rank (the convolution's halo, conv_kernel_size - 1) and this rank holds ", s,
             " (cp = ", cp, "); use fewer cp ranks, a longer sequence, or mode \"ulysses\"");
}

// Ulysses: heads over the whole sequence. The module computes this rank's heads; only the two
// all-to-alls are added.
at::Tensor ulysses_forward(const nn::GatedDeltaNetImpl& gdn, const DeviceMesh& mesh, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& a, const at::Tensor& b) {
  const int64_t cp = mesh.size(), r = mesh.get_local_rank(0), bsz = q.size(0), s = q.size(1);
  const int64_t nk = gdn.local_key_heads(), nv = gdn.local_value_heads();
  check_heads_split(nk, nv, cp, "", "forward");
  const int64_t hk = nk / cp, hv = nv / cp;
  const int64_t cq = hk * gdn.options.key_head_dim(), cv = hv * gdn.options.value_head_dim();
  // Per destination rank its channels of each projection, side by side, so that one all-to-all
  // moves them all: [B, s, cp, cq | cq | cv | hv | hv].
  const auto by_rank = [&](const at::Tensor& t) { return t.reshape({bsz, s, cp, t.size(2) / cp}); };
  const at::Tensor packed = at::cat({by_rank(q), by_rank(k), by_rank(v), by_rank(a), by_rank(b)}, 3).reshape({bsz, s, -1});
  const at::Tensor mine = DTensor::from_local(packed, mesh, {Shard(1)}).redistribute(mesh, {Shard(2)}).to_local();  // [B, S, X]
  const auto parts = mine.split_with_sizes({cq, cq, cv, hv, hv}, 2);
  const nn::GatedDeltaNetPrepared p =
      gdn.prepare(parts[0], parts[1], parts[2], parts[3], parts[4], {}, nn::GatedDeltaNetHeads{r * hk, hk, r * hv, hv});
  const at::Tensor o = gdn.mix(p).output;  // [B, S, hv, dv]
  return DTensor::from_local(o, mesh, {Shard(2)}).redistribute(mesh, {Shard(1)}).to_local();
}

// all_gather and p2p: the sequence stays sharded; the halo and the state come from the ranks
// before. The module prepares from the halo and runs from the incoming state; only the exchanges
// are added.
at::Tensor state_passing_forward(const nn::GatedDeltaNetImpl& gdn, const DeviceMesh& mesh, const std::string& mode, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b) {
  const Group& group = mesh.get_group(0);
  const int64_t kernel = gdn.options.conv_kernel_size();
  const int64_t cp = group.size(), r = group.rank(), bsz = q.size(0), s = q.size(1), halo = kernel - 1;
  check_halo(s, kernel, cp, mode);
  // The conv's state: one unused slot, then the previous rank's last kernel-1 inputs.
  at::Tensor conv_state;
  if (halo > 0) {
    const at::Tensor mixed = at::cat({q, k, v}, -1);
    const at::Tensor before = ShiftToNext::apply(mixed.narrow(1, s - halo, halo), group);
    conv_state = at::cat({at::zeros({bsz, 1, mixed.size(2)}, mixed.options()), before}, 1).transpose(1, 2);
  }
  const F::ChunkedGatedDelta chunked = gdn.chunked(gdn.prepare(q, k, v, a, b, conv_state));
  const F::GatedDeltaStateSummary summary = chunked.summary();
  const int64_t dk = gdn.options.key_head_dim(), dv = gdn.options.value_head_dim();
  at::Tensor incoming, tie;  // tie: a zero that keeps a collective's backward in this rank's graph
  if (mode == "all_gather") {
    // Every rank's [S | M], gathered; the gradient of the gathered tensor is a partial sum (the
    // later ranks used it), reduce-scattered back to its owners.
    const at::Tensor mine = at::cat({summary.state, summary.transition}, -1).unsqueeze(0);
    const at::Tensor all =
        DTensor::from_local(mine, mesh, {Shard(0)}).redistribute(mesh, {Replicate()}).to_local(Placements{Partial()});
    for (int64_t p = 0; p < r; ++p) {
      const at::Tensor sm = all.select(0, p);
      incoming = F::apply_state_summary({sm.narrow(-1, 0, dv), sm.narrow(-1, dv, dk)}, incoming);
    }
    if (r == 0) tie = all.sum() * 0;
  } else {
    if (r > 0) incoming = ReceiveState::apply(summary.state, group);
    if (r + 1 < cp) tie = SendState::apply(F::apply_state_summary(summary, incoming), group);
  }
  at::Tensor o = chunked.run(incoming).output;
  if (tie.defined()) o = o + tie.to(o.scalar_type());
  return o;
}

c10::IValue linear_attention_cp_forward(const std::string& mode, const DeviceMesh& mesh, nn::Module& module,
                                        const std::vector<c10::IValue>& args, const nn::Kwargs& kwargs) {
  auto& gdn = static_cast<nn::GatedDeltaNetImpl&>(module);
  HP_CHECK_T(c10::ValueError, args.size() == 5 && kwargs.empty(), "hyper_parallel::LinearAttentionContextParallel::forward: takes the ",
             "shards of q, k, v, a and b only (", args.size(), " positional and ", kwargs.size(), " keyword arguments given)");
  const at::Tensor q = local_input(args[0], mesh, "q"), k = local_input(args[1], mesh, "k"), v = local_input(args[2], mesh, "v"),
                   a = local_input(args[3], mesh, "a"), b = local_input(args[4], mesh, "b");
  gdn.check_inputs(q, k, v, a, b);  // this rank's shards, before any exchange
  if (mode == "ulysses") return ulysses_forward(gdn, mesh, q, k, v, a, b);
  return state_passing_forward(gdn, mesh, mode, q, k, v, a, b);
}

}  // namespace
}  // namespace linear_attention_cp

namespace lcp = linear_attention_cp;

LinearAttentionContextParallel::LinearAttentionContextParallel(std::string mode) : mode_(std::move(mode)) {
  lcp::check_mode(mode_, "LinearAttentionContextParallel");
}

LinearAttentionContextParallel& LinearAttentionContextParallel::mode(std::string m) {
  lcp::check_mode(m, "mode");
  mode_ = std::move(m);
  return *this;
}

void LinearAttentionContextParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  const std::string label = fqn.empty() ? module.name() : fqn;
  auto* gdn = dynamic_cast<nn::GatedDeltaNetImpl*>(&module);
  HP_CHECK_T(c10::TypeError, gdn != nullptr, "hyper_parallel::LinearAttentionContextParallel::validate: '", label,
             "' is not a GatedDeltaNet module (", module.name(), "); apply it to the sequence mixing a linear-attention layer calls");
  HP_CHECK_T(c10::ValueError, mesh.defined() && mesh.ndim() == 1, "hyper_parallel::LinearAttentionContextParallel::validate: needs a 1-D ",
             "cp mesh, got ", mesh.defined() ? mesh.short_string() : std::string("an undefined mesh"));
  HP_CHECK_T(c10::ValueError, gdn->forward_wrapper() == nullptr, "hyper_parallel::LinearAttentionContextParallel::validate: '", label,
             "' already runs through a forward wrapper (context parallelism or activation checkpointing applied to it); ",
             "apply activation checkpointing to the layer around it");
  if (mode_ == "ulysses") lcp::check_heads_split(gdn->local_key_heads(), gdn->local_value_heads(), mesh.size(), "'" + label + "': ", "validate");
}

torch::nn::Module& LinearAttentionContextParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, "", mesh);
  auto& gdn = static_cast<nn::GatedDeltaNetImpl&>(module);
  const std::string mode = mode_;
  gdn.set_forward_wrapper([mode, mesh](nn::Module& m, const std::vector<c10::IValue>& args, const nn::Kwargs& kwargs, const nn::ForwardFn&) {
    return lcp::linear_attention_cp_forward(mode, mesh, m, args, kwargs);
  });
  record_context_parallel(module, mesh);
  return module;
}

}  // namespace hyper_parallel
