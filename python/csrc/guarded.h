#pragma once
// The one wrapper every binding of hyper_parallel._C runs its C++ through: C++ errors and
// warnings become Python's, and calls that may communicate release the GIL.
#include <torch/csrc/Exceptions.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <hyper_parallel/runtime/errors.h>

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
/// e.g. `m.def("_barrier", [] { guarded<true>([] { barrier(world_group()); }); });`
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

}  // namespace python
}  // namespace hyper_parallel
