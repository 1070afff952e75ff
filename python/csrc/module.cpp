// hyper_parallel._C: the library's objects and functions for Python. Tensors cross as torch's
// own (a DTensor is an at::Tensor, so Python sees a torch.Tensor whose ops dispatch to our
// fallback with no Python in their path); everything that may communicate releases the GIL.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  namespace hpy = hyper_parallel::python;
  m.doc() = "hyper_parallel's C++ library for Python";
  hpy::bind_runtime(m);
  hpy::bind_mesh(m);
  hpy::bind_dtensor(m);
  hpy::bind_styles(m);
  hpy::bind_parallelize(m);
  hpy::bind_fsdp(m);
  hpy::bind_debug(m);
}
