// hyper_parallel._C: placements (the C++ classes hyper_parallel.Shard, Replicate and Partial
// subclass, PyTorch's pattern) and the DTensor functions (a DTensor is a plain torch.Tensor in
// Python; these are what its methods call).
#include "bindings.h"

#include <torch/csrc/autograd/python_variable.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/reduce_op.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>

#include <sstream>

namespace hyper_parallel {
namespace python {
namespace {

// One class per kind, so that the Python classes subclass real types and no kind names cross.
struct ShardPlacement : Placement {
  explicit ShardPlacement(int64_t dim) : Placement(Placement::shard(dim)) {}
};
struct ReplicatePlacement : Placement {
  ReplicatePlacement() : Placement(Placement::replicate()) {}
};
struct PartialPlacement : Placement {
  explicit PartialPlacement(ReduceOp op) : Placement(Placement::partial(op)) {}
};

// "sum", "avg", "max" or "min" (PyTorch's Partial takes the reduction by name): the library's names.
ReduceOp reduce_op_of(const std::string& s) {
  for (const ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN})
    if (s == reduce_op_name(op)) return op;
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::Partial: reduce_op must be one of 'sum', 'avg', 'max', 'min', got '", s, "'");
  return ReduceOp::SUM;
}

const at::Tensor& checked_dtensor(const at::Tensor& t, const char* what) {
  HP_CHECK_T(c10::TypeError, t.defined() && is_dtensor(t), "hyper_parallel::python::checked_dtensor: DTensor.", what,
             "() is defined for hyper_parallel DTensors; this tensor is a plain torch.Tensor");
  return t;
}

// hyper_parallel.placement_types' classes, looked up once (never released: no GIL at exit).
const py::object& python_class(const char* name) {
  static auto* module = new py::object(py::module_::import("hyper_parallel.placement_types"));
  static auto* shard = new py::object(module->attr("Shard"));
  static auto* replicate = new py::object(module->attr("Replicate"));
  static auto* partial = new py::object(module->attr("Partial"));
  return name[0] == 'S' ? *shard : name[0] == 'R' ? *replicate : *partial;
}

}  // namespace

py::object to_python(const Placement& p) {
  if (p.is_shard()) return python_class("Shard")(p.dim());
  if (p.is_partial()) return python_class("Partial")(reduce_op_name(p.reduce_op()));
  return python_class("Replicate")();
}

void bind_dtensor(py::module_& m) {
  // No constructor: Shard, Replicate and Partial are the placements one makes.
  py::class_<Placement>(m, "Placement")
      .def("is_shard", [](const Placement& p, std::optional<int64_t> dim) { return dim ? p.is_shard(*dim) : p.is_shard(); },
           py::arg("dim") = py::none())
      .def("is_replicate", &Placement::is_replicate)
      .def("is_partial",
           [](const Placement& p, std::optional<std::string> op) {
             return p.is_partial() && (!op || *op == reduce_op_name(p.reduce_op()));
           },
           py::arg("reduce_op") = py::none())
      .def("__eq__", [](const Placement& a, const py::object& b) { return py::isinstance<Placement>(b) && a == b.cast<const Placement&>(); })
      .def("__hash__", [](const Placement& p) { return p.hash(); })
      .def("__repr__", &Placement::to_string);
  py::class_<ShardPlacement, Placement>(m, "_Shard")
      .def(py::init<int64_t>(), py::arg("dim"))
      .def_property_readonly("dim", [](const Placement& p) { return p.dim(); });
  py::class_<ReplicatePlacement, Placement>(m, "_Replicate").def(py::init<>());
  py::class_<PartialPlacement, Placement>(m, "_Partial")
      .def(py::init([](const std::string& op) { return guarded([&] { return PartialPlacement(reduce_op_of(op)); }); }),
           py::arg("reduce_op") = "sum")
      .def_property_readonly("reduce_op", [](const Placement& p) { return std::string(reduce_op_name(p.reduce_op())); });

  m.def("_is_dtensor", [](const at::Tensor& t) { return t.defined() && is_dtensor(t); });
  m.def("_placements", [](const at::Tensor& t) {
    const Placements ps = guarded([&] { return DTensor(checked_dtensor(t, "placements")).placements(); });
    py::tuple out(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) out[i] = to_python(ps[i]);
    return out;
  });
  m.def("_device_mesh", [](const at::Tensor& t) { return guarded([&] { return DTensor(checked_dtensor(t, "device_mesh")).device_mesh(); }); });
  m.def("_to_local", [](const at::Tensor& t, std::optional<Placements> grad_placements) {
    return guarded([&] { return DTensor(checked_dtensor(t, "to_local")).to_local(grad_placements); });
  });
  m.def("_full_tensor", [](const at::Tensor& t) {
    return guarded<true>([&] { return DTensor(checked_dtensor(t, "full_tensor")).full_tensor(); });
  });
  m.def("_redistribute", [](const at::Tensor& t, std::optional<DeviceMesh> mesh, const Placements& placements,
                            const py::object& forward_dtype, const py::object& backward_dtype) {
    const auto fwd = guarded([&] { return dtype_of(forward_dtype, "DTensor.redistribute(forward_dtype=)"); });
    const auto bwd = guarded([&] { return dtype_of(backward_dtype, "DTensor.redistribute(backward_dtype=)"); });
    return guarded<true>([&]() -> at::Tensor {
      const DTensor d(checked_dtensor(t, "redistribute"));
      return d.redistribute(mesh ? *mesh : d.device_mesh(), placements, fwd, bwd);
    });
  }, py::arg("t"), py::arg("mesh"), py::arg("placements"), py::arg("forward_dtype") = py::none(),
     py::arg("backward_dtype") = py::none());
  // What repr shows, read from the spec: never communicates.
  m.def("_describe", [](const at::Tensor& t) {
    return guarded([&] {
      const DTensor d(checked_dtensor(t, "__repr__"));
      std::ostringstream s;
      s << "DTensor(" << d.spec().short_string() << ", mesh=" << d.device_mesh().short_string()
        << ", local_shape=" << c10::IntArrayRef(d.spec().local_shape()) << ", requires_grad=" << (t.requires_grad() ? "True" : "False") << ")";
      return s.str();
    });
  });
  m.def("_from_local", [](const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements, bool run_check,
                          std::optional<std::vector<int64_t>> shape, std::optional<std::vector<int64_t>> stride) {
    return guarded<true>([&]() -> at::Tensor {
      c10::optional<at::IntArrayRef> sh, st;
      if (shape) sh = at::IntArrayRef(*shape);
      if (stride) st = at::IntArrayRef(*stride);
      return DTensor::from_local(local, mesh, placements, run_check, sh, st);
    });
  });
  m.def("_reduce_gradient_to_placements", [](const at::Tensor& t) { guarded([&] { reduce_gradient_to_placements(t); }); });
  m.def("_distribute_tensor", [](const at::Tensor& t, const DeviceMesh& mesh, const Placements& placements, std::optional<int64_t> src) {
    return guarded<true>([&]() -> at::Tensor { return distribute_tensor(t, mesh, placements, src); });
  });
}

}  // namespace python
}  // namespace hyper_parallel
