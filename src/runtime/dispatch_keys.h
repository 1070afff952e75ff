#pragma once
// The autograd dispatch keys of the devices the library runs on (internal): where a kernel that
// replaces libtorch's autograd decomposition is registered, so layers above runtime/ name no device.
#include <c10/core/DispatchKey.h>

#include <vector>

namespace hyper_parallel {

inline std::vector<c10::DispatchKey> autograd_dispatch_keys() {
  return {c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutogradCUDA};
}

}  // namespace hyper_parallel
