// hyper_parallel._C: joining and leaving the job.
#include "bindings.h"

#include <hyper_parallel/runtime/c10d_interop.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {
namespace python {

void bind_runtime(py::module_& m) {
  // The collective timeout is HP_TIMEOUT_S's (or 300 s), as in C++.
  m.def("_init_process_group", [](const std::string& device_type) {
    guarded<true>([&] {
      InitOptions o;
      o.device_type = device_type;
      init_process_group(o);
    });
  });
  m.def("_init_process_group_with_store", [](const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
                                             const std::string& device_type) {
    guarded<true>([&] {
      InitOptions o;
      o.device_type = device_type;
      init_process_group_with_store(store, rank, world_size, o);
    });
  });
  m.def("_is_initialized", [] { return is_initialized(); });
  m.def("_get_rank", [] { return guarded([] { return get_rank(); }); });
  m.def("_get_world_size", [] { return guarded([] { return get_world_size(); }); });
  m.def("_barrier", [] { guarded<true>([] { barrier(world_group()); }); });
  m.def("_destroy_process_group", [] { guarded<true>([] { destroy_process_group(); }); });
}

}  // namespace python
}  // namespace hyper_parallel
