// hyper_parallel._C: the C++ styles the Python ones (hyper_parallel.style) build from their
// attributes each time they are applied.
#include "bindings.h"

#include <torch/csrc/Dtype.h>

#include <hyper_parallel/tensor_parallel/style.h>

#include <memory>

namespace hyper_parallel {
namespace python {

std::optional<at::ScalarType> dtype_of(const py::handle& h, const char* what) {
  if (h.is_none()) return std::nullopt;
  HP_CHECK_T(c10::TypeError, THPDtype_Check(h.ptr()), "hyper_parallel::python::dtype_of: ", what, " must be a torch.dtype or None, got ",
             py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>());
  return reinterpret_cast<THPDtype*>(h.ptr())->scalar_type;
}

void bind_styles(py::module_& m) {
  // src_data_rank is written from the Python style's attribute each time a C++ style is made.
  py::class_<ParallelStyle, std::shared_ptr<ParallelStyle>>(m, "_CppParallelStyle")
      .def("describe", &ParallelStyle::describe)
      .def_property(
          "src_data_rank", [](const ParallelStyle& s) { return s.src_data_rank; },
          [](ParallelStyle& s, std::optional<int64_t> r) { s.src_data_rank = r; });
  py::class_<ColwiseParallel, ParallelStyle, std::shared_ptr<ColwiseParallel>>(m, "_ColwiseParallel")
      .def(py::init<Placement, Placement, bool>());
  py::class_<RowwiseParallel, ParallelStyle, std::shared_ptr<RowwiseParallel>>(m, "_RowwiseParallel")
      .def(py::init([](Placement in, Placement out, bool local, const py::object& dtype) {
        return guarded([&] { return std::make_shared<RowwiseParallel>(in, out, local, dtype_of(dtype, "reduce_dtype")); });
      }));
  py::class_<SequenceParallel, ParallelStyle, std::shared_ptr<SequenceParallel>>(m, "_SequenceParallel")
      .def(py::init<int64_t, bool>());
  py::class_<NoParallel, ParallelStyle, std::shared_ptr<NoParallel>>(m, "_NoParallel")
      .def(py::init<Placement, Placement, Placement, bool>());
  py::class_<PrepareModuleInput, ParallelStyle, std::shared_ptr<PrepareModuleInput>>(m, "_PrepareModuleInput")
      .def(py::init([](std::optional<Layouts> in, std::optional<Layouts> desired, std::optional<KwargLayouts> kin,
                       std::optional<KwargLayouts> kdesired, bool local) {
        return guarded([&] { return std::make_shared<PrepareModuleInput>(in, desired, kin, kdesired, local); });
      }));
  py::class_<PrepareModuleOutput, ParallelStyle, std::shared_ptr<PrepareModuleOutput>>(m, "_PrepareModuleOutput")
      .def(py::init([](Layouts out, Layouts desired, bool local, const py::object& dtype) {
        return guarded([&] { return std::make_shared<PrepareModuleOutput>(out, desired, local, dtype_of(dtype, "reduce_dtype")); });
      }));
  py::class_<PrepareModuleInputOutput, ParallelStyle, std::shared_ptr<PrepareModuleInputOutput>>(m, "_PrepareModuleInputOutput")
      .def(py::init([](std::optional<Layouts> in, std::optional<Layouts> desired, Layouts out, Layouts desired_out,
                       std::optional<KwargLayouts> kin, std::optional<KwargLayouts> kdesired, bool local_in, bool local_out,
                       const py::object& dtype) {
        return guarded([&] {
          return std::make_shared<PrepareModuleInputOutput>(in, desired, out, desired_out, kin, kdesired, local_in, local_out,
                                                            dtype_of(dtype, "reduce_dtype"));
        });
      }));
}

}  // namespace python
}  // namespace hyper_parallel
