// Ring attention: each rank keeps its queries and passes its key/value block to the next rank
// cp-1 times, attending to each block as it arrives (the transfer of the next block overlaps
// the current block's work). A block's result is merged into the running output with the rows'
// log-sum-exp, in float32. Backward needs only the saved output and log-sum-exp: it sends the
// blocks round again, each with the gradient accumulated for it so far, which arrives home after
// cp transfers. Memory: one remote block at a time, forward and backward.
#include "ring_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <hyper_parallel/context_parallel/context_parallel.h>
#include <hyper_parallel/nn/attention.h>
#include <hyper_parallel/runtime/point_to_point.h>

#include <cmath>
#include <limits>

namespace hyper_parallel {
namespace context_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
namespace F = hyper_parallel::nn::functional;

// Which rows (queries) and columns (keys) of step i's block are attended, and whether the causal
// mask applies within them. With load balancing a later block is half visible: a block from an
// earlier rank holds chunks j < r and 2·cp-1-j > 2·cp-1-r, so every query sees all of chunk j and
// none of the other; a block from a later rank holds chunks j > r and 2·cp-1-j, which only the
// queries of chunk 2·cp-1-r (the second half) see, all of them.
struct BlockPlan {
  bool skip = false;
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  bool masked = false;
};

BlockPlan plan_block(int64_t rank, int64_t cp, int64_t i, int64_t s, bool is_causal, bool load_balance) {
  BlockPlan p;
  p.rows = p.cols = s;
  const CausalBehavior b = is_causal_behavior(rank, cp, i, is_causal, load_balance);
  if (b == CausalBehavior::skip) {
    p.skip = true;
    return p;
  }
  p.masked = b == CausalBehavior::is_causal;
  if (b == CausalBehavior::not_is_causal && is_causal && load_balance) {
    const int64_t src = ((rank - i) % cp + cp) % cp;
    if (src < rank) {
      p.cols = s / 2;
    } else {
      p.row0 = s / 2;
      p.rows = s - s / 2;
    }
  }
  return p;
}

double scale_of(c10::optional<double> scale, int64_t head_dim) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

// Raw scores of a block, float32, masked with -inf where blocked.
at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, c10::optional<double> scale) {
  at::Tensor scores = q.matmul(k.transpose(-2, -1));
  scores = scale ? scores * *scale : scores / std::sqrt(static_cast<double>(q.size(3)));
  if (mask.defined()) scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
  return scores;
}

// [B, H, sk, D] gradient of repeated key heads -> [B, Hk, sk, D].
at::Tensor sum_groups(const at::Tensor& g, int64_t kv_heads) {
  const auto s = g.sizes();
  if (s[1] == kv_heads) return g;
  return g.view({s[0], kv_heads, s[1] / kv_heads, s[2], s[3]}).sum(2);
}

// Sends `send` to the next rank and receives the previous rank's tensors into `recv`.
std::vector<Work> rotate(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, const Group& group,
                         int64_t tag0) {
  const int64_t cp = group.size(), r = group.rank();
  const int64_t next = (r + 1) % cp, prev = (r - 1 + cp) % cp;
  std::vector<P2POp> ops;
  for (size_t j = 0; j < send.size(); ++j) ops.push_back(P2POp::isend(send[j], next, group, tag0 + static_cast<int64_t>(j)));
  for (size_t j = 0; j < recv.size(); ++j) ops.push_back(P2POp::irecv(recv[j], prev, group, tag0 + static_cast<int64_t>(j)));
  return batch_isend_irecv(ops);
}

void wait_all(std::vector<Work>& works) {
  for (auto& w : works) w.wait();
}

