// hyper_parallel._C: CommDebugMode, communication only where asked for by name, implicit
// replication and loss_parallel's guard.
#include "bindings.h"

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/explicit_redistribution.h>
#include <hyper_parallel/dtensor/loss_parallel.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>

#include <map>
#include <memory>

namespace hyper_parallel {
namespace python {
namespace {

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

void bind_debug(py::module_& m) {
  py::class_<PyCommDebugMode>(m, "_CommDebugMode")
      .def(py::init<>())
      .def("enter", &PyCommDebugMode::enter)
      .def("exit", &PyCommDebugMode::exit)
      .def("get_total_counts", &PyCommDebugMode::get_total_counts)
      .def("get_comm_counts", &PyCommDebugMode::get_comm_counts)
      .def("summary", &PyCommDebugMode::summary);
  py::class_<ExplicitRedistribution, std::unique_ptr<ExplicitRedistribution>>(m, "_ExplicitRedistribution")
      .def(py::init([](const std::string& mode) {
        return guarded([&] {
          HP_CHECK_T(c10::ValueError, mode == "raise" || mode == "warn",
                     "hyper_parallel::ExplicitRedistribution: mode must be 'raise' or 'warn', got '", mode, "'");
          return std::make_unique<ExplicitRedistribution>(mode == "raise" ? ExplicitRedistribution::Mode::raise
                                                                          : ExplicitRedistribution::Mode::warn);
        });
      }));
  py::class_<ImplicitReplicationGuard, std::unique_ptr<ImplicitReplicationGuard>>(m, "_ImplicitReplication").def(py::init<>());
  py::class_<LossParallelGuard, std::unique_ptr<LossParallelGuard>>(m, "_LossParallel").def(py::init<>());
}

}  // namespace python
}  // namespace hyper_parallel
