#pragma once
// hyper_parallel._C, bound by area (as torch/csrc binds torch._C): module.cpp's module body
// only calls the functions below, one file each.
//
// Naming: everything _C exports starts with an underscore and is the package's own, reached
// through the Python modules (hyper_parallel.*), except the two classes the package hands to
// users as they are: DeviceMesh and Placement (the base of Shard, Replicate, Partial).
#include "guarded.h"

#include <c10/core/ScalarType.h>

#include <hyper_parallel/dtensor/placement.h>

#include <optional>

namespace hyper_parallel {
namespace python {

/// Joining and leaving the job: _init_process_group(_with_store), _is_initialized, _get_rank,
/// _get_world_size, _barrier, _destroy_process_group.
void bind_runtime(py::module_& m);
/// DeviceMesh (equal and hashed by value, `with mesh:`) and _init_device_mesh.
void bind_mesh(py::module_& m);
/// Placement and the classes Shard, Replicate and Partial subclass; the DTensor functions.
void bind_dtensor(py::module_& m);
/// The C++ styles the Python ones build when they are applied.
void bind_styles(py::module_& m);
/// What acts on a torch.nn module: _parallelize_module, _distribute_module, _apply_style (py_module.cpp).
void bind_parallelize(py::module_& m);
/// fully_shard's parameter groups for the Python face's fully_shard (_FullyShardGroup).
void bind_fsdp(py::module_& m);
/// CommDebugMode, ExplicitRedistribution, implicit replication and loss_parallel's guard.
void bind_debug(py::module_& m);

/// A Python Shard, Replicate or Partial for a C++ placement (what C++ functions return).
py::object to_python(const Placement& p);
/// `t` itself as an nn.Parameter (the object optimizers and state dicts see, whose .grad is the
/// C++ tensor's): for a tensor made in C++ whose Python object does not exist yet.
py::object as_parameter(const at::Tensor& t);
/// A torch.dtype or None; c10::TypeError naming `what` otherwise.
std::optional<at::ScalarType> dtype_of(const py::handle& h, const char* what);

}  // namespace python
}  // namespace hyper_parallel
