// fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) against one process
// doing the same casts: each dp rank's microbatch computed by a bf16 copy of the fp32 master
// weights, the bf16 gradients averaged in fp32, AdamW on the fp32 master.
#include <gtest/gtest.h>

#include <torch/optim.h>

#include "../nn/training_util.h"

using namespace training_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_fsdp_mixed_precision_test {
namespace {

constexpr int64_t kBatch = 4, kSeq = 8;

at::Tensor batch_of(int step) { return token_batch(64, kBatch, kSeq, 90 + step); }

// The model under test: TP (when the mesh has a tp dim of size > 1), then fully_shard per layer
// and at the root with `mp`.
qwen3::CausalLM sharded_model(const hp::DeviceMesh& mesh, bool tp, const hp::MixedPrecisionPolicy& mp) {
  hp_test::manual_seed(21);
  qwen3::CausalLM model(small_config());
  if (tp) qwen3::parallelize_qwen3_tp(*model, mesh["tp"], /*sequence_parallel=*/true);
  hp::FullyShardOptions o;
  o.mp_policy = mp;
  o.mp_policy.output_dtype = c10::nullopt;  // the blocks hand bf16 on; only the root's output is cast
  for (const auto& layer : *model->layers) hp::fully_shard(*layer, mesh["dp"], o);
  o.mp_policy.output_dtype = mp.output_dtype;
  hp::fully_shard(*model, mesh["dp"], o);
  return model;
}

struct Step {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;  // whole float32 gradients before the optimizer step
  hp::CommDebugMode::Stats gather, reduce;  // this rank's all-gathers and reduce-scatters
};

std::vector<Step> train_sharded(const hp::DeviceMesh& mesh, bool tp, const hp::MixedPrecisionPolicy& mp, int steps) {
  qwen3::CausalLM model = sharded_model(mesh, tp, mp);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);  // the master stays fp32
  torch::optim::AdamW opt(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-2));
  const int64_t dp = mesh["dp"].size(0), r = mesh["dp"].get_local_rank();
  std::vector<Step> out;
  for (int step = 0; step < steps; ++step) {
    const at::Tensor ids = batch_of(step);
    Step s;
    at::Tensor loss;
    {
      hp::CommDebugMode comm;  // the step's collectives only
      at::Tensor logits = model(dp_rows(ids.narrow(1, 0, kSeq), r, dp));
      if (mp.param_dtype) EXPECT_EQ(logits.scalar_type(), mp.output_dtype.value_or(*mp.param_dtype));
      loss = qwen3::causal_lm_loss(logits, dp_rows(ids.narrow(1, 1, kSeq), r, dp));
      opt.zero_grad();
      loss.backward();
      for (const auto& [group, phases] : comm.get_comm_group_stats()) {
        if (group != mesh["dp"].get_group().ranks()) continue;
        for (const auto& [phase, kinds] : phases) {
          if (kinds.count("all_gather")) s.gather.bytes += kinds.at("all_gather").bytes;
          if (kinds.count("reduce_scatter")) s.reduce.bytes += kinds.at("reduce_scatter").bytes;
        }
      }
    }
    s.loss = hp::all_reduce(loss.detach().to(at::kFloat).reshape({1}), hp::ReduceOp::AVG, mesh["dp"].get_group())[0].item<double>();
    for (const auto& p : model->named_parameters()) {
      EXPECT_EQ(p.value().grad().scalar_type(), at::kFloat) << p.key();
      s.grads[p.key()] = whole(p.value().grad());
    }
    out.push_back(std::move(s));
    opt.step();
    EXPECT_TRUE(hp_test::replicas_bitwise_equal(*model)) << "step " << step;
  }
  return out;
}

