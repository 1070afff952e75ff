// hp_bench: prints one JSON object per line: name, value, unit and, where a baseline is measured
// in the same run, baseline and ratio. Usage: hp_bench [name-filter]; hp_bench --vs-pytorch runs
// our side of bench/vs_pytorch.py (as a rank of a job that script starts).
// Single-process benchmarks run on a 1-rank job it sets up itself when not started by hprun.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/optim.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/nn/layers.h>

#include "bench_util.h"
#include "op_cases.h"

namespace hp = hyper_parallel;
using hp_bench::emit;
using hp_bench::time_pair;

namespace {

std::string g_filter;

bool wanted(const std::string& name) { return g_filter.empty() || name.find(g_filter) != std::string::npos; }

// The BLAS that CPU matmuls run on: the one libtorch was built with (the wheel links MKL in), or
// for Debian's libtorch the library libblas.so.3 resolves to in this process.
std::string blas_in_use() {
  const std::string config = at::show_config();
  const size_t at = config.find("BLAS_INFO=");
  const std::string built = at == std::string::npos ? "" : config.substr(at + 10, config.find_first_of(", \n", at + 10) - at - 10);
  if (built == "mkl") return "mkl (linked into libtorch)";
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libblas") != std::string::npos || line.find("openblas") != std::string::npos) return line.substr(line.find('/'));
  return built.empty() ? "unknown" : built;
}

// DTensor op vs the same op on plain tensors, on a rule-cache hit.
void dtensor_op_overhead(const hp::DeviceMesh& mesh) {
  const std::string name = "dtensor_op_overhead";
  if (!wanted(name)) return;
  hp_bench::OpCases ops(mesh);
  at::NoGradGuard no_grad;
  for (const auto& c : ops.cases) {
    const auto [p, d] = time_pair(c.plain, c.dist, 4000);
    emit(name, "\"op\": \"" + c.op + "\", \"shape\": [8, 16], ", d - p, "us", p, d / p);
  }
}

// The same cases for callgrind, whose instruction counts are stable where these VMs' timings are
// not: `valgrind --tool=callgrind hp_bench --instructions <add|linear|layer_norm> N`, then
// callgrind_annotate --inclusive=yes; the inclusive counts of hp_bench_repeat_plain and
// hp_bench_repeat_dtensor divided by N are the instructions per op (after 200 warm-up calls that
// fill the rule cache).
__attribute__((noinline, noipa)) void hp_bench_repeat_plain(const std::function<void()>& f, int n) {
  for (int i = 0; i < n; ++i) f();
}
__attribute__((noinline, noipa)) void hp_bench_repeat_dtensor(const std::function<void()>& f, int n) {
  for (int i = 0; i < n; ++i) f();
}
void dtensor_op_instructions(const hp::DeviceMesh& mesh, const std::string& op, int n) {
  hp_bench::OpCases ops(mesh);
  at::NoGradGuard no_grad;
  auto c = std::find_if(ops.cases.begin(), ops.cases.end(), [&](const auto& k) { return k.op == op; });
  TORCH_CHECK(c != ops.cases.end(), "hp_bench --instructions: no case '", op, "' (add, linear, layer_norm)");
  for (int i = 0; i < 200; ++i) {
    c->plain();
    c->dist();
  }
  hp_bench_repeat_plain(c->plain, n);
  hp_bench_repeat_dtensor(c->dist, n);
}

// One Adam step on a small MLP's DTensor parameters vs the same parameters as plain tensors.
void adam_step(const hp::DeviceMesh& mesh) {
  const std::string name = "adam_step";
  if (!wanted(name)) return;
  const int64_t h = 256;
  std::vector<at::Tensor> plain{at::randn({4 * h, h}), at::randn({4 * h}), at::randn({h, 4 * h}), at::randn({h})};
  for (at::Tensor& t : plain) t = t.to(at::Device(mesh.device_type()));
  const hp::Placements pl[] = {{hp::Shard(0)}, {hp::Shard(0)}, {hp::Shard(1)}, {hp::Replicate()}};
  std::vector<at::Tensor> dist;
  for (size_t k = 0; k < plain.size(); ++k) {
    plain[k].requires_grad_(true);
    auto d = hp::distribute_tensor(plain[k].detach(), mesh, pl[k]);
    d.set_requires_grad(true);
    dist.push_back(d);
    plain[k].mutable_grad() = at::randn_like(plain[k]);
    dist.back().mutable_grad() = hp::distribute_tensor(plain[k].grad(), mesh, pl[k]);
  }
  torch::optim::Adam op(plain, torch::optim::AdamOptions(1e-3));
  torch::optim::Adam od(dist, torch::optim::AdamOptions(1e-3));
  const auto [p, d] = time_pair([&] { op.step(); }, [&] { od.step(); }, 20, 31);
  emit(name, "\"hidden\": 256, \"params\": 4, ", d, "us", p, d / p);
}

// Dropout with the layout-independent mask (hp::dropout: Philox per element) vs at::dropout on
// the same plain tensor (torch's generator), per element; and the same on a DTensor's shard.
void dropout_cost(const hp::DeviceMesh& mesh) {
  const std::string name = "dropout_cost";
  if (!wanted(name)) return;
  const int64_t rows = 256, cols = 1024;
  at::Tensor x = at::randn({rows, cols}, at::TensorOptions().device(at::Device(mesh.device_type())));
  at::NoGradGuard no_grad;
  const double n = static_cast<double>(rows * cols);
  const auto [torch_us, ours_us] = time_pair([&] { at::dropout(x, 0.1, true); }, [&] { hp::dropout(x, 0.1, true); }, 30, 15);
  // value: ns per element of hp::dropout; baseline: of at::dropout.
  emit(name, "\"tensor\": \"plain\", \"shape\": [256, 1024], \"p\": 0.1, ", 1e3 * ours_us / n, "ns", 1e3 * torch_us / n,
       ours_us / torch_us);
  hp::DTensor d = hp::distribute_tensor(x, mesh, {hp::Shard(1)});
  const double local = n / static_cast<double>(mesh.size());
  const auto [plain_us, dt_us] = time_pair([&] { hp::dropout(x, 0.1, true); }, [&] { hp::dropout(d, 0.1, true); }, 30, 15);
  // value: ns per local element of the DTensor's dropout; baseline: per element of the plain one.
  emit(name, "\"tensor\": \"DTensor Shard(1)\", \"shape\": [256, 1024], \"p\": 0.1, ", 1e3 * dt_us / local, "ns",
       1e3 * plain_us / n, (dt_us / local) / (plain_us / n));
}

// A hook-free module call vs calling forward directly.
void module_call_overhead() {
  const std::string name = "module_call_overhead";
  if (!wanted(name)) return;
  hyper_parallel::nn::Linear lin(16, 16);
  at::Tensor x = at::randn({4, 16});
  at::NoGradGuard no_grad;
  const auto [direct, call] = time_pair([&] { lin->forward(x); }, [&] { lin(x); }, 20000);
  emit(name, "\"module\": \"Linear(16, 16)\", ", call - direct, "us", direct, call / direct);
}

// A Linear's decode-time product (InferenceMode, float32) as the Linear runs it at each batch,
// against at::linear, at Qwen3-0.6B's projection shapes: the small-batch rule's evidence.
// value: the Linear's time; baseline: at::linear's; ratio < 1: the Linear is faster.
void linear_small_batch() {
  const std::string name = "linear_small_batch";
  if (!wanted(name)) return;
  c10::InferenceMode inference;
  for (const auto& [out_f, in_f] : std::vector<std::pair<int64_t, int64_t>>{{2048, 1024}, {3072, 1024}, {1024, 3072}}) {
    hyper_parallel::nn::Linear lin(hyper_parallel::nn::LinearOptions(in_f, out_f).bias(false));
    for (int64_t batch : {1, 8, 32}) {
      const at::Tensor x = at::randn({batch, in_f});
      const auto [linear, ours] = time_pair([&] { at::linear(x, lin->weight()); }, [&] { lin(x); }, 40);
      emit(name,
           "\"weight\": [" + std::to_string(out_f) + ", " + std::to_string(in_f) + "], \"batch\": " + std::to_string(batch) +
               ", \"transposed_product\": " + (hyper_parallel::nn::small_batch_transposed_product(x, lin->weight()) ? "true" : "false") + ", ",
           ours, "us", linear, ours / linear);
    }
  }
}

}  // namespace

