#pragma once
// Helpers for the multi-process tests of every layer. Tensors they make live on the test device
// (test_device.h: HP_TEST_DEVICE, "cpu" unless set), and so do the meshes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/mesh/device_mesh.h>

#include "replicas.h"
#include "test_device.h"

namespace hp_test {
namespace hp = hyper_parallel;

/// The 1-D mesh over every rank.
inline hp::DeviceMesh world_mesh() {
  return hp::init_device_mesh(test_device_type(), {hp::get_world_size()}, {"tp"});
}

/// Deterministic values, identical on every rank (small integers scaled: exact in float).
inline at::Tensor values(at::IntArrayRef shape, int64_t salt = 0) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return at::arange(n, at::kFloat).add(salt).remainder(11).sub(5).div(4).reshape(shape).to(test_device());
}

/// While alive, at::empty fills NaN (integers: their maximum), so an element that initialisation
/// or a load misses shows.
struct FillUninitialised {
  FillUninitialised() {
    at::globalContext().setDeterministicFillUninitializedMemory(true);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  ~FillUninitialised() { at::globalContext().setDeterministicAlgorithms(false, false); }
};

/// Seeds hyper_parallel's generator (the layers draw their initial values from it) and torch's
/// (at::randn and friends without a generator) alike: models built after it are the same.
inline void manual_seed(uint64_t seed) {
  hp::manual_seed(seed);
  at::manual_seed(seed);
}

/// Random values from a fixed seed, identical on every rank.
inline at::Tensor random(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen).to(test_device());
}

/// The float32 tolerance of every comparison with a one-process reference.
inline ::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected,
                                        double rtol = 1.5e-4, double atol = 1e-5) {
  at::Tensor a = (hp::is_dtensor(actual) ? hp::DTensor(actual).full_tensor() : actual).cpu();
  const at::Tensor e = expected.cpu();
  if (a.sizes() != e.sizes())
    return ::testing::AssertionFailure() << "shape " << a.sizes() << " != " << e.sizes();
  if (at::allclose(a.to(at::kFloat), e.to(at::kFloat), rtol, atol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs diff "
                                       << (a.to(at::kFloat) - e.to(at::kFloat)).abs().max().item<float>();
}

/// Partial(sum) pieces of `full`: integer weights summing to one, so the sum is exact.
inline at::Tensor partial_piece(const at::Tensor& full, int64_t rank, int64_t size) {
  if (size == 1) return full.clone();
  const double w = rank == 0 ? 2.0 : (rank == 1 ? -1.0 : (rank % 2 == 0 ? 1.0 : -1.0));
  return full * w;
}
}  // namespace hp_test

namespace hp_test {

/// Runs `f` on plain leaves and on DTensor leaves laid out by `placements` (on the 1-D world
/// mesh), and compares the outputs and, through sum(f(x) * w), every input's gradient.
inline void check_same_as_plain(const std::string& what, const std::vector<at::Tensor>& inputs,
                                const std::vector<hp::Placements>& placements,
                                const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                                bool backward = true, double rtol = 1.5e-4, double atol = 1e-5) {
  auto mesh = world_mesh();
  std::vector<at::Tensor> plain, dist;
  for (size_t k = 0; k < inputs.size(); ++k) {
    plain.push_back(inputs[k].detach().clone().requires_grad_(backward && inputs[k].is_floating_point()));
    at::Tensor d;
    if (placements[k][0].is_partial()) {
      const auto& g = mesh.get_group(0);
      d = hp::DTensor::from_local(partial_piece(inputs[k], g.rank(), g.size()), mesh, placements[k]).detach();
    } else {
      d = hp::distribute_tensor(inputs[k], mesh, placements[k], c10::nullopt);
    }
    if (backward && inputs[k].is_floating_point()) d.set_requires_grad(true);
    dist.push_back(d);
  }
  at::Tensor ref = f(plain);
  at::Tensor out = f(dist);
  ASSERT_TRUE(hp::is_dtensor(out)) << what << ": the result is not a DTensor";
  ASSERT_TRUE(close(out, ref, rtol, atol)) << what << ": forward (placements " << hp::to_string(hp::DTensor(out).placements()) << ")";
  if (!backward) return;
  at::Tensor w = values(ref.sizes(), 3) + 2;
  (ref * w).sum().backward();
  (hp::DTensor(out).full_tensor() * w).sum().backward();
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!plain[k].requires_grad()) continue;
    ASSERT_TRUE(dist[k].grad().defined()) << what << ": no gradient for input " << k;
    ASSERT_TRUE(close(dist[k].grad(), plain[k].grad(), rtol, atol)) << what << ": gradient of input " << k;
  }
}

}  // namespace hp_test
