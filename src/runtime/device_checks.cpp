#include <hyper_parallel/runtime/device_checks.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>


namespace hyper_parallel {
namespace detail {

bool check_on_host(const at::Tensor& ok) {
  static const bool sync = [] {
    const char* v = std::getenv("HP_SYNC_CHECKS");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return ok.device().is_cpu() || sync;
}

void raise_index_error(const std::string& message) {
  throw c10::IndexError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
}

void assert_on_device(const at::Tensor& ok, const std::string& message) { at::_assert_async(ok, message); }

}  // namespace detail
}  // namespace hyper_parallel
