// Builds a mesh and runs each collective once, printing what it did on every rank.
// Run: build/tools/hprun/hprun --nproc-per-node 2 build/examples/collectives_demo
#include <ATen/ATen.h>

#include <hyper_parallel/hyper_parallel.h>

#include <iostream>
#include <sstream>

namespace hp = hyper_parallel;

namespace {
std::string show(const at::Tensor& t) {
  std::ostringstream os;
  os << "[";
  auto f = t.to(at::kFloat).flatten();
  for (int64_t i = 0; i < f.numel(); ++i) os << (i ? ", " : "") << f[i].item<float>();
  os << "] shape " << t.sizes();
  return os.str();
}
}  // namespace

int run() {
  hp::init_process_group();
  const int64_t ws = hp::get_world_size();
  auto mesh = hp::init_device_mesh("cpu", {ws}, {"tp"});
  const auto& g = mesh.get_group("tp");
  const int64_t r = g.rank();
  std::cout << "mesh " << mesh.to_string() << ", this is rank " << r << "\n";

  hp::CommDebugMode comm;
  at::Tensor mine = at::full({2}, static_cast<double>(r + 1));
  std::cout << "all_gather(dim 0) of " << show(mine) << " -> " << show(hp::all_gather(mine, 0, g)) << "\n";
  std::cout << "all_reduce(sum) of " << show(mine) << " -> " << show(hp::all_reduce(mine, hp::ReduceOp::SUM, g)) << "\n";
  at::Tensor rows = at::arange(2 * ws, at::kFloat).mul(r + 1);
  std::cout << "reduce_scatter(sum, dim 0) of " << show(rows) << " -> "
            << show(hp::reduce_scatter(rows, hp::ReduceOp::SUM, 0, g)) << "\n";
  at::Tensor block = at::full({1, ws}, static_cast<double>(r));
  std::cout << "all_to_all(split 1, concat 0) of " << show(block) << " -> " << show(hp::all_to_all(block, 1, 0, g)) << "\n";
  at::Tensor b = r == 0 ? at::arange(3, at::kFloat) : at::zeros({3});
  hp::broadcast_(b, 0, g);
  std::cout << "broadcast from rank 0 -> " << show(b) << "\n";
  at::Tensor full = r == 0 ? at::arange(ws * 2, at::kFloat) : at::zeros({ws * 2});
  std::cout << "scatter from rank 0 -> " << show(hp::scatter(full, 0, 0, g)) << "\n";
  std::cout << "collectives issued: " << comm.summary() << "\n";
  hp::destroy_process_group();
  return 0;
}

int main() {
  return hyper_parallel::run_program([&] { return run(); });
}
