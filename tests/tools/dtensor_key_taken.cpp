// Run with fake_key_first loaded before hyper_parallel: the library still loads, and making a
// DTensor raises the error that names the dispatch key, instead of a crash or a silently wrong
// tensor. Exits 0 when exactly that happens.
#include <cstdio>
#include <string>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/runtime/process_group.h>

namespace hp = hyper_parallel;

int main() {
  hp::init_process_group();
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()});
  try {
    at::Tensor d = hp::distribute_tensor(at::ones({4, 4}), mesh, {hp::Replicate()});
    std::printf("dtensor_key_taken: a DTensor was made although the key was taken\n");
    return 1;
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    const bool named = msg.find("another library") != std::string::npos && msg.find("Fake") != std::string::npos;
    std::printf("dtensor_key_taken: %s: %s\n", named ? "expected error" : "unexpected error", msg.c_str());
    return named ? 0 : 1;
  }
}
