// A train state's save and load against the same bytes written and read by hand, in one run:
//   hprun --nproc-per-node 2 train_state_bench [--gib 3] [--dir /tmp/hp_train_state_bench]
// The model: Linear(4096, 4096) layers, tensor-parallel over the ranks (colwise, rowwise in turn),
// as many as make --gib of parameters and AdamW moments over all ranks. Per rank, in order:
// 1. the floor: this rank's bytes of the state written with write + fsync into one file, then read
//    back with pread into fresh tensors;
// 2. save_train_state (every rank's files, CRCs, the commit), then load_train_state into a second
//    model of the same layout (the reads, CRC checks and copies into its shards);
// 3. async_save_train_state: the time the caller is blocked (the shards copied to host buffers)
//    against a copy of the same tensors alone, and the time until it is committed;
// each twice, alternating, the faster of each. One JSON line per rank: the seconds and ratios
// floor / ours (1.0: as fast as the floor). Its cost to the next step needs free cores to
// measure (a writer thread competes with the training's): on a 2-core machine it is reported only.
#include <ATen/ATen.h>
#include <torch/optim.h>

#include <hyper_parallel/hyper_parallel.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <string>
#include <vector>

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class StackImpl : public hnn::ModuleBase<StackImpl> {
 public:
  StackImpl(int64_t layers, int64_t dim) {
    for (int64_t i = 0; i < layers; ++i) linears.push_back(register_module("l" + std::to_string(i), hnn::Linear(hnn::LinearOptions(dim, dim).bias(false))));
  }
  std::vector<hnn::Linear> linears;
};
HP_MODULE(Stack);

struct Run {
  Run(int64_t layers, int64_t dim, const hp::DeviceMesh& tp) {
    {
      hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
      model = Stack(layers, dim);
    }
    std::vector<hp::PlanEntry> entries;
    for (int64_t i = 0; i < layers; ++i)
      entries.push_back({"l" + std::to_string(i), i % 2 == 0 ? std::shared_ptr<hp::ParallelStyle>(std::make_shared<hp::ColwiseParallel>())
                                                              : std::shared_ptr<hp::ParallelStyle>(std::make_shared<hp::RowwiseParallel>())});
    hp::parallelize_module(*model, tp, hp::ParallelizePlan(entries));
    hp::init_parameters(*model, "cpu");
    opt = std::make_unique<torch::optim::AdamW>(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-3));
    state = {model.get(), opt.get()};
  }
  Stack model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  hp::TrainState state;
};

// This rank's local tensors of the state: parameters and both moments.
std::vector<at::Tensor> local_state(Run& r) {
  std::vector<at::Tensor> out;
  for (const auto& p : r.model->parameters()) {
    out.push_back(hp::local_tensor(p));
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*r.opt->state().at(p.unsafeGetTensorImpl()));
    out.push_back(hp::local_tensor(s.exp_avg()));
    out.push_back(hp::local_tensor(s.exp_avg_sq()));
  }
  return out;
}

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("train_state_bench: ") + what + ": " + std::strerror(errno));
}

// The floor: write + fsync of every tensor's bytes into one file, then pread into fresh tensors.
std::pair<double, double> floor_io(const std::vector<at::Tensor>& tensors, const std::string& path) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd >= 0, "open");
  for (const auto& t : tensors) {
    const char* p = static_cast<const char*>(t.data_ptr());
    size_t left = static_cast<size_t>(t.nbytes());
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      check(n > 0, "write");
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  check(::fsync(fd) == 0 && ::close(fd) == 0, "fsync");
  const double write_s = seconds_since(t0);
  t0 = Clock::now();
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "open");
  off_t off = 0;
  for (const auto& t : tensors) {
    at::Tensor dst = at::empty_like(t);
    char* p = static_cast<char*>(dst.data_ptr());
    size_t left = static_cast<size_t>(dst.nbytes());
    while (left > 0) {
      const ssize_t n = ::pread(fd, p, left, off);
      check(n > 0, "pread");
      p += n;
      off += n;
      left -= static_cast<size_t>(n);
    }
  }
  ::close(fd);
  return {write_s, seconds_since(t0)};
}

