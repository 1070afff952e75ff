// A library that takes the dispatch key hyper_parallel's DTensors use, as another library that
// registers its own fallback there would (a C++ FakeTensor, say). Loaded ahead of hyper_parallel by
// the dtensor_key_taken test.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {
void other_fallback(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK(false, "fake_key_first: ", op.operator_name(), " reached the other library's fallback");
}
}  // namespace

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&other_fallback>()); }
