#pragma once
// The check every multi-rank training test makes after an optimizer step: the ranks that hold
// the same elements of a parameter hold the same bits (hyper_parallel::find_replica_mismatches).
#include <gtest/gtest.h>

#include <hyper_parallel/nn/replica_check.h>
#include <hyper_parallel/runtime/process_group.h>

namespace hp_test {

/// Success when every replica of every parameter of `module` agrees bitwise over `group`; else
/// the mismatching parameters and ranks. Collective: every rank of `group` calls it.
inline ::testing::AssertionResult replicas_bitwise_equal(const torch::nn::Module& module,
                                                         const hyper_parallel::Group& group = hyper_parallel::world_group()) {
  const auto mismatches = hyper_parallel::find_replica_mismatches(module, group);
  if (mismatches.empty()) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << mismatches.size() << " replica(s) differ:";
  for (const auto& m : mismatches) failure << " '" << m.name << "' (ranks " << m.rank << " and " << m.other_rank << ")";
  return failure;
}

}  // namespace hp_test
