#pragma once
// Value checks that must not stall an accelerator: reading a device tensor on the host waits for
// every kernel queued before it.
#include <ATen/core/Tensor.h>

#include <string>

namespace hyper_parallel {

/// Raises c10::IndexError(message) unless `ok` (one boolean element) is true. On the host the
/// check is immediate. On an accelerator it is queued on the device as an asynchronous assertion,
/// as libtorch's own CUDA index checks are (the error surfaces at the next synchronisation and
/// ends the process), unless HP_SYNC_CHECKS=1 asks for the immediate, synchronising check.
/// e.g. `check_index(ids.min().ge(0).logical_and(ids.max().lt(n)), "id out of range");`
void check_index(const at::Tensor& ok, const std::string& message);

}  // namespace hyper_parallel
