#pragma once
// The per-op overhead cases (hp_bench's dtensor_op_overhead and --instructions, and our side of
// bench/vs_pytorch.py): add, linear and layer_norm on [8, 16] Shard(0) activations and replicated
// weights, each as a plain call and the same call on DTensors.
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include <hyper_parallel/dtensor/dtensor.h>

namespace hp_bench {

struct OpCases {
  struct Case {
    std::string op;
    std::function<void()> plain, dist;
  };
  explicit OpCases(const hyper_parallel::DeviceMesh& mesh) {
    namespace hp = hyper_parallel;
    const hp::Placements R{hp::Replicate()}, S0{hp::Shard(0)};
    // On the mesh's device, plain and distributed alike (an accelerator's current device).
    const at::Device device(mesh.device_type());
    for (at::Tensor* t : {&a, &b, &w, &bias, &lw, &lb}) *t = t->to(device);
    da = hp::distribute_tensor(a, mesh, S0), db = hp::distribute_tensor(b, mesh, S0);
    dw = hp::distribute_tensor(w, mesh, R), dbias = hp::distribute_tensor(bias, mesh, R);
    dlw = hp::distribute_tensor(lw, mesh, R), dlb = hp::distribute_tensor(lb, mesh, R);
    cases = {
        {"add", [this] { at::add(a, b); }, [this] { at::add(da, db); }},
        {"linear", [this] { at::linear(a, w, bias); }, [this] { at::linear(da, dw, dbias); }},
        {"layer_norm", [this] { at::layer_norm(a, {16}, lw, lb); }, [this] { at::layer_norm(da, {16}, dlw, dlb); }},
    };
  }
  OpCases(const OpCases&) = delete;  // the cases capture this object
  OpCases& operator=(const OpCases&) = delete;

  at::Tensor a = at::randn({8, 16}), b = at::randn({8, 16}), w = at::randn({16, 16}), bias = at::randn({16});
  at::Tensor lw = at::randn({16}), lb = at::randn({16});
  at::Tensor da, db, dw, dbias, dlw, dlb;
  std::vector<Case> cases;
};

}  // namespace hp_bench