// The key/value block this rank attends at a step, and the transfer of the next one (from the
// previous rank), which travels while the current block is worked on.
struct KvBlocks {
  at::Tensor k, v, next_k, next_v;
  std::vector<Work> works;
  KvBlocks(const at::Tensor& key, const at::Tensor& value) : k(key.contiguous()), v(value.contiguous()) {}
  // Starts passing the current block on, unless it is the last step's.
  void pass_on(bool more, const Group& group, int64_t tag) {
    if (!more) return;
    next_k = at::empty_like(k);
    next_v = at::empty_like(v);
    works = rotate({k, v}, {next_k, next_v}, group, tag);
  }
  void advance(bool more) {
    if (!more) return;
    wait_all(works);
    k = next_k;
    v = next_v;
  }
  // The plan's columns in float32, with the key heads repeated to the query heads.
  at::Tensor keys(const BlockPlan& p, int64_t heads) const { return F::repeat_kv(k.narrow(2, p.col0, p.cols).to(at::kFloat), heads); }
  at::Tensor values(const BlockPlan& p, int64_t heads) const { return F::repeat_kv(v.narrow(2, p.col0, p.cols).to(at::kFloat), heads); }
};

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const Group& group, bool is_causal, bool load_balance, c10::optional<double> scale) {
    const int64_t cp = group.size(), r = group.rank(), s = q.size(2), heads = q.size(1);
    const at::Tensor qf = q.to(at::kFloat);
    at::Tensor out = at::zeros(qf.sizes(), qf.options());
    at::Tensor lse = at::full({q.size(0), heads, s}, -std::numeric_limits<float>::infinity(), qf.options());
    const at::Tensor positions = shard_positions(s, cp, r, load_balance, q.options().dtype(at::kLong));
    const at::Tensor diag_mask = is_causal ? F::causal_mask(positions, positions) : at::Tensor();
    KvBlocks blocks(k, v);
    for (int64_t i = 0; i < cp; ++i) {
      blocks.pass_on(i + 1 < cp, group, 0);
      const BlockPlan p = plan_block(r, cp, i, s, is_causal, load_balance);
      if (!p.skip) {
        const at::Tensor qb = qf.narrow(2, p.row0, p.rows), kb = blocks.keys(p, heads), vb = blocks.values(p, heads);
        const at::Tensor scores = block_scores(qb, kb, p.masked ? diag_mask : at::Tensor(), scale);
        // Every attended row sees at least one key (the plan), so its maximum is finite. (Not
        // at::logsumexp: no meta kernel.)
        const at::Tensor row_max = std::get<0>(scores.max(-1, /*keepdim=*/true));
        const at::Tensor block_lse = (row_max + (scores - row_max).exp().sum(-1, /*keepdim=*/true).log()).squeeze(-1);
        const at::Tensor block_out = (scores - block_lse.unsqueeze(-1)).exp_().matmul(vb);
        at::Tensor rows_out = out.narrow(2, p.row0, p.rows), rows_lse = lse.narrow(2, p.row0, p.rows);
        // log(e^a + e^b) from the larger: a row seen for the first time has a = -inf (e^-inf = 0).
        // (Not at::logaddexp: it has no meta kernel, and plans run on meta.)
        const at::Tensor top = at::maximum(rows_lse, block_lse);
        const at::Tensor merged = top + ((rows_lse - top).exp() + (block_lse - top).exp()).log();
        rows_out.copy_(rows_out * (rows_lse - merged).exp_().unsqueeze(-1) + block_out * (block_lse - merged).exp_().unsqueeze(-1));
        rows_lse.copy_(merged);
      }
      blocks.advance(i + 1 < cp);
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["ranks"] = group.ranks();
    ctx->saved_data["causal"] = is_causal;
    ctx->saved_data["lb"] = load_balance;
    ctx->saved_data["scale"] = scale ? c10::IValue(*scale) : c10::IValue();
    return out.to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Group group = new_group(ctx->saved_data["ranks"].toIntVector());
    const bool is_causal = ctx->saved_data["causal"].toBool(), load_balance = ctx->saved_data["lb"].toBool();
    const c10::optional<double> scale =
        ctx->saved_data["scale"].isNone() ? c10::nullopt : c10::optional<double>(ctx->saved_data["scale"].toDouble());
    const int64_t cp = group.size(), r = group.rank(), s = q.size(2), heads = q.size(1), kv_heads = k.size(1);
    const double factor = scale_of(scale, q.size(3));
    const at::Tensor qf = q.to(at::kFloat), dout = grads[0].to(at::kFloat);
    // D_i = rowsum(dO ∘ O): the softmax backward's correction, from the whole output.
    const at::Tensor delta = (dout * out).sum(-1);
    at::Tensor dq = at::zeros_like(qf);
    const at::Tensor positions = shard_positions(s, cp, r, load_balance, q.options().dtype(at::kLong));
    const at::Tensor diag_mask = is_causal ? F::causal_mask(positions, positions) : at::Tensor();
    KvBlocks blocks(k, v);
    at::Tensor dk = at::zeros(k.sizes(), qf.options()), dv = at::zeros(v.sizes(), qf.options());
    for (int64_t i = 0; i < cp; ++i) {
      blocks.pass_on(i + 1 < cp, group, 2);
      const BlockPlan p = plan_block(r, cp, i, s, is_causal, load_balance);
      if (!p.skip) {
        const at::Tensor qb = qf.narrow(2, p.row0, p.rows), dob = dout.narrow(2, p.row0, p.rows);
        const at::Tensor kb = blocks.keys(p, heads), vb = blocks.values(p, heads);
        const at::Tensor scores = block_scores(qb, kb, p.masked ? diag_mask : at::Tensor(), scale);
        const at::Tensor probs = (scores - lse.narrow(2, p.row0, p.rows).unsqueeze(-1)).exp_();
        const at::Tensor dprobs = dob.matmul(vb.transpose(-2, -1));
        const at::Tensor dscores = probs * (dprobs - delta.narrow(2, p.row0, p.rows).unsqueeze(-1));
        dq.narrow(2, p.row0, p.rows).add_(dscores.matmul(kb), factor);
        dk.narrow(2, p.col0, p.cols).add_(sum_groups(dscores.transpose(-2, -1).matmul(qb), kv_heads), factor);
        dv.narrow(2, p.col0, p.cols).add_(sum_groups(probs.transpose(-2, -1).matmul(dob), kv_heads));
      }
      // The block's gradient so far follows the block; after cp moves it is home.
      at::Tensor next_dk = at::empty_like(dk), next_dv = at::empty_like(dv);
      std::vector<Work> grad_works = rotate({dk, dv}, {next_dk, next_dv}, group, 4);
      wait_all(grad_works);
      blocks.advance(i + 1 < cp);
      dk = next_dk;
      dv = next_dv;
    }
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor shard_positions(int64_t s, int64_t cp, int64_t rank, bool load_balance, const at::TensorOptions& options) {
  if (!load_balance) return at::arange(rank * s, (rank + 1) * s, options);
  const int64_t c = s / 2;
  return at::cat({at::arange(rank * c, (rank + 1) * c, options), at::arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, options)});
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Group& group, bool is_causal,
                          bool load_balance, c10::optional<double> scale) {
  return RingAttention::apply(q, k, v, group, is_causal, load_balance, scale);
}

}  // namespace context_parallel
}  // namespace hyper_parallel
