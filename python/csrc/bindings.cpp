// hyper_parallel._C: the library's objects and functions for Python. Tensors cross as torch's
// own (a DTensor is an at::Tensor, so Python sees a torch.Tensor whose ops dispatch to our
// fallback with no Python in their path); everything that may communicate releases the GIL.
#include "py_module.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/explicit_redistribution.h>
#include <hyper_parallel/dtensor/loss_parallel.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/runtime/c10d_interop.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/process_group.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>
#include <hyper_parallel/tensor_parallel/style.h>

#include <memory>

namespace hyper_parallel {
namespace python {
namespace {

// "sum", "avg", "max" or "min": the names the library gives its reductions.
ReduceOp reduce_op_of(const std::string& s) {
  for (const ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN})
    if (s == reduce_op_name(op)) return op;
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::Partial: reduce_op must be one of 'sum', 'avg', 'max', 'min', got '", s, "'");
  return ReduceOp::SUM;
}

std::optional<at::ScalarType> dtype_of(const py::handle& h) {
  if (h.is_none()) return std::nullopt;
  HP_CHECK_T(c10::TypeError, THPDtype_Check(h.ptr()), "hyper_parallel::python::dtype_of: reduce_dtype must be a torch.dtype or None, got ",
             py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>());
  return reinterpret_cast<THPDtype*>(h.ptr())->scalar_type;
}

const at::Tensor& checked_dtensor(const at::Tensor& t, const char* what) {
  HP_CHECK_T(c10::TypeError, t.defined() && is_dtensor(t), "hyper_parallel::python::checked_dtensor: DTensor.", what,
             "() is defined for hyper_parallel DTensors; this tensor is a plain torch.Tensor");
  return t;
}

// The meshes entered with `with mesh:` on this thread, innermost last.
// Never destroyed: a scope left open at thread exit must not pop the library's own per-thread
// stack after that is gone.
std::vector<std::unique_ptr<MeshScope>>& mesh_scopes() {
  thread_local auto* scopes = new std::vector<std::unique_ptr<MeshScope>>();
  return *scopes;
}

// CommDebugMode as a Python context manager: the counts survive the `with` block.
class PyCommDebugMode {
 public:
  void enter() { mode_ = std::make_unique<CommDebugMode>(); }
  void exit() {
    if (!mode_) return;
    total_ = mode_->get_total_counts();
    counts_ = mode_->get_comm_counts();
    summary_ = mode_->summary();
    mode_.reset();
  }
  int64_t get_total_counts() const { return mode_ ? mode_->get_total_counts() : total_; }
  std::map<std::string, int64_t> get_comm_counts() const { return mode_ ? mode_->get_comm_counts() : counts_; }
  std::string summary() const { return mode_ ? mode_->summary() : summary_; }

 private:
  std::unique_ptr<CommDebugMode> mode_;
  int64_t total_ = 0;
  std::map<std::string, int64_t> counts_;
  std::string summary_;
};

}  // namespace
}  // namespace python
}  // namespace hyper_parallel

