// A two-layer MLP parallelised by a plan (Colwise + Rowwise), trained for a few steps; prints
// each parameter's placements and local shape, the collectives per step, and the largest
// difference from the same MLP trained in this process alone.
// Run: build/tools/hprun/hprun --nproc-per-node 2 build/examples/tp_mlp
#include <ATen/ATen.h>
#include <torch/optim.h>

#include <hyper_parallel/hyper_parallel.h>

#include "mlp.h"

#include <iostream>

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

using hp_examples::Mlp;

int run() {
  hp::init_process_group();
  const bool chief = hp::get_rank() == 0;
  auto tp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  hp::manual_seed(0);  // the layers draw their weights from hyper_parallel's generator
  Mlp model(64, 256);
  hp::manual_seed(0);
  Mlp single(64, 256);  // the single-device reference, same weights

  hp::parallelize_module(*model, tp, {{"up", hp::ColwiseParallel()}, {"down", hp::RowwiseParallel()}});
  if (chief)
    for (const auto& p : model->named_parameters()) {
      hp::DTensor d(p.value());
      std::cout << p.key() << ": placements " << hp::to_string(d.placements()) << ", global " << d.sizes()
                << ", local " << d.to_local().sizes() << "\n";
    }

  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD opt_single(single->parameters(), torch::optim::SGDOptions(0.05));
  double max_err = 0;
  at::manual_seed(0);  // the same inputs on every rank
  for (int step = 0; step < 5; ++step) {
    at::Tensor x = at::randn({8, 64}), target = at::randn({8, 64});
    hp::CommDebugMode comm;
    at::Tensor loss = (model(x) - target).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    at::Tensor ref = (single(x) - target).pow(2).mean();
    opt_single.zero_grad();
    ref.backward();
    opt_single.step();
    const double err = std::abs(loss.item<double>() - ref.item<double>());
    max_err = std::max(max_err, err);
    if (chief)
      std::cout << "step " << step << " loss " << loss.item<double>() << " (single " << ref.item<double>()
                << "), collectives: " << comm.summary() << "\n";
  }
  for (const auto& p : single->named_parameters())
    max_err = std::max(max_err, (hp::DTensor(model->named_parameters()[p.key()]).full_tensor() - p.value()).abs().max().item<double>());
  if (chief) std::cout << "max |tp - single| over losses and final parameters = " << max_err << "\n";
  hp::destroy_process_group();
  return max_err < 1e-4 ? 0 : 1;
}

int main() {
  return hyper_parallel::run_program([&] { return run(); });
}
