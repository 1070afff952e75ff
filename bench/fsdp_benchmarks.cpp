// FSDP benchmark: a training step of the demo's Qwen3 model with fully_shard (parameter groups:
// one all-gather and one reduce-scatter per block) against the same step with replicated
// parameters and one all-reduce of a flat gradient buffer (DDP-style), timed alternately in one
// run, with the collectives of each step, with and without resharding after forward. dp = 2,
// tp = world size / 2 (1 or 2).
#include <ATen/ATen.h>
#include <torch/optim.h>

#include <hyper_parallel/hyper_parallel.h>

#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include "bench_util.h"
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace qwen3 = hyper_parallel::qwen3;

namespace hp = hyper_parallel;

namespace hp_bench {
namespace {

constexpr int64_t kRowsPerDpRank = 4, kFsdpSeq = 32;

struct Setup {
  hp::DeviceMesh dp, tp;
  int64_t tp_size = 1;
};

Setup make_meshes() {
  Setup s;
  s.tp_size = hp::get_world_size() / 2;
  if (s.tp_size == 1) {
    s.dp = hp::init_device_mesh("cpu", {2}, {"dp"});
  } else {
    auto mesh = hp::init_device_mesh("cpu", {2, s.tp_size}, {"dp", "tp"});
    s.dp = mesh["dp"];
    s.tp = mesh["tp"];
  }
  return s;
}

qwen3::CausalLM make_model(const Setup& s) {
  at::manual_seed(5);
  qwen3::CausalLM model(qwen3::Config{});
  if (s.tp_size > 1) qwen3::parallelize_qwen3_tp(*model, s.tp, /*sequence_parallel=*/true);
  return model;
}

std::string counts(const std::map<std::string, int64_t>& m) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    os << (first ? "" : ", ") << "\"" << k << "\": " << v;
    first = false;
  }
  os << "}";
  return os.str();
}

}  // namespace

