// Qwen3.5's speed on this machine, one JSON line per measurement (bench/qwen3_5_vs_hf.sh runs
// transformers on the same shapes and checkpoint, and prints the ratios):
//   qwen3_5_bench rule [--seq 4096] [--heads 16] [--head-dim 128]
//       the Gated DeltaNet's chunked rule (nn::functional::chunk_gated_delta_rule), forward and
//       backward, float32, as Qwen3.5-0.8B's linear layers shape it (16 key and value heads of 128)
//   qwen3_5_bench decode DIR [--new-tokens 32] [--prompt-len 32]
//       greedy decode tokens/s of an HF Qwen3.5 checkpoint (qwen3_5::from_pretrained + generate)
#include <ATen/ATen.h>

#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/nn/gated_delta_rule.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <hyper_parallel/models/qwen3_5/generate.h>
#include <hyper_parallel/models/qwen3_5/pretrained.h>

namespace hp = hyper_parallel;

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 2; i + 1 < argc; ++i)
    if (argv[i] == name) return std::stoll(argv[i + 1]);
  return fallback;
}

int rule(int argc, char** argv) {
  const int64_t s = flag(argc, argv, "--seq", 4096), h = flag(argc, argv, "--heads", 16), d = flag(argc, argv, "--head-dim", 128);
  at::manual_seed(0);
  auto leaf = [](at::Tensor t) { return t.requires_grad_(true); };
  const at::Tensor q = leaf(at::randn({1, s, h, d})), k = leaf(at::randn({1, s, h, d})), v = leaf(at::randn({1, s, h, d}));
  const at::Tensor g = leaf(-at::rand({1, s, h}) * 0.5), beta = leaf(at::rand({1, s, h}));
  const at::Tensor grad_out = at::randn({1, s, h, d});
  std::vector<double> times;
  for (int rep = 0; rep < 4; ++rep) {
    times.push_back(seconds_of([&] {
      const auto out = hp::nn::functional::chunk_gated_delta_rule(q, k, v, g, beta, at::Tensor(), /*use_qk_l2norm=*/true, 64);
      out.output.backward(grad_out);
    }));
  }
  times.erase(times.begin());  // the first allocates
  std::sort(times.begin(), times.end());
  std::printf("{\"name\": \"gdn_chunk_rule\", \"impl\": \"ours\", \"seq\": %lld, \"heads\": %lld, \"head_dim\": %lld, \"threads\": %d, "
              "\"forward_backward_ms\": %.1f}\n",
              static_cast<long long>(s), static_cast<long long>(h), static_cast<long long>(d), at::get_num_threads(), times[1] * 1e3);
  return 0;
}

int decode(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string dir = argv[2];
  const int64_t new_tokens = flag(argc, argv, "--new-tokens", 32), prompt_len = flag(argc, argv, "--prompt-len", 32);
  auto loaded = hp::qwen3_5::from_pretrained(dir, c10::nullopt, at::kFloat, "cpu", /*progress=*/false);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back((i * 7919) % loaded.model->config.vocab_size);
  hp::models::GenerationConfig g;
  g.max_new_tokens = new_tokens;
  hp::qwen3_5::generate(*loaded.model, {prompt}, g);  // warm-up
  const auto r = hp::qwen3_5::generate(*loaded.model, {prompt}, g);
  std::printf("{\"name\": \"qwen3_5_decode\", \"impl\": \"ours\", \"threads\": %d, \"new_tokens\": %lld, \"decode_tokens_per_s\": %.1f, "
              "\"prefill_tokens_per_s\": %.1f}\n",
              at::get_num_threads(), static_cast<long long>(r.decode_steps), r.decode_steps / r.decode_seconds,
              r.prefill_tokens / r.prefill_seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return hp::run_program([&] {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "rule") return rule(argc, argv);
    if (mode == "decode") return decode(argc, argv);
    std::fprintf(stderr, "usage: qwen3_5_bench rule [--seq N --heads N --head-dim N] | decode DIR [--new-tokens N --prompt-len N]\n");
    return 2;
  });
}