namespace hp_bench {
double single_block_step_ms(int threads);
}

// Runs this binary as a 2-rank job under hprun in `mode` (with `env` before it) and returns rank
// 0's output lines, prefix removed; a failed job is reported on stderr.
std::vector<std::string> rank0_lines(const char* self, const std::string& env, const char* mode, int nproc = 2) {
  const std::string cmd = env + " " + HP_HPRUN_PATH + " --nproc-per-node " + std::to_string(nproc) + " " + self + " " + mode +
                          " '" + g_filter + "' 2>&1";
  std::vector<std::string> out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[8192];
  const std::string prefix = "[rank0]: ";
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    const std::string l(line);
    if (l.rfind(prefix, 0) == 0) out.push_back(l.substr(prefix.size()));
  }
  const int rc = pclose(pipe);
  if (rc != 0) std::fprintf(stderr, "hp_bench: the benchmark job failed (status %d): %s\n", rc, cmd.c_str());
  return out;
}

// Runs the multi-rank benchmarks under hprun (this binary with --worker) and relays rank 0's
// JSON lines; the worker's step time feeds the efficiency figure.
void tp_benchmarks(const char* self) {
  const std::string names[] = {"tp_mlp_vs_manual", "tp_block_vs_manual", "tp2_vs_single_2threads", "collectives_per_layer",
                               "param_bytes_per_rank", "save_sharded"};
  bool any = false;
  for (const auto& n : names) any = any || wanted(n);
  if (!any) return;
  double tp_step_ms = -1, tp_sp_step_ms = -1;
  for (const auto& l : rank0_lines(self, "", "--worker")) {
    if (l.find("\"tp_step_ms\"") != std::string::npos) tp_step_ms = std::stod(l.substr(l.find("\"value\": ") + 9));
    else if (l.find("\"tp_sp_step_ms\"") != std::string::npos) tp_sp_step_ms = std::stod(l.substr(l.find("\"value\": ") + 9));
    else if (l.rfind("{", 0) == 0) std::fputs(l.c_str(), stdout);
  }
  if (tp_step_ms > 0 && wanted("tp2_vs_single_2threads")) {
    const double single = hp_bench::single_block_step_ms(2);
    emit("tp2_vs_single_2threads", "\"tp\": 2, \"single_threads\": 2, \"what\": \"decoder layer fwd+bwd\", ", tp_step_ms, "ms",
         single, tp_step_ms / single);
    // With sequence parallelism the norms and residual adds are split too, not repeated per rank.
    if (tp_sp_step_ms > 0)
      emit("tp2_sp_vs_single_2threads", "\"tp\": 2, \"single_threads\": 2, \"sequence_parallel\": true, \"what\": \"decoder layer fwd+bwd\", ",
           tp_sp_step_ms, "ms", single, tp_sp_step_ms / single);
  }
}

