// hp_bench: prints one JSON object per line: name, value, unit and, where a baseline is measured
// in the same run, baseline and ratio. Usage: hp_bench [name-filter]
// Single-process benchmarks run on a 1-rank job it sets up itself when not started by hprun.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
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

namespace hp = hyper_parallel;

namespace {

std::string g_filter;

bool wanted(const std::string& name) { return g_filter.empty() || name.find(g_filter) != std::string::npos; }

// Median over `reps` repetitions of the mean time per call of `fn` (in microseconds).
double time_us(const std::function<void()>& fn, int iters, int reps = 11) {
  for (int i = 0; i < iters / 4 + 1; ++i) fn();  // warm-up: caches, allocator
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    auto t1 = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Baseline and candidate timed in alternating repetitions, so that drift (frequency, page
// faults of the first runs) hits both alike. Returns {baseline_us, candidate_us}.
std::pair<double, double> time_pair(const std::function<void()>& base, const std::function<void()>& cand,
                                    int iters, int reps = 11) {
  for (int i = 0; i < iters / 4 + 1; ++i) { base(); cand(); }
  std::vector<double> tb, tc;
  for (int r = 0; r < reps; ++r) {
    tb.push_back(time_us(base, iters, 1));
    tc.push_back(time_us(cand, iters, 1));
  }
  std::sort(tb.begin(), tb.end());
  std::sort(tc.begin(), tc.end());
  return {tb[tb.size() / 2], tc[tc.size() / 2]};
}

void emit(const std::string& name, const std::string& params, double value, const char* unit,
          double baseline = -1, double ratio = -1) {
  std::printf("{\"name\": \"%s\", %s\"value\": %.4g, \"unit\": \"%s\"", name.c_str(), params.c_str(), value, unit);
  if (baseline >= 0) std::printf(", \"baseline\": %.4g, \"ratio\": %.4g", baseline, ratio);
  std::printf("}\n");
  std::fflush(stdout);
}

std::string blas_in_use() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("blas") != std::string::npos) return line.substr(line.find('/'));
  return "unknown";
}

// DTensor op vs the same op on plain tensors, on a rule-cache hit.
void dtensor_op_overhead(const hp::DeviceMesh& mesh) {
  const std::string name = "dtensor_op_overhead";
  if (!wanted(name)) return;
  auto R = hp::Placements{hp::Replicate()};
  auto S0 = hp::Placements{hp::Shard(0)};
  at::Tensor a = at::randn({8, 16}), b = at::randn({8, 16}), w = at::randn({16, 16}), bias = at::randn({16});
  at::Tensor lw = at::randn({16}), lb = at::randn({16});
  auto da = hp::distribute_tensor(a, mesh, S0), db = hp::distribute_tensor(b, mesh, S0);
  auto dw = hp::distribute_tensor(w, mesh, R), dbias = hp::distribute_tensor(bias, mesh, R);
  auto dlw = hp::distribute_tensor(lw, mesh, R), dlb = hp::distribute_tensor(lb, mesh, R);
  at::NoGradGuard no_grad;
  struct Case {
    const char* op;
    std::function<void()> plain, dist;
  } cases[] = {
      {"add", [&] { at::add(a, b); }, [&] { at::add(da, db); }},
      {"linear", [&] { at::linear(a, w, bias); }, [&] { at::linear(da, dw, dbias); }},
      {"layer_norm", [&] { at::layer_norm(a, {16}, lw, lb); }, [&] { at::layer_norm(da, {16}, dlw, dlb); }},
  };
  for (auto& c : cases) {
    const auto [p, d] = time_pair(c.plain, c.dist, 4000);
    emit(name, std::string("\"op\": \"") + c.op + "\", \"shape\": [8, 16], ", d - p, "us", p, d / p);
  }
}

// One Adam step on a small MLP's DTensor parameters vs the same parameters as plain tensors.
void adam_step(const hp::DeviceMesh& mesh) {
  const std::string name = "adam_step";
  if (!wanted(name)) return;
  const int64_t h = 256;
  std::vector<at::Tensor> plain{at::randn({4 * h, h}), at::randn({4 * h}), at::randn({h, 4 * h}), at::randn({h})};
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
  const auto [p, d] = time_pair([&] { op.step(); }, [&] { od.step(); }, 50);
  emit(name, "\"hidden\": 256, \"params\": 4, ", d, "us", p, d / p);
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

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_filter = argv[1];
  if (!std::getenv("RANK")) {  // a 1-rank job of our own
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29731", 1);
  }
  at::set_num_threads(1);
  hp::init_process_group();
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  if (hp::get_rank() == 0)
    std::printf("{\"name\": \"environment\", \"blas\": \"%s\", \"intra_op_threads\": %d, \"world_size\": %lld}\n",
                blas_in_use().c_str(), at::get_num_threads(), static_cast<long long>(hp::get_world_size()));
  dtensor_op_overhead(mesh);
  adam_step(mesh);
  module_call_overhead();
  hp::destroy_process_group();
  return 0;
}
