// Uses the installed headers and library the way a user's program does.
// The umbrella header first: it must stand on its own.
#include <hyper_parallel/hyper_parallel.h>

#include <ATen/ATen.h>

#include <iostream>

namespace hp = hyper_parallel;

int main() {
  hp::init_process_group();
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  at::Tensor x = at::ones({2});
  hp::all_reduce_(x, hp::ReduceOp::SUM, mesh.get_group());
  std::cout << "consumer ok: " << mesh.to_string() << " sum " << x[0].item<float>() << "\n";
  const bool ok = x[0].item<float>() == static_cast<float>(hp::get_world_size());
  hp::destroy_process_group();
  return ok ? 0 : 1;
}
