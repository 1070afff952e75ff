// The rule registry checks every name against the dispatcher: a typo would leave a rule that
// nothing reaches. No process group needed.
#include <gtest/gtest.h>

#include <hyper_parallel/dtensor/sharding_rule.h>
#include <hyper_parallel/runtime/errors.h>

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_dtensor_sharding_registry_test {
namespace {
hp::OpSharding keep(const hp::OpInfo&) { return {}; }
}  // namespace

TEST(ShardingRegistry, UnknownOperatorNamesAreRefused) {
  EXPECT_THROW(hp::register_sharding_rule("aten::rleu", keep), c10::ValueError);
  EXPECT_THROW(hp::register_sharding_rule("aten::add.NoSuchOverload", keep), c10::ValueError);
  EXPECT_THROW(hp::register_sharding_rule("add.Tensor", keep), c10::ValueError);  // no namespace
  try {
    hp::register_sharding_rule("aten::rleu", keep);
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no operator 'aten::rleu'"), std::string::npos) << e.what();
  }
}

TEST(ShardingRegistry, OverloadsAndWholeOperatorsAreAccepted) {
  // Registering replaces the library's rule for the rest of this process: use an op the
  // library has no rule for, so nothing else in this binary changes.
  EXPECT_NO_THROW(hp::register_sharding_rule("aten::_test_warn_in_autograd", keep));
  EXPECT_NO_THROW(hp::register_sharding_rule("aten::_test_serialization_subcmul", keep));
  EXPECT_NO_THROW(hp::register_sharding_rule("aten::_test_optional_intlist", keep));
}

}  // namespace t_unit_dtensor_sharding_registry_test
