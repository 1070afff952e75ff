// Tensor-parallel benchmarks (tp = world size, one intra-op thread per rank), each against a
// baseline measured in the same run: a hand-written Megatron-style implementation (local shards
// and explicit collectives in two autograd functions), and for the efficiency figure the same
// step in one process with as many threads as ranks (measured by the parent hp_bench).
#include <filesystem>
#include <torch/serialize/output-archive.h>
#include <unistd.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <hyper_parallel/hyper_parallel.h>

#include "mlp.h"

#include <map>
#include <sstream>

#include "bench_util.h"
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace qwen3 = hyper_parallel::qwen3;

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

namespace hp_bench {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Megatron's f: identity forward, all-reduce of the input gradient backward.
struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return x.view_as(x); }
  static variable_list backward(AutogradContext*, variable_list g) {
    at::Tensor r = g[0].contiguous();
    hp::all_reduce_(r, hp::ReduceOp::SUM, hp::world_group());
    return {r};
  }
};
// Megatron's g: all-reduce forward, identity backward.
struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) {
    return hp::all_reduce(x, hp::ReduceOp::SUM, hp::world_group());
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

// Copies this rank's shards of the parallelised module's parameters into the plain module with
// the same parameter names (the manual implementation holds only its shards).
void copy_local_shards(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard g;
  auto src = from.named_parameters();
  for (auto& p : to.named_parameters()) {
    const at::Tensor& s = src[p.key()];
    p.value().copy_(hp::local_tensor(s));
  }
}

bool wanted(const std::string& filter, const std::string& name) {
  return filter.empty() || name.find(filter) != std::string::npos;
}

std::string json_params(const std::map<std::string, int64_t>& m) {
  std::ostringstream os;
  for (const auto& [k, v] : m) os << "\"" << k << "\": " << v << ", ";
  return os.str();
}

using hp_examples::Mlp;

void tp_mlp_vs_manual(const std::string& filter) {
  if (!wanted(filter, "tp_mlp_vs_manual")) return;
  const int64_t tp = hp::get_world_size(), dim = 512, hidden = 2048, tokens = 256;
  auto mesh = hp::init_device_mesh("cpu", {tp}, {"tp"});
  at::manual_seed(0);
  Mlp ours(dim, hidden);
  hp::parallelize_module(*ours, mesh, {{"up", hp::ColwiseParallel()}, {"down", hp::RowwiseParallel()}});
  // Manual: the same shards as plain tensors.
  at::Tensor w1 = hp::DTensor(ours->up->weight()).to_local().detach().clone().requires_grad_(true);
  at::Tensor b1 = hp::DTensor(ours->up->bias()).to_local().detach().clone().requires_grad_(true);
  at::Tensor w2 = hp::DTensor(ours->down->weight()).to_local().detach().clone().requires_grad_(true);
  at::Tensor b2 = hp::DTensor(ours->down->bias()).to_local().detach().clone().requires_grad_(true);
  at::Tensor x = at::randn({tokens, dim}).requires_grad_(true);
  at::Tensor w = at::randn({tokens, dim});
  auto manual = [&] {
    at::Tensor h = at::gelu(at::linear(CopyToTp::apply(x), w1, b1));
    at::Tensor y = ReduceFromTp::apply(at::linear(h, w2)) + b2;
    (y * w).sum().backward();
  };
  auto ours_step = [&] { (ours(x) * w).sum().backward(); };
  auto barrier = [] { hp::barrier(hp::world_group()); };
  const auto [m, o] = time_pair(manual, ours_step, 5, 21, barrier);
  if (hp::get_rank() == 0)
    emit("tp_mlp_vs_manual", json_params({{"tp", tp}, {"dim", dim}, {"hidden", hidden}, {"tokens", tokens}}), o / 1000, "ms",
         m / 1000, o / m);
}

}  // namespace

qwen3::Config decoder_layer_config() {
  qwen3::Config c;
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_layers = 1;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 32;
  return c;
}

