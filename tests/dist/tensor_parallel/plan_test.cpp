// Cases D3-D5: the styles combined as the Qwen plan combines them.
#include "tp_models.h"

#include <cmath>

using namespace tp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_tensor_parallel_plan_test {
namespace {

hp::DeviceMesh mesh() { return hp::init_device_mesh("cpu", {tp_size()}, {"tp"}); }
at::Tensor grad_of(const at::Tensor& p) { return full(p.grad()); }

// Causal multi-head self-attention; the number of heads is read off q's (local) width, so the
// same code runs on head-sharded projections.
class AttentionImpl : public hnn::ModuleBase<AttentionImpl> {
 public:
  AttentionImpl(int64_t hidden, int64_t head_dim) : head_dim(head_dim) {
    q_proj = register_module("q_proj", hnn::Linear(hidden, hidden));
    k_proj = register_module("k_proj", hnn::Linear(hidden, hidden));
    v_proj = register_module("v_proj", hnn::Linear(hidden, hidden));
    o_proj = register_module("o_proj", hnn::Linear(hnn::LinearOptions(hidden, hidden).bias(false)));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor q = q_proj(x), k = k_proj(x), v = v_proj(x);
    const int64_t b = q.size(0), s = q.size(1), h = q.size(2) / head_dim;
    auto heads = [&](const at::Tensor& t) { return t.view({b, s, h, head_dim}).transpose(1, 2); };
    at::Tensor scores = heads(q).matmul(heads(k).transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    at::Tensor causal = at::ones({s, s}, at::kBool).triu(1);
    at::Tensor attn = at::softmax(scores.masked_fill(causal, -1e9), -1).matmul(heads(v));
    return o_proj(attn.transpose(1, 2).reshape({b, s, h * head_dim}));
  }
  int64_t head_dim;
  hnn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
HP_MODULE(Attention);

class SwiGluImpl : public hnn::ModuleBase<SwiGluImpl> {
 public:
  SwiGluImpl(int64_t hidden, int64_t inner) {
    gate_proj = register_module("gate_proj", hnn::Linear(hnn::LinearOptions(hidden, inner).bias(false)));
    up_proj = register_module("up_proj", hnn::Linear(hnn::LinearOptions(hidden, inner).bias(false)));
    down_proj = register_module("down_proj", hnn::Linear(hnn::LinearOptions(inner, hidden).bias(false)));
  }
  at::Tensor forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }
  hnn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
HP_MODULE(SwiGlu);

// The Qwen decoder layer, minimal: pre-norm attention and MLP with residual adds.
class BlockImpl : public hnn::ModuleBase<BlockImpl> {
 public:
  BlockImpl(int64_t hidden, int64_t head_dim) {
    input_layernorm = register_module("input_layernorm", hnn::RMSNorm(hidden));
    self_attn = register_module("self_attn", Attention(hidden, head_dim));
    post_attention_layernorm = register_module("post_attention_layernorm", hnn::RMSNorm(hidden));
    mlp = register_module("mlp", SwiGlu(hidden, 2 * hidden));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + self_attn(input_layernorm(x));
    return h + mlp(post_attention_layernorm(h));
  }
  hnn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  SwiGlu mlp{nullptr};
};
HP_MODULE(Block);

void randomize_norms(torch::nn::Module& m, uint64_t seed) {
  at::NoGradGuard g;
  for (auto& p : m.named_parameters())
    if (p.key().find("norm") != std::string::npos) p.value().copy_(random(p.value().sizes(), seed++));
}

Block make_block(int64_t hidden, int64_t head_dim) {
  auto b = seeded<Block>(31, hidden, head_dim);
  randomize_norms(*b, 100);
  return b;
}

hp::ParallelizePlan qwen_plan(bool sequence_parallel) {
  if (sequence_parallel)
    return {{"input_layernorm", hp::SequenceParallel()},
            {"self_attn", hp::PrepareModuleInput(hp::Layouts{hp::Shard(1)}, hp::Layouts{hp::Replicate()})},
            {"self_attn.[qkv]_proj", hp::ColwiseParallel()},
            {"self_attn.o_proj", hp::RowwiseParallel(hp::Shard(-1), hp::Shard(1), /*use_local_output=*/false)},
            {"post_attention_layernorm", hp::SequenceParallel()},
            {"mlp", hp::PrepareModuleInput(hp::Layouts{hp::Shard(1)}, hp::Layouts{hp::Replicate()})},
            {"mlp.gate_proj", hp::ColwiseParallel()},
            {"mlp.up_proj", hp::ColwiseParallel()},
            {"mlp.down_proj", hp::RowwiseParallel(hp::Shard(-1), hp::Shard(1), false)}};
  // Without sequence parallelism (seed D5): NoParallel norms and a plain, replicated residual
  // stream; each block makes its input one Replicate DTensor, so the input gradient of q/k/v is
  // reduced once (Megatron's all-reduce).
  return {{"input_layernorm", hp::NoParallel()},
          {"self_attn", hp::PrepareModuleInput(hp::Layouts{hp::Replicate()}, hp::Layouts{hp::Replicate()})},
          {"self_attn.[qkv]_proj", hp::ColwiseParallel()},
          {"self_attn.o_proj", hp::RowwiseParallel()},
          {"post_attention_layernorm", hp::NoParallel()},
          {"mlp", hp::PrepareModuleInput(hp::Layouts{hp::Replicate()}, hp::Layouts{hp::Replicate()})},
          {"mlp.gate_proj", hp::ColwiseParallel()},
          {"mlp.up_proj", hp::ColwiseParallel()},
          {"mlp.down_proj", hp::RowwiseParallel()}};
}

void check_block(bool sequence_parallel) {
  const int64_t n = tp_size(), head_dim = 4, hidden = 2 * n * head_dim, seq = 2 * n;
  Block b = make_block(hidden, head_dim), ref = make_block(hidden, head_dim);
  auto tp = mesh();
  hp::parallelize_module(*b, tp, qwen_plan(sequence_parallel));
  at::Tensor xfull = random({2, seq, hidden}, 1);
  at::Tensor xr = xfull.clone().requires_grad_(true);
  // The block's input as the layer before hands it over: a sequence-sharded DTensor, or a plain
  // replicated tensor without sequence parallelism.
  at::Tensor local = (sequence_parallel ? piece(xfull, 1) : xfull).clone().requires_grad_(true);
  at::Tensor x = sequence_parallel ? at::Tensor(hp::DTensor::from_local(local, tp, {hp::Shard(1)})) : local;
  hp::CommDebugMode comm;
  at::Tensor out = b(x);
  if (sequence_parallel) {
    EXPECT_EQ(hp::DTensor(out).placements(), P{hp::Shard(1)});
    EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 2}, {"reduce_scatter", 2}})) << comm.summary();
  } else {
    EXPECT_FALSE(hp::is_dtensor(out));
    EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 2}})) << comm.summary();
  }
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(out, yr));
  at::Tensor w = random(yr.sizes(), 2);
  at::Tensor loss = (full(out) * w).sum();
  comm.reset();
  loss.backward();
  // The backward mirrors the forward; with sequence parallelism the two norm weights' Partial
  // gradients are reduced too (one all_reduce each).
  if (sequence_parallel)
    EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 2}, {"reduce_scatter", 2}, {"all_reduce", 2}}))
        << comm.summary();
  else
    EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 2}})) << comm.summary();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(local.grad(), sequence_parallel ? piece(xr.grad(), 1) : xr.grad()));
  auto ref_params = ref->named_parameters();
  for (const auto& p : b->named_parameters()) {
    ASSERT_TRUE(hp::is_dtensor(p.value())) << p.key();
    EXPECT_TRUE(close(grad_of(p.value()), ref_params[p.key()].grad())) << p.key();
  }
}

}  // namespace

