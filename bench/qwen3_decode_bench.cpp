// Decode speed and load cost of a Qwen3 HF checkpoint: one JSON line per (dtype, batch) on rank 0.
//   hprun --nproc-per-node 2 qwen3_decode_bench DIR [--new-tokens N] [--prompt-len N]   (TP=2)
//   OMP_NUM_THREADS=2 hprun --nproc-per-node 1 qwen3_decode_bench DIR ...               (one process)
//   ... --save OUT: also times save_hf_checkpoint of the float32 model into OUT
// bench/decode_vs_hf.sh runs both and transformers' own TP generate on the same checkpoint.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <hyper_parallel/hyper_parallel.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3/pretrained.h>

namespace qwen3 = hyper_parallel::qwen3;

namespace hp = hyper_parallel;

namespace {

// A field of /proc/self/status in bytes (VmHWM: the peak resident set; VmRSS: now).
int64_t status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return -1;
}

// Restarts VmHWM from the current resident set (Linux: "5" to clear_refs).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: qwen3_decode_bench DIR [--new-tokens N] [--prompt-len N]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int64_t new_tokens = 16, prompt_len = 32;
  std::string save_dir;  // --save DIR: also time save_hf_checkpoint of the float32 model
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--new-tokens") new_tokens = std::stoll(argv[i + 1]);
    else if (f == "--prompt-len") prompt_len = std::stoll(argv[i + 1]);
    else if (f == "--save") save_dir = argv[i + 1];
  }
  hp::init_process_group();
  const int64_t world = hp::get_world_size();
  c10::optional<hp::DeviceMesh> tp;
  if (world > 1) tp = hp::init_device_mesh("cpu", {world}, {"tp"});
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // Built and split first (the random init is whole on every rank: there is no deferred init),
    // then the load alone is measured: its time, its bytes, and how far it raises the peak.
    qwen3::CausalLM model = qwen3::build_model(qwen3::load_config(dir + "/config.json"), tp, dtype);
    hp::barrier(hp::world_group());
    reset_peak_rss();
    const int64_t rss_before = status_bytes("VmRSS");
    const auto t0 = std::chrono::steady_clock::now();
    qwen3::Pretrained loaded{model, hp::load_hf_checkpoint(*model, dir, {qwen3::hf_key})};
    hp::barrier(hp::world_group());
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t load_peak_growth = status_bytes("VmHWM") - rss_before;
    if (!save_dir.empty() && dtype == at::kFloat) {
      const auto s0 = std::chrono::steady_clock::now();
      const auto saved = qwen3::save_pretrained(*loaded.model, save_dir);
      const double save_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      const auto all = hp::control_all_gather(hp::world_group(), {saved.bytes_written});
      std::string per_rank;
      for (const auto& r : all) per_rank += (per_rank.empty() ? "" : ", ") + std::to_string(r[0]);
      if (hp::get_rank() == 0)
        std::printf("{\"name\": \"qwen3_save_hf\", \"tp\": %lld, \"files\": %zu, \"save_s\": %.2f, \"bytes_written_per_rank\": [%s]}\n",
                    static_cast<long long>(world), saved.files.size(), save_s, per_rank.c_str());
    }
    int64_t params = 0;
    for (const auto& p : hp::unique_parameters(*loaded.model)) params += p.numel();  // tied weights once
    for (int64_t batch : {1, 8}) {
      std::vector<std::vector<int64_t>> prompts;
      for (int64_t b = 0; b < batch; ++b) {
        std::vector<int64_t> p;
        for (int64_t s = 0; s < prompt_len - b; ++s) p.push_back((s * 7919 + b * 104729) % loaded.model->config.vocab_size);
        prompts.push_back(p);
      }
      qwen3::GenerationConfig g;
      g.max_new_tokens = 2;
      qwen3::generate(*loaded.model, prompts, g);  // warm-up: first-touch of buffers, kernel choice
      g.max_new_tokens = new_tokens;
      hp::barrier(hp::world_group());
      const auto r = qwen3::generate(*loaded.model, prompts, g);
      if (hp::get_rank() == 0)
        std::printf("{\"name\": \"qwen3_decode\", \"tp\": %lld, \"threads\": %d, \"dtype\": \"%s\", \"batch\": %lld, "
                    "\"parameters\": %lld, \"prefill_tokens_per_s\": %.1f, \"decode_tokens_per_s\": %.2f, \"load_s\": %.2f, "
                    "\"bytes_read_per_rank\": %lld, \"local_shard_bytes\": %lld, \"load_peak_rss_growth_bytes\": %lld}\n",
                    static_cast<long long>(world), at::get_num_threads(), dtype == at::kFloat ? "float32" : "bfloat16",
                    static_cast<long long>(batch), static_cast<long long>(params), r.prefill_tokens / r.prefill_seconds,
                    r.decode_steps * batch / r.decode_seconds, load_s, static_cast<long long>(loaded.load.bytes_read),
                    static_cast<long long>(loaded.load.local_bytes), static_cast<long long>(load_peak_growth));
      std::fflush(stdout);
    }
  }
  hp::destroy_process_group();
  return 0;
}
