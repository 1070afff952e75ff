// Our side of bench/vs_pytorch.py: the workloads that script also runs on PyTorch's own DTensor,
// with the same shapes, placements and timing protocol (alternating repetitions, medians, a
// barrier before each timed repetition of a step, one intra-op thread per rank). Rank 0 prints one
// JSON line per figure; the script pairs them with PyTorch's and prints the ratios.
#include <ATen/ATen.h>
#include <torch/optim.h>

#include <hyper_parallel/hyper_parallel.h>

#include "bench_util.h"
#include "mlp.h"
#include "op_cases.h"
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace qwen3 = hyper_parallel::qwen3;

namespace hp = hyper_parallel;

namespace hp_bench {
namespace {

void print(const std::string& name, double value, const char* unit) {
  if (hp::get_rank() == 0) emit(name, "", value, unit);
}

// add, linear and layer_norm on [8, 16] Shard(0) activations and replicated weights, on a rule-cache
// hit, minus the same op on the plain [8, 16] tensors: what the DTensor adds to one op call.
void op_overhead(const hp::DeviceMesh& mesh) {
  OpCases ops(mesh);
  at::NoGradGuard no_grad;
  for (const auto& c : ops.cases) {
    const auto [p, d] = time_pair(c.plain, c.dist, 2000, 11);
    print("op_overhead_" + c.op, d - p, "us");
  }
}

// Adam over the DTensor parameters of a [256 -> 1024 -> 256] MLP (Colwise, Rowwise), gradients set.
void adam_step(const hp::DeviceMesh& mesh) {
  const int64_t h = 256;
  const std::vector<std::vector<int64_t>> shapes{{4 * h, h}, {4 * h}, {h, 4 * h}, {h}};
  const std::vector<hp::Placements> pl{{hp::Shard(0)}, {hp::Shard(0)}, {hp::Shard(1)}, {hp::Replicate()}};
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < shapes.size(); ++k) {
    auto d = hp::distribute_tensor(at::randn(shapes[k]), mesh, pl[k]);
    d.set_requires_grad(true);
    d.mutable_grad() = hp::distribute_tensor(at::randn(shapes[k]), mesh, pl[k]);
    params.push_back(d);
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
  print("adam_step", time_us([&] { adam.step(); }, 10, 11), "us");
}

void barrier() { hp::barrier(hp::world_group()); }

// One training step of Colwise + Rowwise: x [256, 256] replicated, intermediate 768, gelu; loss
// sum(y * w); backward; SGD step; gradients zeroed.
void mlp_step(const hp::DeviceMesh& mesh) {
  at::manual_seed(0);
  hp_examples::Mlp mlp(256, 768);
  hp::parallelize_module(*mlp, mesh, {{"up", hp::ColwiseParallel()}, {"down", hp::RowwiseParallel()}});
  torch::optim::SGD sgd(mlp->parameters(), torch::optim::SGDOptions(1e-4));
  at::Tensor x = at::randn({256, 256}), w = at::randn({256, 256});
  auto step = [&] {
    (mlp(x) * w).sum().backward();
    sgd.step();
    sgd.zero_grad();
  };
  print("step_mlp", time_us([&] { barrier(), step(); }, 3, 11) / 1000, "ms");
}

// One Qwen3 decoder layer (hidden 256, intermediate 768, 8 heads, 4 kv heads, head_dim 32) on
// [2, 128, 256], TP over the world, forward and backward of sum(y * w), with and without sequence
// parallelism.
void decoder_layer_step(const hp::DeviceMesh& mesh) {
  const qwen3::Config c = decoder_layer_config();
  const int64_t tp = hp::get_world_size(), rank = hp::get_rank();
  at::Tensor x = at::randn({2, 128, c.hidden_size}), w = at::randn({2, 128, c.hidden_size});
  for (bool sp : {false, true}) {
    at::manual_seed(1);
    qwen3::CausalLM model(c);
    qwen3::parallelize_qwen3_tp(*model, mesh, sp);
    auto& layer = *model->layers[0]->as<qwen3::DecoderLayerImpl>();
    at::Tensor xin = sp ? at::Tensor(hp::DTensor::from_local(x.chunk(tp, 1)[rank], mesh, {hp::Shard(1)})) : x;
    at::Tensor wl = sp ? w.chunk(tp, 1)[rank] : w;
    auto step = [&] {
      at::Tensor y = layer.call_tensor(xin);
      (hp::local_tensor(y) * wl).sum().backward();
    };
    print(sp ? "step_decoder_layer_sp" : "step_decoder_layer", time_us([&] { barrier(), step(); }, 2, 11) / 1000, "ms");
  }
}

}  // namespace

void run_vs_pytorch_cases() {
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  op_overhead(mesh);
  adam_step(mesh);
  mlp_step(mesh);
  decoder_layer_step(mesh);
}

}  // namespace hp_bench