TEST(QwenPlan, D3_MinimalBlockWithSequenceParallelEqualsSingleDevice) { check_block(true); }

TEST(QwenPlan, D5_NoParallelNormsWithoutSequenceParallelEqualSingleDevice) { check_block(false); }

TEST(QwenPlan, D4_LmHeadKeepsLogitsShardedOnTheLastDim) {
  const int64_t n = tp_size(), hidden = 8, vocab = 6 * n;
  struct HeadImpl : hnn::ModuleBase<HeadImpl> {
    HeadImpl(int64_t hidden, int64_t vocab) {
      norm = register_module("norm", hnn::RMSNorm(hidden));
      lm_head = register_module("lm_head", hnn::Linear(hnn::LinearOptions(hidden, vocab).bias(false)));
    }
    at::Tensor forward(const at::Tensor& x) { return lm_head(norm(x)); }
    hnn::RMSNorm norm{nullptr};
    hnn::Linear lm_head{nullptr};
  };
  hp_test::manual_seed(41);
  auto head = std::make_shared<HeadImpl>(hidden, vocab);
  hp_test::manual_seed(41);
  auto ref = std::make_shared<HeadImpl>(hidden, vocab);
  auto tp = mesh();
  hp::parallelize_module(*head, tp, {{"norm", hp::SequenceParallel()},
                                     {"lm_head", hp::ColwiseParallel(hp::Shard(1), hp::Shard(-1), false)}});
  at::Tensor xfull = random({2, 2 * n, hidden}, 1);
  hp::DTensor logits(hnn::call_with_hooks(*head, piece(xfull, 1)));
  EXPECT_EQ(logits.placements(), P{hp::Shard(2)});  // loss parallel: the vocab stays sharded
  EXPECT_EQ(logits.to_local().size(-1), vocab / n);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 2 * n, vocab}));
  EXPECT_TRUE(close(logits, ref->forward(xfull)));
}

}  // namespace t_dist_tensor_parallel_plan_test
