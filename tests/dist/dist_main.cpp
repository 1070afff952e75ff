// gtest main for the multi-process tests: every rank (started by hprun) joins the job on the test
// device (HP_TEST_DEVICE), runs the same tests, and leaves. A rank whose test fails exits at the end of that test: its peers may be
// waiting in a collective it skipped, and hprun then stops them at once instead of letting them
// wait for the collective timeout.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <hyper_parallel/runtime/process_group.h>

#include "../common/test_device.h"

namespace {
class StopOnFailure : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "rank %lld: %s.%s failed; stopping this rank\n",
                 static_cast<long long>(hyper_parallel::is_initialized() ? hyper_parallel::get_rank() : 0),
                 info.test_suite_name(), info.name());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new StopOnFailure);
  // A CUDA variant on a machine without a GPU: skipped on every rank, saying why (CTest's
  // SKIP_RETURN_CODE), before anything touches a device.
  if (const auto why = hp_test::test_device_unavailable()) {
    std::printf("SKIPPED: %s\n", why->c_str());
    return hp_test::kSkipped;
  }
  // HP_TEST_NO_PROCESS_GROUP=1: tests that make their own world (a fake one) in one process.
  const char* own = std::getenv("HP_TEST_NO_PROCESS_GROUP");
  if (own != nullptr && std::string(own) == "1") return RUN_ALL_TESTS();
  hyper_parallel::InitOptions init;
  init.device_type = hp_test::test_device_type();
  try {
    hyper_parallel::init_process_group(init);
  } catch (const c10::Error& e) {  // e.g. started without hprun: say so, never die uncaught
    std::fprintf(stderr, "hp_dist_tests: %s\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp_dist_tests: %s\n", e.what());
    return 2;
  }
  const int rc = RUN_ALL_TESTS();
  hyper_parallel::destroy_process_group();
  return rc;
}
