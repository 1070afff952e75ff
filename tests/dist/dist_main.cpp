// gtest main for the multi-process tests: every rank (started by hprun) joins the job, runs the
// same tests, and leaves. A rank whose tests fail exits non-zero, so hprun and CTest fail.
#include <gtest/gtest.h>

#include <hyper_parallel/runtime/process_group.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  hyper_parallel::init_process_group();
  const int rc = RUN_ALL_TESTS();
  hyper_parallel::destroy_process_group();
  return rc;
}