// One process: the fp32 master; each step, a copy cast to `compute` computes every dp rank's
// microbatch; the gradients are cast to float32 and averaged (in `reduce`).
std::vector<Step> train_one_process(int64_t dp, at::ScalarType compute, at::ScalarType reduce, int steps) {
  hp_test::manual_seed(21);
  qwen3::CausalLM master(small_config());
  torch::optim::AdamW opt(hp::unique_parameters(*master), torch::optim::AdamWOptions(1e-2));
  std::vector<Step> out;
  for (int step = 0; step < steps; ++step) {
    const at::Tensor ids = batch_of(step);
    Step s;
    std::map<std::string, at::Tensor> sum;
    for (int64_t r = 0; r < dp; ++r) {
      hp_test::manual_seed(21);
      qwen3::CausalLM copy(small_config());
      {
        at::NoGradGuard no_grad;
        auto mp = master->named_parameters();
        for (auto& p : copy->named_parameters()) p.value().copy_(mp[p.key()]);
      }
      copy->to(compute);
      at::Tensor loss = qwen3::causal_lm_loss(copy(dp_rows(ids.narrow(1, 0, kSeq), r, dp)), dp_rows(ids.narrow(1, 1, kSeq), r, dp));
      loss.backward();
      s.loss += loss.item<double>() / static_cast<double>(dp);
      for (const auto& p : copy->named_parameters()) {
        const at::Tensor g = p.value().grad().to(reduce) / static_cast<double>(dp);
        sum[p.key()] = sum.count(p.key()) ? (sum[p.key()] + g) : g;
      }
    }
    auto mp = master->named_parameters();
    for (auto& [name, g] : sum) {
      s.grads[name] = g.to(at::kFloat);
      mp[name].mutable_grad() = g.to(at::kFloat);
    }
    out.push_back(std::move(s));
    opt.step();
  }
  return out;
}

double distance(const Step& a, const Step& b) {
  double d = 0;
  for (const auto& [name, g] : a.grads) d += (g - b.grads.at(name)).pow(2).sum().item<double>();
  return std::sqrt(d);
}

void check_mixed_precision(const hp::DeviceMesh& mesh, bool tp) {
  const int steps = 3;
  const hp::MixedPrecisionPolicy bf16_fp32{at::kBFloat16, at::kFloat, c10::nullopt, true};
  const hp::MixedPrecisionPolicy bf16_bf16{at::kBFloat16, at::kBFloat16, c10::nullopt, true};
  const int64_t dp = mesh["dp"].size(0);
  const auto mp = train_sharded(mesh, tp, bf16_fp32, steps);
  const auto ref = train_one_process(dp, at::kBFloat16, at::kFloat, steps);
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_NEAR(mp[static_cast<size_t>(step)].loss, ref[static_cast<size_t>(step)].loss, 1e-2 * (1 + std::abs(ref[static_cast<size_t>(step)].loss)));
    for (const auto& [name, g] : ref[static_cast<size_t>(step)].grads)
      EXPECT_TRUE(hp_test::close(mp[static_cast<size_t>(step)].grads.at(name), g, 1e-2, 1e-2)) << name;
  }
  // The first step's gradients (same weights everywhere): fp32 reduction is closer to the fp32
  // run's than bf16 reduction.
  const auto fp32 = train_sharded(mesh, tp, hp::MixedPrecisionPolicy{}, 1);
  const auto bf16_reduced = train_sharded(mesh, tp, bf16_bf16, 1);
  EXPECT_LT(distance(mp[0], fp32[0]), distance(bf16_reduced[0], fp32[0]));
  // bf16 gathers move half the bytes; the reduce-scatters carry reduce_dtype.
  EXPECT_EQ(2 * mp[0].gather.bytes, fp32[0].gather.bytes);
  EXPECT_EQ(mp[0].reduce.bytes, fp32[0].reduce.bytes);
  EXPECT_EQ(2 * bf16_reduced[0].reduce.bytes, fp32[0].reduce.bytes);
  EXPECT_GT(fp32[0].gather.bytes, 0);
}

}  // namespace

TEST(MixedPrecisionDist, DataParallelBf16GatherFp32ReduceMatchesOneProcess) {
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"dp"});
  check_mixed_precision(mesh, /*tp=*/false);
}

TEST(MixedPrecisionDist, DpTimesTpBf16GatherFp32ReduceMatchesOneProcess) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  check_mixed_precision(mesh, /*tp=*/true);
}

// output_dtype casts the outputs; the policy's dtypes must be floating-point.
TEST(MixedPrecisionDist, OutputDtypeAndRefusals) {
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"dp"});
  hp::MixedPrecisionPolicy mp{at::kBFloat16, at::kFloat, at::kFloat, true};
  qwen3::CausalLM model = sharded_model(mesh, false, mp);
  EXPECT_EQ(model(token_batch(64, 2, 4, 1).narrow(1, 0, 4)).scalar_type(), at::kFloat);
  hp_test::manual_seed(21);
  qwen3::CausalLM other(small_config());
  hp::FullyShardOptions o;
  o.mp_policy.param_dtype = at::kLong;
  EXPECT_THROW(hp::fully_shard(*other, mesh["dp"], o), c10::TypeError);
  EXPECT_FALSE(hp::is_dtensor(other->lm_head->weight()));  // nothing changed
}

}  // namespace t_dist_fsdp_mixed_precision_test
