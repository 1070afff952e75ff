#pragma once
// The Python side of the seed's platform seam: a torch.nn.Module seen by the C++ styles as a
// hyper_parallel::nn::Module. The styles' logic stays in C++ (one implementation for both
// frontends); this file only mirrors a Python module's kind, children and parameters, writes
// replaced parameters back as nn.Parameter, and runs the C++ hooks from Python's hooks.
#include <torch/csrc/Exceptions.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <hyper_parallel/runtime/errors.h>

#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/tensor_parallel/style.h>

#include <memory>
#include <string>
#include <vector>

namespace hyper_parallel {
namespace python {

namespace py = pybind11;

/// hyper_parallel::AssertionError raised in Python as AssertionError (torch maps the other
/// c10 error types itself).
struct PyAssertionError : torch::PyTorchError {
  using torch::PyTorchError::PyTorchError;
  PyObject* python_type() override { return PyExc_AssertionError; }
};

/// Runs `f` with torch's translation of C++ errors and warnings into Python's (ValueError,
/// TypeError, NotImplementedError, IndexError, RuntimeError, UserWarning), plus AssertionError
/// for ours. With `release_gil` the GIL is released while `f` runs (it may communicate).
template <bool release_gil = false, class F>
auto guarded(F&& f) -> decltype(f()) {
  HANDLE_TH_ERRORS
  try {
    torch::detail::conditional_gil_scoped_release<release_gil> no_gil;
    return f();
  } catch (const AssertionError& e) {
    throw PyAssertionError(e.what_without_backtrace());
  }
  END_HANDLE_TH_ERRORS_PYBIND
}

/// A torch.nn.Module mirrored for the C++ styles: module_kind() from isinstance with
/// torch.nn.Linear / torch.nn.Embedding, one child per named child, the direct parameters and
/// buffers registered as the same tensors. Holds the Python module weakly.
class PyModuleAdapter : public nn::Module {
 public:
  /// Mirrors `module` and its whole subtree.
  static std::shared_ptr<PyModuleAdapter> mirror(const py::handle& module);

  nn::ModuleKind module_kind() const override { return kind_; }
  /// The Python module, or None when it is gone.
  py::object py_module() const;
  /// Reads the Python module's direct parameters and buffers into the registry again (after
  /// Python code replaced them).
  void refresh_from_python();
  /// Writes every registry slot that a C++ style replaced back to the Python module (as an
  /// nn.Parameter keeping requires_grad), for this module and its subtree.
  void write_back_to_python();
  /// Registers Python forward hooks that run this module's C++ hooks, for this module and its
  /// subtree, once per module that has C++ hooks.
  void bridge_hooks(const std::shared_ptr<PyModuleAdapter>& self);

 private:
  PyModuleAdapter(const py::handle& module, std::string type_name, nn::ModuleKind kind);
  py::object module_ref_;  // a weakref.ref to the Python module
  nn::ModuleKind kind_;
  bool bridged_ = false;
};

/// A ParallelStyle written in Python (a subclass of hyper_parallel.ParallelStyle): its apply()
/// is called with the Python module when the C++ engine reaches it.
class PyParallelStyle : public ParallelStyle {
 public:
  explicit PyParallelStyle(py::object style);
  ~PyParallelStyle() override;
  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  std::string name() const override { return name_; }

 private:
  py::object style_;
  std::string name_;
};

/// The Python binding of everything in this file (called from the module definition).
void bind_modules(py::module_& m);

}  // namespace python
}  // namespace hyper_parallel
