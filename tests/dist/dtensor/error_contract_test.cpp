// One error style: every DTensor error starts with the qualified name of the function that raised
// it and shows specs in the compact form; a user's sharding rule that answers wrongly gets a
// c10::ValueError naming the rule and the op, never an internal assertion; a rule asking for an
// input spec that is missing gets a clear error, never a null dereference.
#include <torch/library.h>

#include <hyper_parallel/dtensor/sharding_rule.h>

#include "../../common/test_util.h"

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_error_contract_test {
namespace {

at::Tensor scale2(const at::Tensor& x) { return x * 2; }
at::Tensor axpy(const at::Tensor& x, const at::Tensor& y) { return x + y; }

TORCH_LIBRARY(hp_contract_test, m) {
  m.def("scale2(Tensor x) -> Tensor");
  m.def("axpy(Tensor x, Tensor y) -> Tensor");
}
TORCH_LIBRARY_IMPL(hp_contract_test, CPU, m) {
  m.impl("scale2", scale2);
  m.impl("axpy", axpy);
}
TORCH_LIBRARY_IMPL(hp_contract_test, Meta, m) {
  m.impl("scale2", scale2);
  m.impl("axpy", axpy);
}

at::Tensor call_scale2(const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("hp_contract_test::scale2", "");
  return op.typed<at::Tensor(const at::Tensor&)>().call(x);
}
at::Tensor call_axpy(const at::Tensor& x, const at::Tensor& y) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("hp_contract_test::axpy", "");
  return op.typed<at::Tensor(const at::Tensor&, const at::Tensor&)>().call(x, y);
}

// Runs `f`, expects an `E` whose message starts with `prefix` and contains `part`.
template <class E = c10::ValueError>
void expect_error(const std::function<void()>& f, const std::string& prefix, const std::string& part = "") {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << prefix;
  } catch (const E& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_EQ(m.rfind(prefix, 0), 0u) << m;
    EXPECT_NE(m.find(part), std::string::npos) << m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not the expected exception type: " << e.what();
  }
}

std::string ws() { return std::to_string(hp::get_world_size()); }

}  // namespace

TEST(ErrorContractDist, AUserRuleThatAnswersWronglyIsAValueErrorNamingIt) {
  auto mesh = world_mesh();
  hp::DTensor x = hp::distribute_tensor(values({4, 6}).cpu(), mesh, {hp::Shard(0)});
  const std::string head = "hyper_parallel::dispatch: hp_contract_test::scale2(x: f32[4,6] S(0)) on mesh(tp=" + ws() + ")";
  const std::string rule = "the sharding rule registered for 'hp_contract_test::scale2'";
  // Placements for a 2-D mesh on a 1-D one.
  hp::register_sharding_rule("hp_contract_test::scale2", [](const hp::OpInfo&) {
    hp::OpSharding s;
    s.output_placements = {{hp::Shard(0), hp::Replicate()}};
    return s;
  });
  expect_error([&] { call_scale2(x); }, head, rule + " gave return 0 the placements");
  // Two input placements for one input.
  hp::register_sharding_rule("hp_contract_test::scale2", [](const hp::OpInfo&) {
    hp::OpSharding s;
    s.input_placements = {{hp::Shard(0)}, {hp::Shard(0)}};
    s.output_placements = {{hp::Shard(0)}};
    return s;
  });
  expect_error([&] { call_scale2(x); }, head, rule + " gave 2 input placements for 1 DTensor inputs");
  // No output placements at all.
  hp::register_sharding_rule("hp_contract_test::scale2", [](const hp::OpInfo&) { return hp::OpSharding{}; });
  expect_error([&] { call_scale2(x); }, head, rule + " gave no output placements for return 0");
  if (hp::get_world_size() > 1) {
    // Output placements that do not describe the local result: Shard(1) of a row piece.
    hp::register_sharding_rule("hp_contract_test::scale2", [](const hp::OpInfo&) {
      hp::OpSharding s;
      s.output_placements = {{hp::Shard(1)}};
      return s;
    });
    expect_error([&] { call_scale2(x); }, head, "(" + rule + " is wrong)");
  }
  // A right rule works.
  hp::register_sharding_rule("hp_contract_test::scale2", [](const hp::OpInfo& info) {
    hp::OpSharding s;
    s.output_placements = {info.input_spec(0).placements};
    return s;
  });
  EXPECT_TRUE(close(call_scale2(x), values({4, 6}).cpu() * 2));
}

