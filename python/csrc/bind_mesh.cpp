// hyper_parallel._C: DeviceMesh (PyTorch's torch.distributed.device_mesh.DeviceMesh).
#include "bindings.h"

#include <hyper_parallel/mesh/device_mesh.h>

#include <memory>
#include <vector>

namespace hyper_parallel {
namespace python {
namespace {

// The meshes entered with `with mesh:` on this thread, innermost last. Never destroyed: a scope
// left open at thread exit must not pop the library's own per-thread stack after that is gone.
std::vector<std::unique_ptr<MeshScope>>& mesh_scopes() {
  thread_local auto* scopes = new std::vector<std::unique_ptr<MeshScope>>();
  return *scopes;
}

}  // namespace

void bind_mesh(py::module_& m) {
  py::class_<DeviceMesh>(m, "DeviceMesh")
      // PyTorch's DeviceMesh(device_type, mesh, *, mesh_dim_names=None): `mesh` is a list, nested
      // list or tensor of ranks. Collective over the whole world, as PyTorch's.
      .def(py::init([](const std::string& device_type, const py::object& mesh, const py::object& mesh_dim_names,
                       const py::object& backend_override, bool init_backend) {
             const bool overridden = !backend_override.is_none();
             (void)init_backend;  // groups are made at once; there is no lazy backend to defer
             const py::object torch = py::module_::import("torch");
             const py::object t = torch.attr("as_tensor")(mesh, py::arg("dtype") = torch.attr("int64"));
             const auto shape = py::cast<std::vector<int64_t>>(py::tuple(t.attr("shape")));
             const auto ranks = py::cast<std::vector<int64_t>>(t.attr("flatten")().attr("tolist")());
             std::vector<std::string> names;
             if (!mesh_dim_names.is_none()) names = py::cast<std::vector<std::string>>(mesh_dim_names);
             return guarded<true>([&] {
               HP_CHECK_T(c10::NotImplementedError, !overridden,
                          "hyper_parallel::DeviceMesh: backend_override is not supported (the runtime chooses "
                          "the backend from device_type)");
               return DeviceMesh(device_type, shape, ranks, names);
             });
           }),
           py::arg("device_type"), py::arg("mesh"), py::kw_only(), py::arg("mesh_dim_names") = py::none(),
           py::arg("backend_override") = py::none(), py::arg("_init_backend") = true)
      // The ranks as a tensor of the mesh's shape (PyTorch's DeviceMesh.mesh).
      .def_property_readonly("mesh",
                             [](const DeviceMesh& d) {
                               const py::object torch = py::module_::import("torch");
                               return torch.attr("tensor")(py::cast(d.ranks()), py::arg("dtype") = torch.attr("int64"))
                                   .attr("reshape")(py::tuple(py::cast(d.shape())));
                             })
      .def_property_readonly("device_type", &DeviceMesh::device_type)
      .def_property_readonly("ndim", &DeviceMesh::ndim)
      .def_property_readonly("shape", [](const DeviceMesh& d) { return py::tuple(py::cast(d.shape())); })
      .def_property_readonly("mesh_dim_names",
                             [](const DeviceMesh& d) -> py::object {
                               if (d.mesh_dim_names().empty()) return py::none();
                               return py::tuple(py::cast(d.mesh_dim_names()));
                             })
      .def("size", [](const DeviceMesh& d, std::optional<int64_t> dim) { return guarded([&] { return dim ? d.size(*dim) : d.size(); }); },
           py::arg("mesh_dim") = py::none())
      .def("get_local_rank",
           [](const DeviceMesh& d, const py::object& dim) {
             return guarded([&] {
               if (dim.is_none()) return d.get_local_rank(0);
               if (py::isinstance<py::str>(dim)) return d.get_local_rank(d.dim_index(dim.cast<std::string>()));
               return d.get_local_rank(dim.cast<int64_t>());
             });
           },
           py::arg("mesh_dim") = py::none())
      .def("get_coordinate", [](const DeviceMesh& d) { return d.get_coordinate(); })
      .def("__getitem__",
           [](const DeviceMesh& d, const py::object& key) {
             return guarded([&] {
               if (py::isinstance<py::str>(key)) return d[key.cast<std::string>()];
               return d[key.cast<std::vector<std::string>>()];
             });
           })
      .def("__eq__", [](const DeviceMesh& a, const py::object& b) { return py::isinstance<DeviceMesh>(b) && a == b.cast<const DeviceMesh&>(); })
      // By value, as == compares (equal meshes hash equal; PyTorch's meshes do the same).
      .def("__hash__", [](const DeviceMesh& d) {
        return py::hash(py::make_tuple(d.device_type(), py::tuple(py::cast(d.shape())), py::tuple(py::cast(d.ranks())),
                                       py::tuple(py::cast(d.mesh_dim_names()))));
      })
      // `with mesh:` makes it the mesh parallelize_module uses when given none (a stack per thread).
      .def("__enter__", [](const DeviceMesh& d) {
        mesh_scopes().push_back(std::make_unique<MeshScope>(d));
        return d;
      })
      .def("__exit__", [](const DeviceMesh&, const py::args&) {
        auto& scopes = mesh_scopes();
        if (!scopes.empty()) scopes.pop_back();
        return false;
      })
      .def("__repr__", &DeviceMesh::to_string);
  // The mesh of the innermost `with mesh:` on this thread, or None.
  m.def("_current_mesh", [] { return current_mesh(); });
  m.def("_init_device_mesh", [](const std::string& device_type, const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
    return guarded<true>([&] { return init_device_mesh(device_type, shape, names); });
  });
}

}  // namespace python
}  // namespace hyper_parallel
