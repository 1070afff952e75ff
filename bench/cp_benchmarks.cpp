// Context parallelism: one causal attention step (forward and backward) over a long sequence, at
// cp = 2 in each mode (head-tail load balanced) against one process with 2 threads on the whole
// sequence, and the memory each rank's step allocates against the one process's; the same for a
// Gated DeltaNet layer's sequence mixing at 16k tokens under LinearAttentionContextParallel. Also
// the cp gradient reduction (all_reduce_gradients) against one all-reduce per parameter.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <hyper_parallel/hyper_parallel.h>

#include "bench_util.h"
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/nn/gated_delta_net.h>

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;
namespace qwen3 = hyper_parallel::qwen3;

namespace hp_bench {
namespace {

// 8k tokens, 4 query heads over 2 key heads of 32: small heads, a long sequence.
constexpr int64_t kCpSeq = 8192, kHeads = 4, kKvHeads = 2, kDim = 32;

struct Step {
  double ms = 0;
  int64_t peak_bytes = 0;
};

// One step of `sdpa` on [1, heads, seq, 32] inputs: time (median of 5) and the allocation peak.
Step attention_step(hnn::ScaledDotProductAttention& sdpa, int64_t seq, const std::function<void()>& between) {
  at::manual_seed(5);
  const at::Tensor q = at::randn({1, kHeads, seq, kDim}).requires_grad_(), k = at::randn({1, kKvHeads, seq, kDim}).requires_grad_(),
                   v = at::randn({1, kKvHeads, seq, kDim}).requires_grad_(), w = at::randn({1, kHeads, seq, kDim});
  const auto step = [&] {
    (sdpa(q, k, v) * w).sum().backward();
    q.mutable_grad().reset();
    k.mutable_grad().reset();
    v.mutable_grad().reset();
  };
  Step s;
  {
    hp::MemoryTracker mem("cpu");
    step();
    s.peak_bytes = mem.peak_bytes();
  }
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    if (between) between();
    t.push_back(time_us(step, 1, 1));
  }
  std::sort(t.begin(), t.end());
  s.ms = t[t.size() / 2] / 1000;
  return s;
}

// 16k tokens through a Gated DeltaNet of 2 key heads serving 4 value heads of 64 (chunks of 64).
constexpr int64_t kGdnSeq = 16384, kGdnKeyHeads = 2, kGdnValueHeads = 4, kGdnDim = 64;

hnn::GatedDeltaNet gdn_module() {
  hp::manual_seed(5);
  return hnn::GatedDeltaNet(hnn::GatedDeltaNetOptions(kGdnKeyHeads, kGdnValueHeads, kGdnDim, kGdnDim));
}

// One step of `gdn` on `seq` tokens: time (median of 3) and the allocation peak.
Step gdn_step(hnn::GatedDeltaNet& gdn, int64_t seq, const std::function<void()>& between) {
  at::manual_seed(5);
  const int64_t key_dim = kGdnKeyHeads * kGdnDim, value_dim = kGdnValueHeads * kGdnDim;
  std::vector<at::Tensor> x{at::randn({1, seq, key_dim}), at::randn({1, seq, key_dim}), at::randn({1, seq, value_dim}),
                            at::randn({1, seq, kGdnValueHeads}), at::randn({1, seq, kGdnValueHeads})};
  for (auto& t : x) t.requires_grad_();
  const at::Tensor w = at::randn({1, seq, kGdnValueHeads, kGdnDim});
  const auto step = [&] {
    (gdn(x[0], x[1], x[2], x[3], x[4]) * w).sum().backward();
    for (auto& t : x) t.mutable_grad().reset();
    gdn->zero_grad();
  };
  Step s;
  {
    hp::MemoryTracker mem("cpu");
    step();
    s.peak_bytes = mem.peak_bytes();
  }
  std::vector<double> t;
  for (int r = 0; r < 3; ++r) {
    if (between) between();
    t.push_back(time_us(step, 1, 1));
  }
  std::sort(t.begin(), t.end());
  s.ms = t[t.size() / 2] / 1000;
  return s;
}

}  // namespace

