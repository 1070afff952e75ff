#pragma once
// The Python side of the seed's platform seam: a torch.nn.Module seen by the C++ styles as a
// hyper_parallel::nn::Module. The styles' logic stays in C++ (one implementation for both
// frontends); this file only mirrors a Python module's kind, children and parameters for one
// call, writes replaced parameters back as nn.Parameter, and registers the C++ hooks as the
// module's own Python hooks.
#include "bindings.h"

#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/tensor_parallel/style.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hyper_parallel {
namespace python {

/// A torch.nn.Module seen by the C++ styles for one call, through the seed's platform seam:
/// module_kind() from isinstance with torch.nn.Linear / torch.nn.Embedding, one child per named
/// child, the direct parameters and buffers registered as the very same tensors. It lives for
/// one call: nothing is kept between calls, so the next call sees the module as the user left
/// it. Hooks the styles register go straight onto the Python module (in registration order, as
/// PyTorch's styles register theirs); the mirror of a module with hooks stays alive with them,
/// holding nothing but the module's name and a weak reference to it.
class __attribute__((visibility("hidden"))) PyModuleAdapter : public nn::Module {
 public:
  /// Mirrors `module` and its whole subtree (a module reached twice is mirrored once).
  static std::shared_ptr<PyModuleAdapter> mirror(const py::handle& module);
  ~PyModuleAdapter() override;

  nn::ModuleKind module_kind() const override { return kind_; }
  /// The Python module, or None when it is gone.
  py::object py_module() const;
  /// Makes this module's and its subtree's slots exactly the Python modules' again (after Python
  /// code changed them): parameters, buffers, children, requires_grad as Python has them.
  void refresh_from_python();
  /// Writes every parameter and buffer slot a C++ style replaced back to the Python module (the
  /// style's DTensor itself, as an nn.Parameter) and the distributed-once flag
  /// (`_distribute_module_applied`, PyTorch's), for this module and its subtree.
  void write_back_to_python();
  /// Ends the call: drops every slot of this module and its subtree, so that a mirror kept alive
  /// by its hooks holds no tensor and no child.
  void release();

  nn::HookHandle register_forward_pre_hook(nn::ForwardPreHook hook) override;
  nn::HookHandle register_forward_pre_hook_with_kwargs(nn::ForwardPreHookWithKwargs hook) override;
  nn::HookHandle register_forward_hook(nn::ForwardHook hook, bool always_call = false) override;

 protected:
  void remove_hook(uint64_t id) override;

 private:
  struct Call;  // the mirrors of one call, by Python module
  PyModuleAdapter(const py::handle& module, std::string type_name, nn::ModuleKind kind, std::shared_ptr<Call> call);
  static std::shared_ptr<PyModuleAdapter> mirror_in(const py::handle& module, const std::shared_ptr<Call>& call);
  void read_slots(const py::handle& module);
  nn::HookHandle keep_handle(py::object handle);
  std::shared_ptr<PyModuleAdapter> self();
  py::object module_ref_;  // a weakref.ref to the Python module
  nn::ModuleKind kind_;
  std::shared_ptr<Call> call_;
  std::map<uint64_t, py::object> handles_;  // torch's RemovableHandles of the hooks put on the module
};

/// A ParallelStyle written in Python (a subclass of hyper_parallel.ParallelStyle): its apply()
/// is called with the Python module when the C++ engine reaches it.
class __attribute__((visibility("hidden"))) PyParallelStyle : public ParallelStyle {
 public:
  explicit PyParallelStyle(py::object style);
  ~PyParallelStyle() override;
  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  std::string name() const override { return name_; }
  /// What the last apply() returned (seed 3.1: a style may return a wrapping module).
  py::object returned() const { return returned_; }

 private:
  py::object style_;
  std::string name_;
  py::object returned_;
};


}  // namespace python
}  // namespace hyper_parallel
