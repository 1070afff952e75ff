#pragma once
// The differences between the libtorch versions we build against (Debian's 1.13.1 and the 2.11 pip
// wheel) that more than one file meets, kept here so that those files are written once. Each entry
// says how the versions differ. (The c10d backend wrapping is in c10d_backends.cpp and the attention
// kernel's schema in dtensor/ops/attention.cpp: each is met in that one place.)
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/api/include/torch/version.h>

#define HP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace hyper_parallel::compat {

/// A c10::WarningHandler that sees each warning's message. 2.x hands `process` a c10::Warning and
/// moved the guard to c10::WarningUtils; 1.13 hands it (location, message, verbatim).
struct WarningMessageHandler : c10::WarningHandler {
#if HP_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) override { on_warning(warning.msg()); }
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override { on_warning(msg); }
#endif
  virtual void on_warning(const std::string& message) = 0;
};
#if HP_TORCH_AT_LEAST(2, 0)
using WarningHandlerGuard = c10::WarningUtils::WarningHandlerGuard;
#else
using WarningHandlerGuard = c10::Warning::WarningHandlerGuard;
#endif

/// Scaled dot-product attention's output. 2.x: aten::scaled_dot_product_attention; 1.13:
/// aten::_scaled_dot_product_attention, which also returns the attention weights.
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const c10::optional<at::Tensor>& attn_mask, bool is_causal) {
#if HP_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, attn_mask, 0.0, is_causal);
#else
  return std::get<0>(at::_scaled_dot_product_attention(q, k, v, attn_mask, 0.0, false, is_causal));
#endif
}

/// A device-side assertion that `cond` (one element) is true; 2.x carries the message to the
/// device's error, 1.13 only the generic "Expected Tensor with single nonzero value".
inline void assert_async(const at::Tensor& cond, const std::string& message) {
#if HP_TORCH_AT_LEAST(2, 0)
  at::_assert_async(cond, message);
#else
  (void)message;
  at::_assert_async(cond);
#endif
}

}  // namespace hyper_parallel::compat
