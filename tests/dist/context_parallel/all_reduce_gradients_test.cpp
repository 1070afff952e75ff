// all_reduce_gradients against the mean it promises, computed here in closed form: rank r holds
// g_r = base·(r + 1) + r for each gradient, so the mean over n ranks is base·(n + 1)/2 + (n - 1)/2.
// Also counted: one all-reduce per bucket of same-dtype gradients (DDP's packing, bucket_cap_mb
// bounding a bucket), a parameter registered twice reduced once, a parameter without a gradient
// left without one, and a bucket cap that is not positive refused by name.
#include <gtest/gtest.h>

#include <torch/nn/module.h>

#include <hyper_parallel/hyper_parallel.h>

#include "../../common/test_util.h"

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_context_parallel_all_reduce_gradients_test {
namespace {

// Three float parameters (48, 20 and 8 bytes), one double (32 bytes), a float one without a
// gradient, and the first registered again in a child (as tied weights are).
struct Params : torch::nn::Module {
  at::Tensor a, b, c, d, frozen;
  std::shared_ptr<torch::nn::Module> child;
  Params() {
    a = register_parameter("a", at::zeros({3, 4}));
    b = register_parameter("b", at::zeros({5}));
    frozen = register_parameter("frozen", at::zeros({6}));
    c = register_parameter("c", at::zeros({2}));
    d = register_parameter("d", at::zeros({2, 2}, at::kDouble));
    child = register_module("child", std::make_shared<torch::nn::Module>());
    child->register_parameter("a_again", a);
  }
};

// Sets g_r on this rank and returns the mean the reduction must give, per parameter.
std::vector<std::pair<at::Tensor, at::Tensor>> set_gradients(Params& m) {
  const double r = static_cast<double>(hp::get_rank()), n = static_cast<double>(hp::get_world_size());
  std::vector<std::pair<at::Tensor, at::Tensor>> expected;
  uint64_t seed = 40;
  for (at::Tensor* p : {&m.a, &m.b, &m.c, &m.d}) {
    const at::Tensor base = hp_test::random(p->sizes(), seed++).to(at::kDouble);
    p->mutable_grad() = (base * (r + 1) + r).to(p->scalar_type());
    expected.emplace_back(*p, base * ((n + 1) / 2) + (n - 1) / 2);
  }
  return expected;
}

}  // namespace

TEST(ContextParallelGradientsDist, OneAllReducePerDtypeBucketGivesTheMeanOfEveryGradient) {
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  Params m;
  const auto expected = set_gradients(m);
  hp::CommDebugMode comm;
  hp::all_reduce_gradients(m, cp);
  // One float bucket (a, b, c: the tied a once) and one double bucket.
  EXPECT_EQ(comm.get_comm_count("all_reduce"), 2);
  EXPECT_EQ(comm.get_comm_bytes("all_reduce"), (12 + 5 + 2) * 4 + 4 * 8);
  for (const auto& [p, mean] : expected) EXPECT_TRUE(hp_test::close(p.grad().to(at::kDouble), mean, 1e-6, 1e-6));
  EXPECT_FALSE(m.frozen.grad().defined());
}

TEST(ContextParallelGradientsDist, BucketCapStartsANewBucketAndTheMeanIsUnchanged) {
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  Params m;
  const auto expected = set_gradients(m);
  hp::CommDebugMode comm;
  // 64 bytes: a (48) alone, since a + b is 68; then b and c (28); d in the double bucket.
  hp::all_reduce_gradients(m, cp, 64.0 / (1024 * 1024));
  EXPECT_EQ(comm.get_comm_count("all_reduce"), 3);
  for (const auto& [p, mean] : expected) EXPECT_TRUE(hp_test::close(p.grad().to(at::kDouble), mean, 1e-6, 1e-6));
  // A cap below every gradient's size: each is a bucket of its own.
  const auto again = set_gradients(m);
  hp::CommDebugMode per_parameter;
  hp::all_reduce_gradients(m, cp, 1.0 / (1024 * 1024));
  EXPECT_EQ(per_parameter.get_comm_count("all_reduce"), 4);
  for (const auto& [p, mean] : again) EXPECT_TRUE(hp_test::close(p.grad().to(at::kDouble), mean, 1e-6, 1e-6));
}

TEST(ContextParallelGradientsDist, ABucketCapThatIsNotPositiveIsRefusedBeforeAnyCollective) {
  const hp::DeviceMesh cp = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"cp"});
  Params m;
  set_gradients(m);
  const at::Tensor before = m.a.grad().clone();
  for (double cap : {0.0, -1.0}) {
    hp::CommDebugMode comm;
    try {
      hp::all_reduce_gradients(m, cp, cap);
      ADD_FAILURE() << "bucket_cap_mb " << cap << " was accepted";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("hyper_parallel::all_reduce_gradients: bucket_cap_mb must be positive"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(comm.get_total_counts(), 0);
    EXPECT_TRUE(at::equal(m.a.grad(), before));
  }
}

}  // namespace t_dist_context_parallel_all_reduce_gradients_test
