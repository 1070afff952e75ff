#include <hyper_parallel/runtime/device_checks.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>

#include "torch_compat.h"

namespace hyper_parallel {

void check_index(const at::Tensor& ok, const std::string& message) {
  static const bool sync = [] {
    const char* v = std::getenv("HP_SYNC_CHECKS");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  if (ok.device().is_cpu() || sync) {
    HP_CHECK_T(c10::IndexError, ok.item<bool>(), message);
    return;
  }
  compat::assert_async(ok, message);
}

}  // namespace hyper_parallel