int run(int argc, char** argv) {
  double gib = 3.0;
  std::string dir = "/tmp/hp_train_state_bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--gib") gib = std::stod(argv[i + 1]);
    else if (f == "--dir") dir = argv[i + 1];
    else throw std::runtime_error("train_state_bench: unknown flag " + f);
  }
  hp::init_process_group();
  const int64_t world = hp::get_world_size(), rank = hp::get_rank();
  const hp::DeviceMesh tp = hp::init_device_mesh("cpu", {world}, {"tp"});
  const int64_t dim = 4096;
  // Parameters and two moments, float32: 12 bytes per parameter over all ranks.
  const int64_t layers = std::max<int64_t>(1, static_cast<int64_t>(gib * (1 << 30) / (12.0 * dim * dim)));
  hp::manual_seed(1);
  Run source(layers, dim, tp);
  for (const auto& p : source.model->parameters()) p.mutable_grad() = at::ones_like(p);
  source.opt->step();
  Run target(layers, dim, tp);
  const auto tensors = local_state(source);
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.nbytes();
  if (rank == 0) std::filesystem::create_directories(dir);
  hp::barrier(hp::world_group());
  const std::string floor_file = dir + "/floor_rank" + std::to_string(rank);
  double floor_w = 1e30, floor_r = 1e30, save = 1e30, load = 1e30, copy = 1e30, blocking = 1e30, async_total = 1e30;
  for (int rep = 0; rep < 2; ++rep) {
    hp::barrier(hp::world_group());
    const auto [w, r] = floor_io(tensors, floor_file);
    floor_w = std::min(floor_w, w);
    floor_r = std::min(floor_r, r);
    std::filesystem::remove(floor_file);
    hp::barrier(hp::world_group());
    auto t0 = Clock::now();
    hp::save_train_state(dir + "/state", source.state, {/*keep=*/1});
    save = std::min(save, seconds_since(t0));
    hp::barrier(hp::world_group());
    t0 = Clock::now();
    hp::load_train_state(dir + "/state", target.state);
    load = std::min(load, seconds_since(t0));
    // The asynchronous save: what the caller waits for (the copy to host buffers) against a copy
    // of the same tensors alone, and the whole save until committed.
    hp::barrier(hp::world_group());
    t0 = Clock::now();
    {
      std::vector<at::Tensor> copies;
      for (const auto& t : tensors) copies.push_back(t.clone());
      copy = std::min(copy, seconds_since(t0));
    }
    hp::barrier(hp::world_group());
    t0 = Clock::now();
    auto pending = hp::async_save_train_state(dir + "/state", source.state, {/*keep=*/1});
    blocking = std::min(blocking, seconds_since(t0));
    pending->wait();
    async_total = std::min(async_total, seconds_since(t0));
  }
  // The load is exact (its own tests prove it; here a spot check that it loaded).
  const bool same = at::equal(hp::local_tensor(target.model->parameters()[0]), hp::local_tensor(source.model->parameters()[0]));
  std::printf("{\"bench\": \"train_state\", \"rank\": %lld, \"world\": %lld, \"layers\": %lld, \"state_gib_all_ranks\": %.2f, "
              "\"rank_bytes\": %lld, \"floor_write_fsync_s\": %.3f, \"save_s\": %.3f, \"save_vs_floor\": %.2f, \"floor_pread_s\": %.3f, "
              "\"load_s\": %.3f, \"load_vs_floor\": %.2f, \"copy_alone_s\": %.3f, \"async_blocking_s\": %.3f, \"async_blocking_vs_copy\": %.2f, "
              "\"async_until_committed_s\": %.3f, \"loaded_equal\": %s}\n",
              static_cast<long long>(rank), static_cast<long long>(world), static_cast<long long>(layers), bytes * world / double(1 << 30),
              static_cast<long long>(bytes), floor_w, save, floor_w / save, floor_r, load, floor_r / load, copy, blocking, blocking / copy, async_total,
              same ? "true" : "false");
  hp::barrier(hp::world_group());
  if (rank == 0) std::filesystem::remove_all(dir);
  hp::destroy_process_group();
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return hp::run_program([&] { return run(argc, argv); });
}
