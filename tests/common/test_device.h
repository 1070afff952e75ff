#pragma once
// The device the device-agnostic tests run on, chosen in one place: HP_TEST_DEVICE ("cpu" when
// unset). CTest registers the CUDA variants with HP_TEST_DEVICE=cuda; where no GPU is visible they
// are skipped, saying why (dist_main.cpp).
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace hp_test {

/// "cpu" or "cuda": the device type of the tests' process group, meshes and tensors.
inline std::string test_device_type() {
  const char* v = std::getenv("HP_TEST_DEVICE");
  return v == nullptr || *v == '\0' ? "cpu" : v;
}

/// This rank's test device (an accelerator's current device, which init_process_group set).
inline at::Device test_device() { return at::Device(test_device_type()); }

/// Why the test device cannot be used here, or nothing when it can.
inline std::optional<std::string> test_device_unavailable() {
  const std::string type = test_device_type();
  if (type == "cpu") return std::nullopt;
  const c10::DeviceType t = c10::Device(type).type();
  if (!c10::impl::hasDeviceGuardImpl(t)) return "HP_TEST_DEVICE=" + type + ": this libtorch has no " + type + " support";
  if (c10::impl::getDeviceGuardImpl(t)->deviceCount() == 0)
    return "HP_TEST_DEVICE=" + type + ": no " + type + " device is visible on this machine";
  return std::nullopt;
}

/// The exit status of a test program that was skipped (CTest's SKIP_RETURN_CODE).
constexpr int kSkipped = 77;

}  // namespace hp_test