namespace {

// One FSDP training step of the demo's default model on this dp rank's rows, with mixed precision
// `mp` and activation checkpointing `ac`.
struct FsdpStep {
  qwen3::CausalLM model{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
  at::Tensor x, y;
  FsdpStep(const Setup& s, const hp::MixedPrecisionPolicy& mp, const hp::ActivationCheckpointPolicy& ac, const at::Tensor& ids) {
    model = make_model(s);
    hp::apply_activation_checkpointing(*model, ac);
    hp::FullyShardOptions o;
    o.mp_policy = mp;
    for (const auto& layer : *model->layers) hp::fully_shard(*layer, s.dp, o);
    if (mp.param_dtype) o.mp_policy.output_dtype = at::kFloat;
    hp::fully_shard(*model, s.dp, o);
    opt = std::make_unique<torch::optim::SGD>(hp::unique_parameters(*model), torch::optim::SGDOptions(0.01));
    x = ids.narrow(1, 0, kFsdpSeq);
    y = ids.narrow(1, 1, kFsdpSeq);
  }
  void operator()() {
    opt->zero_grad();
    qwen3::causal_lm_loss(model(x), y).backward();
    opt->step();
  }
};

void run_training_benchmarks(const std::string& filter, const Setup& s, const at::Tensor& ids) {
  const auto barrier = [] { hp::barrier(hp::world_group()); };
  const std::string where = "\"dp\": 2, \"tp\": " + std::to_string(s.tp_size) + ", ";
  if (filter.empty() || std::string("fsdp_bf16_vs_fp32").find(filter) != std::string::npos) {
    FsdpStep fp32(s, {}, hp::ActivationCheckpointPolicy::none(), ids);
    FsdpStep bf16(s, {at::kBFloat16, at::kFloat, c10::nullopt, true}, hp::ActivationCheckpointPolicy::none(), ids);
    const auto [base, cand] = time_pair([&] { fp32(); }, [&] { bf16(); }, 2, 9, barrier);
    if (hp::get_rank() == 0)
      emit("fsdp_bf16_vs_fp32", where + "\"what\": \"FSDP step, bf16 gathers and compute, fp32 reduction\", ", cand / 1000, "ms",
           base / 1000, cand / base);
  }
  if (filter.empty() || std::string("activation_checkpointing").find(filter) != std::string::npos) {
    FsdpStep none(s, {}, hp::ActivationCheckpointPolicy::none(), ids);
    for (const char* policy : {"selective", "full"}) {
      FsdpStep ckpt(s, {}, hp::ActivationCheckpointPolicy::parse(policy), ids);
      const auto [base, cand] = time_pair([&] { none(); }, [&] { ckpt(); }, 2, 9, barrier);
      if (hp::get_rank() == 0)
        emit(std::string("activation_checkpointing_") + policy, where + "\"what\": \"FSDP step against no checkpointing\", ",
             cand / 1000, "ms", base / 1000, cand / base);
    }
  }
}

}  // namespace

void run_fsdp_benchmarks(const std::string& filter) {
  const Setup s = make_meshes();
  {
    const at::Tensor ids = at::randint(256, {kRowsPerDpRank * 2, kFsdpSeq + 1}, at::detail::createCPUGenerator(7), at::kLong)
                               .chunk(2, 0)[s.dp.get_local_rank()].contiguous();
    run_training_benchmarks(filter, s, ids);
  }
  if (!filter.empty() && std::string("fsdp_vs_ddp").find(filter) == std::string::npos &&
      std::string("fsdp_no_reshard_vs_ddp").find(filter) == std::string::npos)
    return;
  at::Tensor ids = at::randint(256, {kRowsPerDpRank * 2, kFsdpSeq + 1}, at::detail::createCPUGenerator(7), at::kLong)
                       .chunk(2, 0)[s.dp.get_local_rank()].contiguous();
  const at::Tensor x = ids.narrow(1, 0, kFsdpSeq), y = ids.narrow(1, 1, kFsdpSeq);

  // reshard_after_forward as FSDP2's default (true: gathered again in backward) and false (kept
  // from forward to backward, as ZeRO-2: fewer all-gathers, the whole group's parameters held).
  struct Fsdp {
    qwen3::CausalLM model{nullptr};
    std::unique_ptr<torch::optim::SGD> opt;
  };
  auto make_fsdp = [&](bool reshard_after_forward) {
    Fsdp f;
    f.model = make_model(s);
    hp::FullyShardOptions o;
    o.reshard_after_forward = reshard_after_forward;
    for (const auto& layer : *f.model->layers) hp::fully_shard(*layer, s.dp, o);
    hp::fully_shard(*f.model, s.dp, o);
    f.opt = std::make_unique<torch::optim::SGD>(f.model->parameters(), torch::optim::SGDOptions(0.01));
    return f;
  };
  Fsdp fsdp = make_fsdp(true), kept = make_fsdp(false);
  auto step_of = [&](Fsdp& f) {
    return [&f, &x, &y] {
      f.opt->zero_grad();
      qwen3::causal_lm_loss(f.model(x), y).backward();
      f.opt->step();
    };
  };
  const std::function<void()> fsdp_step = step_of(fsdp), kept_step = step_of(kept);

  qwen3::CausalLM ddp = make_model(s);
  torch::optim::SGD ddp_opt(ddp->parameters(), torch::optim::SGDOptions(0.01));
  std::vector<at::Tensor> params = ddp->parameters();
  int64_t total = 0;
  for (const auto& p : params) total += hp::local_tensor(p).numel();
  at::Tensor flat = at::empty({total});
  auto ddp_step = [&] {
    ddp_opt.zero_grad();
    qwen3::causal_lm_loss(ddp(x), y).backward();
    // One all-reduce of every local gradient, flattened (what DDP's buckets do, as one bucket).
    at::NoGradGuard no_grad;
    int64_t at = 0;
    auto local_grad = [](const at::Tensor& p) { return hp::is_dtensor(p) ? hp::DTensor(p.grad()).to_local() : p.grad(); };
    for (const auto& p : params) {
      const at::Tensor g = local_grad(p);
      flat.narrow(0, at, g.numel()).copy_(g.reshape({-1}));
      at += g.numel();
    }
    hp::all_reduce_(flat, hp::ReduceOp::AVG, s.dp.get_group());
    at = 0;
    for (const auto& p : params) {
      at::Tensor g = local_grad(p);
      g.copy_(flat.narrow(0, at, g.numel()).view(g.sizes()));
      at += g.numel();
    }
    ddp_opt.step();
  };

  const auto collectives_of = [](const std::function<void()>& step) {
    hp::CommDebugMode c;
    step();
    return c.get_comm_counts();
  };
  const auto fsdp_counts = collectives_of(fsdp_step), kept_counts = collectives_of(kept_step), ddp_counts = collectives_of(ddp_step);
  const auto barrier = [] { hp::barrier(hp::world_group()); };
  const auto [ddp_us, fsdp_us] = time_pair(ddp_step, fsdp_step, 2, 9, barrier);
  const auto [ddp2_us, kept_us] = time_pair(ddp_step, kept_step, 2, 9, barrier);
  if (hp::get_rank() == 0) {
    const auto describe = [&](const std::map<std::string, int64_t>& fsdp_collectives) {
      std::ostringstream extra;
      extra << "\"dp\": 2, \"tp\": " << s.tp_size << ", \"tokens_per_dp_rank\": " << kRowsPerDpRank * kFsdpSeq
            << ", \"fsdp_collectives_per_step\": " << counts(fsdp_collectives) << ", \"ddp_collectives_per_step\": " << counts(ddp_counts)
            << ", ";
      return extra.str();
    };
    emit("fsdp_vs_ddp", describe(fsdp_counts), fsdp_us / 1000, "ms", ddp_us / 1000, fsdp_us / ddp_us);
    emit("fsdp_no_reshard_vs_ddp", describe(kept_counts) + "\"reshard_after_forward\": false, ", kept_us / 1000, "ms", ddp2_us / 1000,
         kept_us / ddp2_us);
  }
}

}  // namespace hp_bench