namespace {
constexpr int64_t kBatch = 2, kSeq = 128;

// The Megatron-style layer: a plain DecoderLayer holding this rank's heads and MLP columns, with
// f/g around attention and MLP.
at::Tensor manual_layer(qwen3::DecoderLayerImpl& l, const at::Tensor& x) {
  at::Tensor h = x + ReduceFromTp::apply(l.self_attn->forward(CopyToTp::apply(l.input_layernorm->forward(x))));
  return h + ReduceFromTp::apply(l.mlp->forward(CopyToTp::apply(l.post_attention_layernorm->forward(h))));
}

void tp_block(const std::string& filter) {
  const bool want_block = wanted(filter, "tp_block_vs_manual");
  const bool want_eff = wanted(filter, "tp2_vs_single_2threads");
  const bool want_comm = wanted(filter, "collectives_per_layer");
  const bool want_bytes = wanted(filter, "param_bytes_per_rank");
  if (!want_block && !want_eff && !want_comm && !want_bytes) return;
  const int64_t tp = hp::get_world_size();
  auto mesh = hp::init_device_mesh("cpu", {tp}, {"tp"});
  const qwen3::Config c = decoder_layer_config();
  at::Tensor w = at::randn({kBatch, kSeq, c.hidden_size});
  at::Tensor x = at::randn({kBatch, kSeq, c.hidden_size}).requires_grad_(true);

  for (bool sp : {false, true}) {
    at::manual_seed(1);
    qwen3::CausalLM model(c);
    qwen3::parallelize_qwen3_tp(*model, mesh, sp);
    auto& layer = *model->layers[0]->as<qwen3::DecoderLayerImpl>();
    at::Tensor xin = sp ? at::Tensor(hp::DTensor::from_local(x.chunk(tp, 1)[hp::get_rank()].detach().requires_grad_(true), mesh, {hp::Shard(1)}))
                        : x;
    auto ours = [&] {
      at::Tensor y = layer.call_tensor(xin);
      at::Tensor local = hp::local_tensor(y);
      at::Tensor wl = sp ? w.chunk(tp, 1)[hp::get_rank()] : w;
      (local * wl).sum().backward();
    };
    if (want_comm) {
      hp::CommDebugMode fwd;
      at::Tensor y = layer.call_tensor(xin);
      at::Tensor local = hp::local_tensor(y);
      at::Tensor loss = (local * (sp ? w.chunk(tp, 1)[hp::get_rank()] : w)).sum();
      const auto f = fwd.get_comm_counts();
      const int64_t fb = fwd.get_total_bytes();
      hp::CommDebugMode bwd;
      loss.backward();
      const auto b = bwd.get_comm_counts();
      const int64_t bb = bwd.get_total_bytes();
      // Megatron's minimum per layer: 2 all-reduces each way; with sequence parallelism 2
      // all-gathers + 2 reduce-scatters each way. Plus the gradient reductions of the replicated
      // weights whose inputs are split: q_norm and k_norm (heads split) always, the input and
      // post-attention norms (sequence split) with sequence parallelism.
      const int64_t min_fwd = sp ? 4 : 2, min_bwd = sp ? 4 + 4 : 2 + 2;
      auto total = [](const std::map<std::string, int64_t>& m) {
        int64_t n = 0;
        for (const auto& kv : m) n += kv.second;
        return n;
      };
      if (hp::get_rank() == 0) {
        std::ostringstream detail;
        for (const auto& [k, v] : f) detail << "\"fwd_" << k << "\": " << v << ", ";
        for (const auto& [k, v] : b) detail << "\"bwd_" << k << "\": " << v << ", ";
        detail << "\"fwd_bytes\": " << fb << ", \"bwd_bytes\": " << bb << ", ";
        emit("collectives_per_layer", json_params({{"tp", tp}, {"sequence_parallel", sp}}) + detail.str(),
             static_cast<double>(total(f) + total(b)), "collectives", static_cast<double>(min_fwd + min_bwd),
             static_cast<double>(total(f) + total(b)) / static_cast<double>(min_fwd + min_bwd));
      }
    }
    if (want_bytes && !sp) {
      int64_t local_bytes = 0, full_bytes = 0, sharded_local = 0, sharded_full = 0;
      for (const auto& p : layer.named_parameters()) {
        hp::DTensor d(p.value());
        const int64_t lb = d.to_local().numel() * 4, fbytes = d.numel() * 4;
        local_bytes += lb;
        full_bytes += fbytes;
        if (d.placements()[0].is_shard()) { sharded_local += lb; sharded_full += fbytes; }
      }
      if (hp::get_rank() == 0)
        emit("param_bytes_per_rank", json_params({{"tp", tp}, {"single_process_bytes", full_bytes}, {"sharded_bytes_per_rank", sharded_local},
                                                  {"sharded_bytes_single", sharded_full}}),
             static_cast<double>(local_bytes), "bytes", static_cast<double>(full_bytes),
             static_cast<double>(local_bytes) / static_cast<double>(full_bytes));
    }
    if (want_block && !sp) {
      // Manual: a plain layer with this rank's share of heads and MLP columns.
      qwen3::Config local = c;
      local.num_heads /= tp;
      local.num_kv_heads /= tp;
      local.intermediate_size /= tp;
      qwen3::DecoderLayer manual(local);
      copy_local_shards(layer, *manual);
      auto manual_step = [&] {
        (manual_layer(*manual, x) * w).sum().backward();
        // q_norm/k_norm weights are shared by all heads, each rank saw its own: sum their grads.
        for (auto* norm : {&manual->self_attn->q_norm, &manual->self_attn->k_norm}) {
          at::Tensor g = (*norm)->weight().grad();
          hp::all_reduce_(g, hp::ReduceOp::SUM, hp::world_group());
        }
      };
      // Both compute the same function.
      at::Tensor diff = (manual_layer(*manual, x) - layer.call_tensor(x)).abs().max();
      auto barrier = [] { hp::barrier(hp::world_group()); };
      const auto [m, o] = time_pair(manual_step, ours, 3, 21, barrier);
      if (hp::get_rank() == 0)
        emit("tp_block_vs_manual", json_params({{"tp", tp}, {"hidden", c.hidden_size}, {"seq", kSeq}, {"batch", kBatch}}) +
                                       "\"max_abs_diff\": " + c10::str(diff.item<double>()) + ", ",
             o / 1000, "ms", m / 1000, o / m);
    }
    if (want_eff && hp::get_rank() == 0) {
      // The parent compares this with one process using as many threads as there are ranks.
      const double o = time_us(ours, 3, 9);
      std::printf("{\"name\": \"%s\", \"value\": %.6g}\n", sp ? "tp_sp_step_ms" : "tp_step_ms", o / 1000);
      std::fflush(stdout);
    } else if (want_eff) {
      time_us(ours, 3, 9);  // the peers must run the same collectives
    }
  }
}

}  // namespace

