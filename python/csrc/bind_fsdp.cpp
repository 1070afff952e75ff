// hyper_parallel._C: fully_shard's parameter groups (FullyShardGroup) for the Python face, which
// swaps a torch.nn module's parameters in its own hooks (hyper_parallel/fsdp.py).
#include "bindings.h"

#include <hyper_parallel/fsdp/fully_shard.h>

#include <string>
#include <vector>

namespace hyper_parallel {
namespace python {
void bind_fsdp(py::module_& m) {
  py::class_<FullyShardGroup>(m, "_FullyShardGroup")
      .def(py::init([](const std::vector<at::Tensor>& params, const std::vector<std::string>& fqns, const DeviceMesh& mesh,
                       const py::object& param_dtype, const py::object& reduce_dtype,
                       bool reshard_after_forward, std::optional<double> gradient_divide_factor) {
             FullyShardOptions o;
             o.reshard_after_forward = reshard_after_forward;
             o.gradient_divide_factor = gradient_divide_factor;
             // The Python face casts the inputs and outputs itself (torch.nn hooks see any object).
             o.mp_policy.cast_forward_inputs = false;
             o.mp_policy.param_dtype = dtype_of(param_dtype, "MixedPrecisionPolicy.param_dtype");
             o.mp_policy.reduce_dtype = dtype_of(reduce_dtype, "MixedPrecisionPolicy.reduce_dtype");
             return guarded([&] { return FullyShardGroup(params, fqns, mesh, o); });
           }),
           py::arg("params"), py::arg("fqns"), py::arg("mesh"), py::arg("param_dtype"), py::arg("reduce_dtype"),
           py::arg("reshard_after_forward"), py::arg("gradient_divide_factor"))
      .def("sharded_parameters",
           [](const FullyShardGroup& g) {
             py::list out;
             for (const at::Tensor& t : g.sharded_parameters()) out.append(as_parameter(t));
             return out;
           })
      .def("pre_forward", [](FullyShardGroup& g) { return guarded<true>([&] { return g.pre_forward(); }); })
      .def("post_forward",
           [](FullyShardGroup& g, const std::optional<std::vector<at::Tensor>>& outputs) {
             guarded<true>([&] {
               if (!outputs) return g.post_forward(c10::IValue());
               std::vector<c10::IValue> items(outputs->begin(), outputs->end());
               g.post_forward(c10::ivalue::Tuple::create(std::move(items)));
             });
           })
      .def("unshard", [](FullyShardGroup& g, bool async_op) { guarded<true>([&] { g.unshard(async_op); }); }, py::arg("async_op") = false)
      .def("reshard", [](FullyShardGroup& g) { guarded<true>([&] { g.reshard(); }); })
      .def("unsharded_parameters", [](const FullyShardGroup& g) { return guarded<true>([&] { return g.unsharded_parameters(); }); })
      .def("claim_root", &FullyShardGroup::claim_root)
      .def("set_fqn", &FullyShardGroup::set_fqn)
      .def("set_requires_gradient_sync", &FullyShardGroup::set_requires_gradient_sync)
      .def("set_reshard_after_backward", &FullyShardGroup::set_reshard_after_backward)
      .def("set_modules_to_forward_prefetch", &FullyShardGroup::set_modules_to_forward_prefetch);
}

}  // namespace python
}  // namespace hyper_parallel