void run_cp_benchmarks(const std::string& filter) {
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  if (filter.empty() || std::string("cp2_all_reduce_gradients").find(filter) != std::string::npos) {
    // The demo's Qwen3 model (two layers, 25 parameters, 0.4 MB of gradients): the buckets of
    // all_reduce_gradients against one all-reduce per parameter, as it did before them.
    at::manual_seed(5);
    qwen3::CausalLM model(qwen3::Config{});
    int64_t params = 0, bytes = 0;
    for (const at::Tensor& p : hp::unique_parameters(*model)) {
      p.mutable_grad() = at::randn_like(p);
      ++params;
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
    const double inv = 1.0 / static_cast<double>(cp.size());
    const auto per_parameter = [&] {
      at::NoGradGuard no_grad;
      for (const at::Tensor& p : hp::unique_parameters(*model)) {
        at::Tensor g = p.grad();
        hp::all_reduce_(g, hp::ReduceOp::SUM, cp.get_group(0));
        g.mul_(inv);
      }
    };
    const auto bucketed = [&] { hp::all_reduce_gradients(*model, cp); };
    const auto [base, cand] = time_pair(per_parameter, bucketed, 4, 21, [] { hp::barrier(hp::world_group()); });
    if (hp::get_rank() == 0)
      emit("cp2_all_reduce_gradients", "\"cp\": " + std::to_string(cp.size()) + ", \"parameters\": " + std::to_string(params) +
                                           ", \"gradient_bytes\": " + std::to_string(bytes) + ", " +
                                           "\"what\": \"bucketed against one all-reduce per parameter\", ",
           cand, "us", base, cand / base);
  }
  if (filter.empty() || std::string("cp2_gated_delta_net").find(filter) != std::string::npos) {
    for (const std::string mode : {"ulysses", "all_gather", "p2p"}) {
      hnn::GatedDeltaNet gdn = gdn_module();
      hp::LinearAttentionContextParallel(mode).apply(*gdn, cp);
      const Step s = gdn_step(gdn, kGdnSeq / cp.size(), [] { hp::barrier(hp::world_group()); });
      if (hp::get_rank() == 0)
        std::printf("{\"name\": \"cp_gdn_step\", \"mode\": \"%s\", \"ms\": %.6g, \"peak_bytes\": %lld}\n", mode.c_str(), s.ms,
                    static_cast<long long>(s.peak_bytes));
      std::fflush(stdout);
    }
  }
  if (!filter.empty() && std::string("cp2_attention").find(filter) == std::string::npos) return;
  for (const std::string mode : {"ring", "ulysses", "allgather_kv"}) {
    hnn::ScaledDotProductAttention sdpa(hnn::ScaledDotProductAttentionOptions().is_causal(true));
    hp::ContextParallel(mode, /*load_balance=*/true).apply(*sdpa, cp);
    const Step s = attention_step(sdpa, kCpSeq / cp.size(), [] { hp::barrier(hp::world_group()); });
    if (hp::get_rank() == 0)
      std::printf("{\"name\": \"cp_step\", \"mode\": \"%s\", \"ms\": %.6g, \"peak_bytes\": %lld}\n", mode.c_str(), s.ms,
                  static_cast<long long>(s.peak_bytes));
    std::fflush(stdout);
  }
}

double single_attention_step(int threads, int64_t& peak_bytes) {
  at::set_num_threads(threads);
  hnn::ScaledDotProductAttention sdpa(hnn::ScaledDotProductAttentionOptions().is_causal(true));
  const Step s = attention_step(sdpa, kCpSeq, nullptr);
  at::set_num_threads(1);
  peak_bytes = s.peak_bytes;
  return s.ms;
}

double single_gdn_step(int threads, int64_t& peak_bytes) {
  at::set_num_threads(threads);
  hnn::GatedDeltaNet gdn = gdn_module();
  const Step s = gdn_step(gdn, kGdnSeq, nullptr);
  at::set_num_threads(1);
  peak_bytes = s.peak_bytes;
  return s.ms;
}

}  // namespace hp_bench
