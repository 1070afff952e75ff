#pragma once
// Value checks that must not stall an accelerator: reading a device tensor on the host waits for
// every kernel queued before it.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

namespace hyper_parallel {

namespace detail {
/// Whether `ok` is read on the host now (a host tensor, or HP_SYNC_CHECKS=1).
bool check_on_host(const at::Tensor& ok);
/// Raises c10::IndexError(message).
[[noreturn]] void raise_index_error(const std::string& message);
/// Queues a device-side assertion of `ok`.
void assert_on_device(const at::Tensor& ok, const std::string& message);
}  // namespace detail

/// Raises c10::IndexError(message()) unless `ok` (one boolean element) is true. On the host the
/// check is immediate and the message is built only when it fails. On an accelerator it is queued
/// on the device as an asynchronous assertion, as libtorch's own CUDA index checks are (the error
/// surfaces at the next synchronisation and ends the process), unless HP_SYNC_CHECKS=1 asks for
/// the immediate, synchronising check.
/// e.g. `check_index(ids.min().ge(0).logical_and(ids.max().lt(n)), [] { return "id out of range"; });`
template <class Message>
void check_index(const at::Tensor& ok, const Message& message) {
  if (!detail::check_on_host(ok)) return detail::assert_on_device(ok, message());
  if (!ok.item<bool>()) detail::raise_index_error(message());
}

}  // namespace hyper_parallel