PYBIND11_MODULE(_C, m) {
  namespace hp = hyper_parallel;
  using hyper_parallel::python::guarded;
  using hp::DeviceMesh;
  using hp::Placement;
  using hp::Placements;
  m.doc() = "hyper_parallel's C++ library for Python";

  // ---- runtime
  // The collective timeout is HP_TIMEOUT_S's (or 300 s), as in C++.
  m.def("_init_process_group", [](const std::string& device_type) {
    guarded<true>([&] {
      hp::InitOptions o;
      o.device_type = device_type;
      hp::init_process_group(o);
    });
  });
  m.def("_init_process_group_with_store", [](const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
                                             const std::string& device_type) {
    guarded<true>([&] {
      hp::InitOptions o;
      o.device_type = device_type;
      hp::init_process_group_with_store(store, rank, world_size, o);
    });
  });
  m.def("is_initialized", [] { return hp::is_initialized(); });
  m.def("get_rank", [] { return guarded([] { return hp::get_rank(); }); });
  m.def("get_world_size", [] { return guarded([] { return hp::get_world_size(); }); });
  m.def("barrier", [] { guarded<true>([] { hp::barrier(hp::world_group()); }); });
  m.def("destroy_process_group", [] { guarded<true>([] { hp::destroy_process_group(); }); });

  // ---- placements (Shard, Replicate and Partial are Python subclasses of this class)
  py::class_<Placement>(m, "Placement")
      .def(py::init([](const std::string& kind, int64_t dim, const std::string& reduce_op) {
             return guarded([&] {
               if (kind == "shard") return Placement::shard(dim);
               if (kind == "partial") return Placement::partial(hp::python::reduce_op_of(reduce_op));
               HP_CHECK_T(c10::ValueError, kind == "replicate", "hyper_parallel::Placement: kind must be 'shard', 'replicate' or 'partial'");
               return Placement::replicate();
             });
           }),
           py::arg("kind"), py::arg("dim") = 0, py::arg("reduce_op") = "sum")
      .def("is_shard", [](const Placement& p, std::optional<int64_t> dim) { return dim ? p.is_shard(*dim) : p.is_shard(); },
           py::arg("dim") = py::none())
      .def("is_replicate", &Placement::is_replicate)
      .def("is_partial", &Placement::is_partial)
      .def_property_readonly("_kind", [](const Placement& p) {
        return p.is_shard() ? "shard" : p.is_partial() ? "partial" : "replicate";
      })
      .def_property_readonly("_dim", &Placement::dim)
      .def_property_readonly("_reduce_op", [](const Placement& p) { return std::string(hp::reduce_op_name(p.reduce_op())); })
      .def("__eq__", [](const Placement& a, const py::object& b) {
        return py::isinstance<Placement>(b) && a == b.cast<const Placement&>();
      })
      .def("__hash__", [](const Placement& p) { return p.hash(); })
      .def("__repr__", &Placement::to_string);

  // ---- device meshes
  py::class_<DeviceMesh>(m, "DeviceMesh")
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
        hp::python::mesh_scopes().push_back(std::make_unique<hp::MeshScope>(d));
        return d;
      })
      .def("__exit__", [](const DeviceMesh&, const py::args&) {
        auto& scopes = hp::python::mesh_scopes();
        if (!scopes.empty()) scopes.pop_back();
        return false;
      })
      .def("__repr__", &DeviceMesh::to_string);
  m.def("_init_device_mesh", [](const std::string& device_type, const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
    return guarded<true>([&] { return hp::init_device_mesh(device_type, shape, names); });
  });

  // ---- DTensors (plain torch.Tensor objects in Python)
  m.def("is_dtensor", [](const at::Tensor& t) { return t.defined() && hp::is_dtensor(t); });
  m.def("_placements", [](const at::Tensor& t) {
    return guarded([&] { return hp::DTensor(hp::python::checked_dtensor(t, "placements")).placements(); });
  });
  m.def("_device_mesh", [](const at::Tensor& t) {
    return guarded([&] { return hp::DTensor(hp::python::checked_dtensor(t, "device_mesh")).device_mesh(); });
  });
  m.def("_to_local", [](const at::Tensor& t, std::optional<Placements> grad_placements) {
    return guarded([&] { return hp::DTensor(hp::python::checked_dtensor(t, "to_local")).to_local(grad_placements); });
  });
  m.def("_full_tensor", [](const at::Tensor& t) {
    return guarded<true>([&] { return hp::DTensor(hp::python::checked_dtensor(t, "full_tensor")).full_tensor(); });
  });
  m.def("_redistribute", [](const at::Tensor& t, std::optional<DeviceMesh> mesh, const Placements& placements) {
    return guarded<true>([&]() -> at::Tensor {
      const hp::DTensor d(hp::python::checked_dtensor(t, "redistribute"));
      return mesh ? d.redistribute(*mesh, placements) : d.redistribute(placements);
    });
  });
  // What repr shows, read from the spec: never communicates.
  m.def("_describe", [](const at::Tensor& t) {
    return guarded([&] {
      const hp::DTensor d(hp::python::checked_dtensor(t, "__repr__"));
      std::ostringstream s;
      s << "DTensor(" << d.spec().short_string() << ", mesh=" << d.device_mesh().short_string()
        << ", local_shape=" << c10::IntArrayRef(d.spec().local_shape()) << ", requires_grad=" << (t.requires_grad() ? "True" : "False") << ")";
      return s.str();
    });
  });
  m.def("from_local", [](const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements, bool run_check,
                         std::optional<std::vector<int64_t>> shape, std::optional<std::vector<int64_t>> stride) {
    return guarded<true>([&]() -> at::Tensor {
      c10::optional<at::IntArrayRef> sh, st;
      if (shape) sh = at::IntArrayRef(*shape);
      if (stride) st = at::IntArrayRef(*stride);
      return hp::DTensor::from_local(local, mesh, placements, run_check, sh, st);
    });
  }, py::arg("local_tensor"), py::arg("device_mesh"), py::arg("placements"), py::arg("run_check") = false,
        py::arg("shape") = py::none(), py::arg("stride") = py::none());
  m.def("_reduce_gradient_to_placements", [](const at::Tensor& t) { guarded([&] { hp::reduce_gradient_to_placements(t); }); });
  m.def("_distribute_tensor", [](const at::Tensor& t, const DeviceMesh& mesh, const Placements& placements, std::optional<int64_t> src) {
    return guarded<true>([&]() -> at::Tensor { return hp::distribute_tensor(t, mesh, placements, src); });
  });

  // ---- the C++ styles the Python ones hold
  // src_data_rank lives on the C++ style only: the Python style's attribute reads and writes it.
  py::class_<hp::ParallelStyle, std::shared_ptr<hp::ParallelStyle>>(m, "_CppParallelStyle")
      .def("describe", &hp::ParallelStyle::describe)
      .def_property(
          "src_data_rank", [](const hp::ParallelStyle& s) { return s.src_data_rank; },
          [](hp::ParallelStyle& s, std::optional<int64_t> r) { s.src_data_rank = r; });
  py::class_<hp::ColwiseParallel, hp::ParallelStyle, std::shared_ptr<hp::ColwiseParallel>>(m, "_ColwiseParallel")
      .def(py::init<Placement, Placement, bool>());
  py::class_<hp::RowwiseParallel, hp::ParallelStyle, std::shared_ptr<hp::RowwiseParallel>>(m, "_RowwiseParallel")
      .def(py::init([](Placement in, Placement out, bool local, const py::object& dtype) {
        return guarded([&] { return std::make_shared<hp::RowwiseParallel>(in, out, local, hp::python::dtype_of(dtype)); });
      }));
  py::class_<hp::SequenceParallel, hp::ParallelStyle, std::shared_ptr<hp::SequenceParallel>>(m, "_SequenceParallel")
      .def(py::init<int64_t, bool>());
  py::class_<hp::NoParallel, hp::ParallelStyle, std::shared_ptr<hp::NoParallel>>(m, "_NoParallel")
      .def(py::init<Placement, Placement, Placement, bool>());
  py::class_<hp::PrepareModuleInput, hp::ParallelStyle, std::shared_ptr<hp::PrepareModuleInput>>(m, "_PrepareModuleInput")
      .def(py::init([](std::optional<hp::Layouts> in, std::optional<hp::Layouts> desired, std::optional<hp::KwargLayouts> kin,
                       std::optional<hp::KwargLayouts> kdesired, bool local) {
        return guarded([&] { return std::make_shared<hp::PrepareModuleInput>(in, desired, kin, kdesired, local); });
      }));
  py::class_<hp::PrepareModuleOutput, hp::ParallelStyle, std::shared_ptr<hp::PrepareModuleOutput>>(m, "_PrepareModuleOutput")
      .def(py::init([](hp::Layouts out, hp::Layouts desired, bool local, const py::object& dtype) {
        return guarded([&] { return std::make_shared<hp::PrepareModuleOutput>(out, desired, local, hp::python::dtype_of(dtype)); });
      }));
  py::class_<hp::PrepareModuleInputOutput, hp::ParallelStyle, std::shared_ptr<hp::PrepareModuleInputOutput>>(m, "_PrepareModuleInputOutput")
      .def(py::init([](std::optional<hp::Layouts> in, std::optional<hp::Layouts> desired, hp::Layouts out, hp::Layouts desired_out,
                       std::optional<hp::KwargLayouts> kin, std::optional<hp::KwargLayouts> kdesired, bool local_in, bool local_out,
                       const py::object& dtype) {
        return guarded([&] {
          return std::make_shared<hp::PrepareModuleInputOutput>(in, desired, out, desired_out, kin, kdesired, local_in, local_out,
                                                                hp::python::dtype_of(dtype));
        });
      }));
  hyper_parallel::python::bind_modules(m);

  // ---- communication only where asked for by name
  py::class_<hp::ExplicitRedistribution, std::unique_ptr<hp::ExplicitRedistribution>>(m, "_ExplicitRedistribution")
      .def(py::init([](const std::string& mode) {
        return guarded([&] {
          HP_CHECK_T(c10::ValueError, mode == "raise" || mode == "warn",
                     "hyper_parallel::ExplicitRedistribution: mode must be 'raise' or 'warn', got '", mode, "'");
          return std::make_unique<hp::ExplicitRedistribution>(mode == "raise" ? hp::ExplicitRedistribution::Mode::raise
                                                                              : hp::ExplicitRedistribution::Mode::warn);
        });
      }));

  py::class_<hp::ImplicitReplicationGuard, std::unique_ptr<hp::ImplicitReplicationGuard>>(m, "_ImplicitReplication")
      .def(py::init<>());
  py::class_<hp::LossParallelGuard, std::unique_ptr<hp::LossParallelGuard>>(m, "_LossParallel").def(py::init<>());

  // ---- CommDebugMode
  py::class_<hp::python::PyCommDebugMode>(m, "_CommDebugMode")
      .def(py::init<>())
      .def("enter", &hp::python::PyCommDebugMode::enter)
      .def("exit", &hp::python::PyCommDebugMode::exit)
      .def("get_total_counts", &hp::python::PyCommDebugMode::get_total_counts)
      .def("get_comm_counts", &hp::python::PyCommDebugMode::get_comm_counts)
      .def("summary", &hp::python::PyCommDebugMode::summary);
}
