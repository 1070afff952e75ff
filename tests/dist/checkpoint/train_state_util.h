#pragma once
// What the train-state tests share: a scratch directory of the job, and a run's state gathered
// whole for bitwise comparisons.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <hyper_parallel/hyper_parallel.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

namespace train_state_test {
namespace hp = hyper_parallel;

/// A directory shared by the ranks of this job (same machine), empty at the start and removed at
/// the end once every rank is done with it.
struct Scratch {
  explicit Scratch(const std::string& name) {
    const char* port = std::getenv("MASTER_PORT");
    path = "/tmp/hp_train_state_" + std::string(port ? port : "0") + "_" + name;
    if (hp::get_rank() == 0) std::filesystem::remove_all(path);
    hp::barrier(hp::world_group());
  }
  ~Scratch() {
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 0) std::filesystem::remove_all(path);
  }
  operator const std::string&() const { return path; }
  std::string path;
};

inline at::Tensor whole_tensor(const at::Tensor& t) { return hp::is_dtensor(t) ? hp::DTensor(t).full_tensor() : t; }

/// Every parameter of `model` and its AdamW state (`<fqn>.exp_avg`, `.exp_avg_sq`, `.step`),
/// gathered whole, by FQN. Collective over the parameters' meshes.
inline std::map<std::string, at::Tensor> gathered_state(torch::nn::Module& model, torch::optim::Optimizer& opt) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) {
    out[p.key()] = whole_tensor(p.value()).clone();
    auto it = opt.state().find(p.value().unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out[p.key() + ".exp_avg"] = whole_tensor(s.exp_avg()).clone();
    out[p.key() + ".exp_avg_sq"] = whole_tensor(s.exp_avg_sq()).clone();
    out[p.key() + ".step"] = at::tensor(s.step());
  }
  return out;
}

/// The same shape, dtype and bytes.
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

}  // namespace train_state_test