// fully_shard against DDP-style replication: a 2-rank (dp=2) and a 4-rank (dp=2 x tp=2) job.
// Also the training-at-scale steps: bf16 mixed precision against float32, and each activation
// checkpointing policy against none.
void fsdp_benchmarks(const char* self) {
  if (!wanted("fsdp_vs_ddp") && !wanted("fsdp_no_reshard_vs_ddp") && !wanted("fsdp_bf16_vs_fp32") && !wanted("activation_checkpointing")) return;
  for (int nproc : {2, 4})
    for (const auto& l : rank0_lines(self, "", "--fsdp", nproc))
      if (l.rfind("{", 0) == 0) std::fputs(l.c_str(), stdout);
}

// Context parallelism: a 2-rank job (cp = 2) runs a causal attention step over 8k tokens in each
// mode; this process runs it on the whole sequence with 2 threads.
void cp_benchmarks(const char* self) {
  if (!wanted("cp2_attention") && !wanted("cp2_all_reduce_gradients") && !wanted("cp2_gated_delta_net")) return;
  std::vector<std::string> lines = rank0_lines(self, "", "--cp", 2);
  for (const auto& l : lines)
    if (l.find("\"cp2_all_reduce_gradients\"") != std::string::npos) std::fputs(l.c_str(), stdout);
  auto field = [](const std::string& l, const std::string& key) { return std::stod(l.substr(l.find("\"" + key + "\": ") + key.size() + 4)); };
  auto mode_of = [](const std::string& l) {
    const size_t m = l.find("\"mode\": \"") + 9;
    return l.substr(m, l.find('"', m) - m);
  };
  if (wanted("cp2_gated_delta_net")) {
    int64_t single_peak = 0;
    const double single_ms = hp_bench::single_gdn_step(2, single_peak);
    for (const auto& l : lines) {
      if (l.find("\"cp_gdn_step\"") == std::string::npos) continue;
      const double ms = field(l, "ms"), peak = field(l, "peak_bytes");
      const std::string params = "\"mode\": \"" + mode_of(l) + "\", \"seq\": 16384, \"key_heads\": 2, \"value_heads\": 4, \"head_dim\": 64, ";
      emit("cp2_gated_delta_net_vs_single_2threads", params + "\"what\": \"Gated DeltaNet conv + chunked rule fwd+bwd\", ", ms, "ms",
           single_ms, ms / single_ms);
      emit("cp2_gated_delta_net_memory_per_rank", params, peak, "bytes", static_cast<double>(single_peak),
           peak / static_cast<double>(single_peak));
    }
  }
  if (!wanted("cp2_attention")) return;
  int64_t single_peak = 0;
  const double single_ms = hp_bench::single_attention_step(2, single_peak);
  for (const auto& l : lines) {
    if (l.find("\"cp_step\"") == std::string::npos) continue;
    const size_t m = l.find("\"mode\": \"") + 9;
    const std::string mode = l.substr(m, l.find('"', m) - m);
    const double ms = field(l, "ms"), peak = field(l, "peak_bytes");
    const std::string params = "\"mode\": \"" + mode + "\", \"seq\": 8192, \"heads\": 4, \"kv_heads\": 2, \"head_dim\": 32, ";
    emit("cp2_attention_vs_single_2threads", params + "\"what\": \"causal attention fwd+bwd, load-balanced\", ", ms, "ms", single_ms,
         ms / single_ms);
    emit("cp2_attention_memory_per_rank", params, peak, "bytes", static_cast<double>(single_peak), peak / static_cast<double>(single_peak));
  }
}