// save_sharded of the demo's Qwen3 model at tp=2 (transaction: checked, fsynced writes, CRC-32s,
// two agreement all_reduces, atomic commit) against what the save did before it was a
// transaction: each rank serialising its shards with torch's archive straight into a file.
void save_sharded_cost(const std::string& filter) {
  if (!wanted(filter, "save_sharded")) return;
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  at::manual_seed(3);
  qwen3::CausalLM model(qwen3::Config{});
  qwen3::parallelize_qwen3_tp(*model, mesh, true);
  const std::string dir = "/tmp/hp_bench_ckpt_" + std::to_string(::getppid());
  const std::string plain = dir + "_plain_rank" + std::to_string(hp::get_rank()) + ".pt";
  auto old_way = [&] {
    torch::serialize::OutputArchive archive;
    for (const auto& p : model->named_parameters()) {
      at::Tensor v = hp::local_tensor(p.value());
      archive.write(p.key(), v.detach().contiguous(), true);
    }
    archive.save_to(plain);
    hp::barrier(hp::world_group());
  };
  auto new_way = [&] { hp::save_sharded(*model, dir); };
  const auto [base, ours] = time_pair(old_way, new_way, 1, 9, [] { hp::barrier(hp::world_group()); });
  if (hp::get_rank() == 0) {
    int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    emit("save_sharded", json_params({{"tp", hp::get_world_size()}, {"parameters", params}}), ours / 1000, "ms",
         base / 1000, ours / base);
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove(plain);
}

void run_tp_benchmarks(const std::string& filter) {
  tp_mlp_vs_manual(filter);
  tp_block(filter);
  save_sharded_cost(filter);
}

// The same layer step in this process alone (for tp2_vs_single_2threads).
double single_block_step_ms(int threads) {
  at::set_num_threads(threads);
  const qwen3::Config c = decoder_layer_config();
  at::manual_seed(1);
  qwen3::CausalLM model(c);
  auto& layer = *model->layers[0]->as<qwen3::DecoderLayerImpl>();
  at::Tensor w = at::randn({kBatch, kSeq, c.hidden_size});
  at::Tensor x = at::randn({kBatch, kSeq, c.hidden_size}).requires_grad_(true);
  const double t = time_us([&] { (layer.call_tensor(x) * w).sum().backward(); }, 3, 9);
  at::set_num_threads(1);
  return t / 1000;
}

}  // namespace hp_bench