TEST(ErrorContractDist, ARuleAskingForAMissingInputSpecGetsAClearError) {
  auto mesh = world_mesh();
  hp::DTensor x = hp::distribute_tensor(values({4, 6}).cpu(), mesh, {hp::Shard(0)});
  hp::register_sharding_rule("hp_contract_test::axpy", [](const hp::OpInfo& info) {
    hp::OpSharding s;
    s.output_placements = {info.input_spec(1).placements};  // y: may be a 0-dim plain tensor
    return s;
  });
  expect_error([&] { call_axpy(x, at::scalar_tensor(2.0)); },
                     "hyper_parallel::dispatch: hp_contract_test::axpy(x: f32[4,6] S(0)) on mesh(tp=" + ws() + ")",
                     "needs argument 'y' to be a DTensor");
}

TEST(ErrorContractDist, DTensorErrorsStartWithTheQualifiedFunctionName) {
  auto mesh = world_mesh();
  hp::DTensor x = hp::distribute_tensor(values({4, 6}).cpu(), mesh, {hp::Shard(0)});
  const auto starts = [](const std::function<void()>& f, const std::string& prefix) { expect_error<c10::Error>(f, prefix); };
  starts([&] { x.redistribute({hp::Partial()}); }, "hyper_parallel::DTensor::redistribute: ");
  starts([&] { x.redistribute({hp::Shard(0), hp::Shard(1)}); }, "hyper_parallel::DTensor::redistribute: ");
  starts([&] { hp::DTensor::from_local(at::ones({2}), mesh, {hp::Shard(0), hp::Shard(0)}); }, "hyper_parallel::DTensor::from_local: ");
  starts([&] { hp::distribute_tensor(at::ones({2}), mesh, {}); }, "hyper_parallel::distribute_tensor: ");
  starts([&] { (void)(x + at::ones({4, 6})); }, "hyper_parallel::dispatch: aten::add.Tensor got a plain tensor");
  starts([&] { at::cholesky_inverse(x); }, "hyper_parallel::dispatch: no sharding rule for aten::cholesky_inverse(self: f32[4,6] S(0))");
  starts([&] { (void)hp::DTensor(at::ones({2})); }, "hyper_parallel::DTensor: ");
}

// The key DTensors use (`Fake`) in a thread's included set that we did not put there (torch 2.15's
// C++ FakeTensor mode does so): making a DTensor is refused naming that mode, not run with every
// op of the thread routed into our fallback. Without it, the same call works.
TEST(ErrorContractDist, AForeignFakeTensorModeOnTheThreadIsRefusedAtDTensorCreation) {
  auto mesh = world_mesh();
  const at::Tensor local = values({2, 3}).cpu();
  {
    c10::impl::IncludeDispatchKeyGuard fake_mode(c10::DispatchKey::Fake);
    expect_error<c10::Error>([&] { hp::DTensor::from_local(local, mesh, {hp::Shard(0)}); }, "hyper_parallel::DTensor: the dispatch key Fake",
                 "C++ FakeTensor mode (FakeTensorModeTLS) is active on this thread");
  }
  EXPECT_EQ(hp::DTensor::from_local(local, mesh, {hp::Shard(0)}).to_local().sizes(), local.sizes());
}

}  // namespace t_dist_dtensor_error_contract_test