// Collective latencies: a 2-rank job per transport (shared memory, then Gloo), rank 0's lines
// relayed; the ratio lines compare the two at each size.
void collective_benchmarks(const char* self) {
  if (!wanted("all_reduce_latency") && !wanted("all_gather_latency")) return;
  std::vector<std::string> lines[2];
  const char* transports[] = {"auto", "gloo"};
  for (int t = 0; t < 2; ++t)
    for (const auto& l : rank0_lines(self, std::string("HP_TRANSPORT=") + transports[t], "--collectives"))
      if (l.find("latency") != std::string::npos) {
        std::fputs(l.c_str(), stdout);
        lines[t].push_back(l);
      }
  auto field = [](const std::string& l, const std::string& key) {
    const size_t at = l.find("\"" + key + "\": ");
    return at == std::string::npos ? -1.0 : std::stod(l.substr(at + key.size() + 4));
  };
  for (size_t i = 0; i < std::min(lines[0].size(), lines[1].size()); ++i) {
    const std::string name = lines[0][i].find("all_reduce") != std::string::npos ? "all_reduce_shm_vs_gloo" : "all_gather_shm_vs_gloo";
    const double bytes = std::max(field(lines[0][i], "bytes"), field(lines[0][i], "output_bytes"));
    const double shm = field(lines[0][i], "median_us"), gloo = field(lines[1][i], "median_us");
    emit(name, "\"bytes\": " + std::to_string(static_cast<long long>(bytes)) + ", ", shm, "us", gloo, shm / gloo);
  }
}

int main(int argc, char** argv) {
  // A rank of the tp benchmarks (--worker) or of the collective benchmarks (--collectives).
  const std::string mode = argc > 2 ? argv[1] : "";
  if (argc > 1 && std::string(argv[1]) == "--vs-pytorch") {  // a rank of bench/vs_pytorch.py's job
    at::set_num_threads(1);
    hp::init_process_group();
    hp_bench::run_vs_pytorch_cases();
    hp::destroy_process_group();
    return 0;
  }
  if (mode == "--worker" || mode == "--collectives" || mode == "--fsdp" || mode == "--cp") {
    at::set_num_threads(1);
    hp::init_process_group();
    if (mode == "--worker") hp_bench::run_tp_benchmarks(argv[2]);
    else if (mode == "--fsdp") hp_bench::run_fsdp_benchmarks(argv[2]);
    else if (mode == "--cp") hp_bench::run_cp_benchmarks(argv[2]);
    else hp_bench::run_collective_benchmarks(argv[2]);
    hp::destroy_process_group();
    return 0;
  }
  if (argc > 1) g_filter = argv[1];
  if (!std::getenv("RANK")) {  // a 1-rank job of our own
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29731", 1);
  }
  at::set_num_threads(1);
  // HP_BENCH_DEVICE=cuda: the op overheads, Adam and module calls on the GPU (scripts/gpu_check.sh).
  const char* bench_device = std::getenv("HP_BENCH_DEVICE");
  hp::InitOptions init;
  if (bench_device != nullptr && *bench_device != '\0') init.device_type = bench_device;
  hp::init_process_group(init);
  auto mesh = hp::init_device_mesh(init.device_type, {hp::get_world_size()}, {"tp"});
  if (argc > 3 && std::string(argv[1]) == "--instructions") {
    dtensor_op_instructions(mesh, argv[2], std::atoi(argv[3]));
    hp::destroy_process_group();
    return 0;
  }
  if (hp::get_rank() == 0)
    std::printf("{\"name\": \"environment\", \"blas\": \"%s\", \"intra_op_threads\": %d, \"world_size\": %lld}\n",
                blas_in_use().c_str(), at::get_num_threads(), static_cast<long long>(hp::get_world_size()));
  dtensor_op_overhead(mesh);
  adam_step(mesh);
  dropout_cost(mesh);
  module_call_overhead();
  linear_small_batch();
  hp::destroy_process_group();
  tp_benchmarks(argv[0]);
  fsdp_benchmarks(argv[0]);
  cp_benchmarks(argv[0]);
  collective_benchmarks(argv[0]);
  return 0;
}
