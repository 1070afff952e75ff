#pragma once
// What the context-parallel styles leave on a module they take over (internal to
// context_parallel/): the cp mesh, which context_parallel_mesh() finds again.
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/nn/module.h>

#include <c10/util/Optional.h>

namespace hyper_parallel {

struct ContextParallelRecord {
  c10::optional<DeviceMesh> mesh;
};

inline void record_context_parallel(torch::nn::Module& module, const DeviceMesh& mesh) {
  if (auto* m = dynamic_cast<nn::Module*>(&module)) m->state<ContextParallelRecord>().mesh = mesh;
}

}  // namespace hyper_parallel
